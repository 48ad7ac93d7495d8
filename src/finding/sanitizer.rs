//! Crash localisation on NVIDIA (DESIGN §7): a shrunk `crash` finding is re-run once
//! under `compute-sanitizer --tool memcheck` (and, with `--sanitize initcheck`, an
//! `unwritten` one under initcheck), and the first error record is attached to the
//! finding: kernel, access kind and size, address, thread and block, how far the
//! address lies from the nearest allocation, and the source line where the tool gives
//! one — what a library's own message ("unspecified launch failure") does not say.
//!
//! The re-run is this binary's `replay` of the saved case (`cuda:K` as `cuda-direct:K`
//! in the sanitized process; `exec:` adapters as they are, the sanitizer following
//! their worker processes), with a timeout. Where the tool is missing, the kernel runs
//! on the CPU, the tool refuses the device or reports nothing, the finding says why in
//! one line (`localisation_skipped`) instead.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A compute-sanitizer tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// Out-of-bounds and misaligned accesses (for `crash` findings).
    Memcheck,
    /// Reads of uninitialised device memory (for `unwritten` findings, opt-in).
    Initcheck,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Initcheck => "initcheck",
        }
    }
}

/// `--sanitize`: which tools run on which findings.
#[derive(Clone, Debug, PartialEq)]
pub struct SanitizeConfig {
    /// memcheck on shrunk crashes (default on; `--sanitize off` turns it off).
    pub memcheck: bool,
    /// initcheck on shrunk `unwritten` findings (`--sanitize memcheck,initcheck`).
    pub initcheck: bool,
    /// Longest sanitized re-run (the tool slows a kernel down 10-100x).
    pub timeout: Duration,
}

impl Default for SanitizeConfig {
    fn default() -> Self {
        SanitizeConfig {
            memcheck: true,
            initcheck: false,
            timeout: Duration::from_secs(300),
        }
    }
}

impl SanitizeConfig {
    /// Parses `memcheck`, `initcheck`, `memcheck,initcheck` or `off`.
    pub fn parse(s: &str) -> Result<SanitizeConfig, String> {
        let mut c = SanitizeConfig {
            memcheck: false,
            initcheck: false,
            ..Default::default()
        };
        for part in s.split(',').map(str::trim) {
            match part {
                "memcheck" => c.memcheck = true,
                "initcheck" => c.initcheck = true,
                "off" | "none" => {}
                other => {
                    return Err(format!(
                        "unknown sanitizer tool {other:?} (memcheck, initcheck, or off)"
                    ))
                }
            }
        }
        Ok(c)
    }

    /// The tool for a finding of `class`, if any is asked for.
    pub fn tool_for(&self, class: crate::oracle::Class) -> Option<Tool> {
        use crate::oracle::Class;
        match class {
            Class::Crash if self.memcheck => Some(Tool::Memcheck),
            Class::Unwritten if self.initcheck => Some(Tool::Initcheck),
            _ => None,
        }
    }
}

/// How far an address lies from the nearest allocation (memcheck's "and is N bytes
/// before the nearest allocation at A of size S bytes").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct NearestAllocation {
    pub distance_bytes: u64,
    /// `before` or `after`.
    pub relation: String,
    pub address: String,
    pub size_bytes: u64,
}

/// The first error record of a sanitizer run (report.json `localisation`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Localisation {
    /// `memcheck` or `initcheck`.
    pub tool: String,
    /// The record's first line: `Invalid __global__ read of size 16 bytes`.
    pub error: String,
    /// `read`, `write` or `atomic`.
    pub access: Option<String>,
    /// `global`, `shared` or `local`.
    pub memory: Option<String>,
    /// Bytes of the access.
    pub size: Option<u64>,
    /// The faulting kernel as the tool names it.
    pub kernel: Option<String>,
    /// The instruction's offset in the kernel (`0x1a10`).
    pub pc_offset: Option<String>,
    /// `file:line`, when the code carries line information.
    pub source: Option<String>,
    pub thread: Option<[u32; 3]>,
    pub block: Option<[u32; 3]>,
    pub address: Option<String>,
    /// What the tool says of the address: `is out of bounds`, `is misaligned`.
    pub address_note: Option<String>,
    pub nearest_allocation: Option<NearestAllocation>,
    /// Device frames of the record (inlined callers), innermost first.
    pub device_frames: Vec<String>,
    /// The record's lines as printed, prefixes stripped.
    pub record: Vec<String>,
    /// How many error records the run printed (`ERROR SUMMARY: N errors`).
    pub errors: Option<u64>,
    /// The command that was run.
    pub command: String,
}

