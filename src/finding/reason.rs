//! Crash reasons: a crash message with everything that varies from case to case
//! stripped (numbers, addresses, paths, shapes), so that one cause gives one reason and
//! two causes give two: "illegal memory access", "AssertionError: Preshuffle mode is
//! only supported …" and "RuntimeError: The expanded size of the tensor … must match …"
//! are three bugs, however many cases and shapes show them.

use crate::oracle::{Class, Verdict};

/// Longest reason kept (characters); longer messages end in `…`.
const MAX_CHARS: usize = 120;

/// The normalised reason of the verdict's crash, if it crashed.
pub fn crash_reason(v: &Verdict) -> Option<String> {
    if !v.classes.contains_key(&Class::Crash) {
        return None;
    }
    let msg = v
        .examples
        .iter()
        .find(|e| e.class == Class::Crash)
        .and_then(|e| e.detail.as_deref())
        .unwrap_or("");
    Some(normalise_reason(msg))
}

/// One crash message → its reason.
///
/// 1. A device fault is named by what it is, however the library words it (CUDA's
///    "an illegal memory access was encountered", HIP's "memory access fault", the CPU
///    kernels' "illegal address: …"): `illegal memory access`, `misaligned address`.
/// 2. A worker that died is named by what died and the worker's last exception line
///    (else its first stderr line that is not a bare signal note); the command line
///    and exit status are left out.
/// 3. Otherwise the first line that names an exception (`Type: message`), or the first
///    line, with numbers, hex addresses, paths and shapes replaced by `…`.
pub fn normalise_reason(msg: &str) -> String {
    let lower = msg.to_ascii_lowercase();
    for (needle, reason) in [
        ("illegal memory access", "illegal memory access"),
        ("illegal address", "illegal memory access"),
        ("memory access fault", "illegal memory access"),
        ("misaligned address", "misaligned address"),
    ] {
        if lower.contains(needle) {
            return reason.to_string();
        }
    }
    // A worker that died: `<what>; worker `<command>` <status> during request N; stderr
    // tail:\n…`. The command and status vary with the run; the reason is what died
    // and the last thing the worker said (its exception, else its last line).
    if let (Some((what, _)), Some((_, tail))) =
        (msg.split_once("; worker `"), msg.split_once("stderr tail:"))
    {
        // A shell's or runtime's note of the signal ("Aborted (core dumped)") says less
        // than the line before it, and is not always captured: skip it.
        let informative = |l: &&str| {
            !l.is_empty()
                && !["Aborted", "Segmentation fault", "Killed", "Bus error"]
                    .iter()
                    .any(|s| l.starts_with(s))
        };
        let said = tail
            .lines()
            .map(str::trim)
            .rfind(|l| exception_line(l))
            .or_else(|| tail.lines().map(str::trim).find(informative))
            .unwrap_or("no message");
        return clip(format!(
            "{}: {}",
            strip_variables(what),
            strip_variables(said)
        ));
    }
    if let Some((what, _)) = msg.split_once("; worker `") {
        return clip(strip_variables(what));
    }
    let line = msg
        .lines()
        .map(str::trim)
        .find(|l| exception_line(l))
        .or_else(|| msg.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("");
    clip(strip_variables(line))
}

fn clip(out: String) -> String {
    if out.is_empty() {
        "crash without a message".into()
    } else if out.chars().count() > MAX_CHARS {
        out.chars().take(MAX_CHARS).collect::<String>() + "…"
    } else {
        out
    }
}

/// `AssertionError: …`, `RuntimeError: …`, `torch.OutOfMemoryError: …`.
fn exception_line(l: &str) -> bool {
    let Some((head, _)) = l.split_once(": ") else {
        return false;
    };
    let name = head.rsplit('.').next().unwrap_or(head);
    !head.contains(' ') && (name.ends_with("Error") || name.ends_with("Exception"))
}

/// Replaces every word that carries a value (a number, a hex address, a path, a shape
/// like `[4, 12]` or `(3)`) by `…`, keeping its brackets and clause punctuation; a run
/// of such words becomes one (`[4, 12].` → `[…].`).
fn strip_variables(line: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    let mut last_varied = false;
    for w in line.split_whitespace() {
        if !varies(w) {
            words.push(w.to_string());
            last_varied = false;
            continue;
        }
        let lead: String = w.chars().take_while(|c| "([{".contains(*c)).collect();
        let tail: String = {
            let t: String = w
                .chars()
                .rev()
                .take_while(|c| ".,;:)]}".contains(*c))
                .collect();
            t.chars().rev().collect()
        };
        match words.last_mut() {
            Some(prev) if last_varied => {
                let keep = prev.find('…').map_or(0, |i| i);
                prev.truncate(keep);
                prev.push('…');
                prev.push_str(tail.trim_start_matches(','));
            }
            _ => words.push(format!("{lead}…{tail}")),
        }
        last_varied = true;
    }
    words.join(" ")
}

/// Whether a word is a value: contains a digit not inside an identifier (`e4m3fn`,
/// `int32` stay), a path separator, or is a bracketed shape.
fn varies(w: &str) -> bool {
    if w.contains('/') {
        return true;
    }
    let core = w.trim_matches(|c: char| "()[]{},.;:'\"`".contains(c));
    if core.is_empty() {
        return w.chars().any(|c| c.is_ascii_digit());
    }
    let first = core.chars().next().unwrap();
    if first.is_ascii_digit() || first == '-' && core.len() > 1 {
        return true;
    }
    // block_table[0][3], size=12, x=0x7f..: an identifier holding a value.
    core.contains(|c: char| "[]=".contains(c)) && core.chars().any(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::normalise_reason as n;

    #[test]
    fn device_faults_have_one_name() {
        assert_eq!(
            n("RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"),
            "illegal memory access"
        );
        assert_eq!(
            n("illegal address: store of row 3 position 5 at element offset -12 of a 40-element output"),
            "illegal memory access"
        );
        assert_eq!(
            n("worker exited (signal 6) during request 4; stderr tail:\nMemory access fault by GPU node-2 on address 0x7f00"),
            "illegal memory access"
        );
    }

    #[test]
    fn numbers_paths_and_shapes_are_stripped() {
        let a = n("RuntimeError: The expanded size of the tensor (12) must match the existing size (3) at non-singleton dimension 1.  Target sizes: [4, 12].  Tensor sizes: [4, 3]");
        let b = n("RuntimeError: The expanded size of the tensor (7) must match the existing size (2) at non-singleton dimension 0.  Target sizes: [2, 7].  Tensor sizes: [2, 2]");
        assert_eq!(a, b);
        assert!(
            a.starts_with(
                "RuntimeError: The expanded size of the tensor (…) must match the existing size (…) at non-singleton dimension …."
            ),
            "{a}"
        );
        let c = n("Traceback (most recent call last):\n  File \"/opt/aiter/ops.py\", line 12, in f\nAssertionError: Preshuffle mode is only supported with block_size 64 on /opt/x");
        assert_eq!(
            c,
            "AssertionError: Preshuffle mode is only supported with block_size … on …"
        );
        assert_ne!(a, c);
        assert_eq!(
            n("e4m3fn data at 0x7ffe12 in int32"),
            "e4m3fn data at … in int32"
        );
        assert_eq!(n(""), "crash without a message");
    }

    #[test]
    fn a_dead_worker_is_named_by_what_it_said_last() {
        let a = n("worker exited; worker `python3 k/numpy_adapter.py --plant zero-batch` exit status 134 (signal 6 (SIGABRT)) during request 7; stderr tail:\nfault injection: aborting on request 7 (id 9)");
        let b = n("worker exited; worker `python3 k/numpy_adapter.py` exit status 134 (signal 6 (SIGABRT)) during request 2; stderr tail:\nfault injection: aborting on request 2 (id 3)");
        assert_eq!(a, b);
        assert_eq!(
            a,
            "worker exited: fault injection: aborting on request … (id …)"
        );
        let c = n("worker exited; worker `x` killed during request 1; stderr tail:\nTraceback (most recent call last):\nAssertionError: Preshuffle mode is only supported on gluon\nsome noise");
        assert_eq!(
            c,
            "worker exited: AssertionError: Preshuffle mode is only supported on gluon"
        );
    }
}