impl Localisation {
    /// One sentence: `memcheck: Invalid __global__ read of size 16 bytes in
    /// _deepgemm_fp8_paged_mqa_logits+0x1a10 (pa_mqa_logits.py:434) by thread (0,0,0)
    /// in block (12,0,0): address 0x7f1c... is out of bounds, 1,760,633,344 bytes before
    /// the nearest allocation (0x7f1d... of 2,147,483,648 bytes)`.
    pub fn sentence(&self) -> String {
        let mut s = format!("{}: {}", self.tool, self.error);
        if let Some(k) = &self.kernel {
            s.push_str(&format!(" in {k}"));
            if let Some(pc) = &self.pc_offset {
                s.push_str(&format!("+{pc}"));
            }
        }
        if let Some(src) = &self.source {
            s.push_str(&format!(" ({src})"));
        }
        if let (Some(t), Some(b)) = (self.thread, self.block) {
            s.push_str(&format!(
                " by thread ({},{},{}) in block ({},{},{})",
                t[0], t[1], t[2], b[0], b[1], b[2]
            ));
        }
        if let Some(a) = &self.address {
            s.push_str(&format!(": address {a}"));
            if let Some(n) = &self.address_note {
                s.push_str(&format!(" {n}"));
            }
        }
        if let Some(n) = &self.nearest_allocation {
            s.push_str(&format!(
                ", {} bytes {} the nearest allocation ({} of {} bytes)",
                crate::util::group(n.distance_bytes),
                n.relation,
                n.address,
                crate::util::group(n.size_bytes)
            ));
        }
        s
    }
}

/// Strips the tool's `=========` prefix; `None` for lines that are not the tool's.
fn tool_line(line: &str) -> Option<&str> {
    let l = line.trim_start();
    let rest = l.strip_prefix("=========")?;
    Some(rest.trim())
}

fn is_record_start(l: &str) -> bool {
    [
        "Invalid ",
        "Uninitialized ",
        "Misaligned ",
        "Out-of-range ",
        "Malloc/Free",
        "Barrier error",
        "Illegal ",
    ]
    .iter()
    .any(|p| l.starts_with(p))
}

/// `1,760,633,344` → 1760633344.
fn number(s: &str) -> Option<u64> {
    let digits: String = s.chars().filter(|c| *c != ',').collect();
    digits.parse().ok()
}

/// `(12,0,0)` → [12, 0, 0].
fn triple(s: &str) -> Option<[u32; 3]> {
    let inner = s.trim().strip_prefix('(')?.split(')').next()?;
    let v: Vec<u32> = inner
        .split(',')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

/// `file.cu:434` (a path, a colon, digits) at the end of `s`.
fn looks_like_source(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(f, l)| {
        !f.is_empty() && !l.is_empty() && l.chars().all(|c| c.is_ascii_digit())
    })
}

/// Fills kernel, offset and source from an `at ...` line, in the forms the tool has
/// printed: `at kernel+0x1a10 in file.py:434` (CUDA 12/13 with line info), `at
/// kernel+0x1a10` (without), `at 0x3b0 in void kernel(args)` (older), `at 0x000002e8 in
/// /path/file.cu:434:kernel(args)` (cuda-memcheck).
fn parse_at(loc: &mut Localisation, at: &str) {
    let (left, right) = match at.rsplit_once(" in ") {
        Some((l, r)) => (l.trim(), Some(r.trim())),
        None => (at.trim(), None),
    };
    if left.starts_with("0x") && !left.contains('+') {
        loc.pc_offset = Some(left.to_string());
        if let Some(r) = right {
            // `/path/file.cu:434:kernel(args)` or `void kernel(args)`.
            let mut parts = r.splitn(3, ':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(f), Some(l), Some(k))
                    if l.chars().all(|c| c.is_ascii_digit()) && !l.is_empty() =>
                {
                    loc.source = Some(format!("{f}:{l}"));
                    loc.kernel = Some(k.to_string());
                }
                _ => loc.kernel = Some(r.to_string()),
            }
        }
        return;
    }
    match left.rsplit_once('+') {
        Some((k, pc)) if pc.starts_with("0x") => {
            loc.kernel = Some(k.trim().to_string());
            loc.pc_offset = Some(pc.to_string());
        }
        _ => loc.kernel = Some(left.to_string()),
    }
    if let Some(r) = right.filter(|r| looks_like_source(r)) {
        loc.source = Some(r.to_string());
    }
}

/// The first error record of a compute-sanitizer (or cuda-memcheck) run, or `None`
/// when the text holds none.
pub fn parse_record(tool: Tool, text: &str) -> Option<Localisation> {
    let lines: Vec<&str> = text.lines().filter_map(tool_line).collect();
    let start = lines.iter().position(|l| is_record_start(l))?;
    let header = lines[start];
    let mut loc = Localisation {
        tool: tool.name().to_string(),
        error: header.to_string(),
        ..Default::default()
    };
    let words: Vec<&str> = header.split_whitespace().collect();
    loc.access = words
        .iter()
        .map(|w| w.to_ascii_lowercase())
        .find(|w| ["read", "write", "atomic"].contains(&w.as_str()));
    loc.memory = words
        .iter()
        .find(|w| w.starts_with("__") && w.ends_with("__") && w.len() > 4)
        .map(|w| w.trim_matches('_').to_string());
    loc.size = header
        .split_once("of size ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(number);
    loc.record.push(header.to_string());
    for l in &lines[start + 1..] {
        if l.is_empty()
            || is_record_start(l)
            || l.starts_with("Saved host backtrace")
            || l.starts_with("Program hit")
            || l.starts_with("ERROR SUMMARY")
        {
            break;
        }
        loc.record.push(l.to_string());
        if let Some(at) = l.strip_prefix("at ") {
            if loc.kernel.is_none() {
                parse_at(&mut loc, at);
            }
        } else if let Some(rest) = l.strip_prefix("by thread ") {
            if let Some((t, b)) = rest.split_once(" in block ") {
                loc.thread = triple(t);
                loc.block = triple(b);
            }
        } else if l.starts_with("Address ") || l.starts_with("Access at ") {
            let rest = l
                .trim_start_matches("Address ")
                .trim_start_matches("Access at ");
            let (addr, note) = rest.split_once(' ').unwrap_or((rest, ""));
            loc.address = Some(addr.to_string());
            loc.address_note = (!note.is_empty()).then(|| note.trim().to_string());
        } else if let Some(rest) = l.strip_prefix("and is ") {
            // `N bytes before|after the nearest allocation at A of size S bytes`
            let mut w = rest.split_whitespace();
            let distance = w.next().and_then(number);
            let _bytes = w.next();
            let relation = w.next().map(str::to_string);
            let address = rest
                .split_once(" allocation at ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .map(str::to_string);
            let size = rest
                .split_once(" of size ")
                .and_then(|(_, r)| r.split_whitespace().next())
                .and_then(number);
            if let (Some(d), Some(rel)) = (distance, relation) {
                loc.nearest_allocation = Some(NearestAllocation {
                    distance_bytes: d,
                    relation: rel,
                    address: address.unwrap_or_default(),
                    size_bytes: size.unwrap_or(0),
                });
            }
        } else if let Some(f) = l.strip_prefix("Device Frame:") {
            loc.device_frames.push(f.trim().to_string());
        }
    }
    loc.errors = lines
        .iter()
        .find_map(|l| l.strip_prefix("ERROR SUMMARY:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(number);
    Some(loc)
}

/// A line of the tool's output that says it cannot work here (no supported device, an
/// unsupported driver), if there is one.
pub fn refusal(text: &str) -> Option<String> {
    text.lines().filter_map(tool_line).find_map(|l| {
        let low = l.to_ascii_lowercase();
        (low.starts_with("error:")
            || low.contains("not supported")
            || low.contains("unable to")
            || low.contains("failed to"))
        .then(|| l.to_string())
    })
}

/// `compute-sanitizer` on PATH (`MQA_FUZZ_COMPUTE_SANITIZER` names another binary).
pub fn find_tool() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MQA_FUZZ_COMPUTE_SANITIZER") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("compute-sanitizer"))
        .find(|p| p.is_file())
}

/// The kernel name the sanitized replay runs: `cuda:K` in this process
/// (`cuda-direct:K`, so the tool sees the launch itself), anything else as it is.
pub fn replay_kernel(name: &str) -> String {
    match name.strip_prefix("cuda:") {
        Some(rest) => format!("cuda-direct:{rest}"),
        None => name.to_string(),
    }
}

/// Runs `sanitizer --tool T [--target-processes all] exe replay CASE --kernel K` with a
/// timeout and returns its first error record.
pub fn run_tool(
    sanitizer: &Path,
    tool: Tool,
    exe: &Path,
    case_file: &Path,
    kernel: &str,
    timeout: Duration,
) -> Result<Localisation, String> {
    let args: Vec<String> = vec![
        "--tool".into(),
        tool.name().into(),
        "--target-processes".into(),
        "all".into(),
        "--print-limit".into(),
        "10".into(),
        exe.display().to_string(),
        "replay".into(),
        case_file.display().to_string(),
        "--kernel".into(),
        replay_kernel(kernel),
    ];
    let command = std::iter::once(sanitizer.display().to_string())
        .chain(args.iter().cloned())
        .map(|a| shell_word(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let text = run_with_timeout(sanitizer, &args, timeout)
        .map_err(|e| format!("{e} (command: {command})"))?;
    match parse_record(tool, &text) {
        Some(mut loc) => {
            loc.command = command;
            Ok(loc)
        }
        None => Err(match refusal(&text) {
            Some(why) => format!("compute-sanitizer refused: {why}"),
            None => {
                let summary = text
                    .lines()
                    .filter_map(tool_line)
                    .find(|l| l.starts_with("ERROR SUMMARY"))
                    .unwrap_or("no error record in its output");
                format!(
                    "{} reported no error record on the shrunk case ({summary})",
                    tool.name()
                )
            }
        }),
    }
}

/// A shell word for the command shown in the report (what a user pastes).
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_:./=,+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Runs a command in its own process group, stdout and stderr together, killing the
/// group at `timeout`.
fn run_with_timeout(program: &Path, args: &[String], timeout: Duration) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let dir = std::env::temp_dir().join(format!(
        "mqa-fuzz-sanitizer-{}-{}",
        std::process::id(),
        crate::util::unix_now()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let log = dir.join("output.txt");
    let file =
        std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let start = Instant::now();
    let timed_out = loop {
        match child.try_wait() {
            Ok(Some(_)) => break false,
            Ok(None) if start.elapsed() >= timeout => break true,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for {}: {e}", program.display())),
        }
    };
    if timed_out {
        // SAFETY: kill(2) on the process group we created for the child.
        unsafe {
            libc::kill(-(child.id() as i32), libc::SIGKILL);
        }
        let _ = child.wait();
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if timed_out {
        return Err(format!(
            "compute-sanitizer did not finish within {} s",
            timeout.as_secs()
        ));
    }
    Ok(text)
}

/// Localises a shrunk finding of `class` on `kernel` whose case is saved in
/// `case_file`: `Ok(None)` when no tool is asked for that class, `Err(reason)` when it
/// was asked for and could not run or found nothing.
pub fn localise(
    cfg: &SanitizeConfig,
    class: crate::oracle::Class,
    kernel: &dyn crate::kernel::Kernel,
    case_file: Option<&Path>,
) -> Result<Option<Localisation>, String> {
    let Some(tool) = cfg.tool_for(class) else {
        return Ok(None);
    };
    let sanitizer = find_tool().ok_or("compute-sanitizer not found on PATH")?;
    if !kernel.on_accelerator() {
        return Err(format!(
            "{} does not run on a GPU: compute-sanitizer sees only CUDA kernels",
            kernel.name()
        ));
    }
    let case_file = case_file.ok_or("the shrunk case was not saved (no file to replay)")?;
    let exe = match std::env::var_os("MQA_FUZZ_WORKER_EXE") {
        Some(p) => PathBuf::from(p),
        None => {
            std::env::current_exe().map_err(|e| format!("cannot find our own executable: {e}"))?
        }
    };
    run_tool(
        &sanitizer,
        tool,
        &exe,
        case_file,
        kernel.name(),
        cfg.timeout,
    )
    .map(Some)
}

#[cfg(test)]
#[path = "sanitizer_tests.rs"]
mod tests;
