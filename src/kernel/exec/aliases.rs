//! Short names for the adapters in `kernels/external/`: `--kernel deepgemm` instead of
//! `--kernel 'exec:python3 kernels/external/deepgemm_adapter.py'`. Words after the
//! alias are passed to the adapter (`--kernel 'numpy --plant tail-unwritten'`), and the
//! whole string stays the kernel's name, so a saved case replays on the same thing.

use crate::kernel::{KernelEntry, OpenError};
use crate::util::shell_quote;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

pub struct Alias {
    pub name: &'static str,
    pub script: &'static str,
    /// Python modules that must be importable.
    pub modules: &'static [&'static str],
    pub description: &'static str,
}

pub const ALIASES: [Alias; 5] = [
    Alias {
        name: "numpy",
        script: "numpy_adapter.py",
        modules: &["numpy"],
        description: "the operation in numpy on the CPU, through the worker protocol; --plant BUG reproduces a planted bug",
    },
    Alias {
        name: "torch",
        script: "torch_adapter.py",
        modules: &["numpy", "torch"],
        description: "the torch reference as engines write it (vLLM's fp8_paged_mqa_logits_torch), GPU if present",
    },
    Alias {
        name: "deepgemm",
        script: "deepgemm_adapter.py",
        modules: &["numpy", "torch", "deep_gemm"],
        description: "DeepGEMM fp8_paged_mqa_logits / fp8_fp4_paged_mqa_logits on an NVIDIA GPU (SM90/SM100)",
    },
    Alias {
        name: "aiter",
        script: "aiter_adapter.py",
        modules: &["numpy", "torch", "aiter"],
        description: "AITER deepgemm_fp8_paged_mqa_logits on an AMD GPU (gfx942/gfx950); --guard adds nan_to_num_(-inf)",
    },
    Alias {
        name: "vllm",
        script: "vllm_adapter.py",
        modules: &["numpy", "torch", "vllm"],
        description: "vLLM's paged MQA logits entry point (ROCm AITER path or torch fallback) with a reused stale workspace",
    },
];

/// The Python interpreter the aliases use (`MQA_FUZZ_PYTHON`, default `python3`).
pub fn python() -> String {
    std::env::var("MQA_FUZZ_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Where the adapters are: `MQA_FUZZ_ADAPTERS`, else `kernels/external` under the
/// current directory, else the source tree this binary was built from.
pub fn adapter_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MQA_FUZZ_ADAPTERS") {
        return Some(PathBuf::from(d));
    }
    let candidates = [
        PathBuf::from("kernels/external"),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernels/external"),
    ];
    candidates
        .into_iter()
        .find(|d| d.join("protocol_common.py").is_file())
}

/// The shell command for an alias name (`deepgemm`, `numpy --plant zero-batch`), or
/// `None` when `name` is not an alias.
pub fn expand(name: &str) -> Option<Result<String, OpenError>> {
    let mut words = name.split_whitespace();
    let first = words.next()?;
    let alias = ALIASES.iter().find(|a| a.name == first)?;
    let rest: Vec<&str> = words.collect();
    Some(
        check(alias)
            .map(|dir| {
                let mut cmd = format!(
                    "{} {}",
                    shell_quote(&python()),
                    shell_quote(&dir.join(alias.script).display().to_string())
                );
                for w in rest {
                    cmd.push(' ');
                    cmd.push_str(&shell_quote(w));
                }
                cmd
            })
            .map_err(|reason| OpenError::Unavailable {
                name: name.into(),
                reason,
            }),
    )
}

/// The adapter directory when the alias can run here, else why not.
fn check(alias: &Alias) -> Result<PathBuf, String> {
    let dir = adapter_dir().ok_or(
        "kernels/external not found: run from the repository root or set MQA_FUZZ_ADAPTERS",
    )?;
    let found = probe()?;
    let missing: Vec<&str> = alias
        .modules
        .iter()
        .copied()
        .filter(|m| !found.get(*m).copied().unwrap_or(false))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} cannot import {} (pip install {})",
            python(),
            missing.join(", "),
            pip_names(&missing)
        ));
    }
    Ok(dir)
}

fn pip_names(mods: &[&str]) -> String {
    mods.iter()
        .map(|m| match *m {
            "deep_gemm" => "deep_gemm (see docs/exec.md)",
            "aiter" => "amd-aiter (ROCm wheel)",
            x => x,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which of the aliases' modules `python3` can find, without importing them (cheap:
/// one interpreter start per process, cached).
fn probe() -> Result<HashMap<String, bool>, String> {
    static CACHE: OnceLock<Result<HashMap<String, bool>, String>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let mut mods: Vec<&str> = ALIASES.iter().flat_map(|a| a.modules.iter().copied()).collect();
            mods.sort_unstable();
            mods.dedup();
            let script = "import importlib.util,json,sys\nr={}\nfor m in sys.argv[1:]:\n    try: r[m]=importlib.util.find_spec(m) is not None\n    except Exception: r[m]=False\nprint(json.dumps(r))";
            let out = std::process::Command::new(python())
                .arg("-c")
                .arg(script)
                .args(&mods)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("{} not found ({e})", python()))?;
            if !out.status.success() {
                return Err(format!("{} failed to start ({})", python(), out.status));
            }
            serde_json::from_slice(&out.stdout).map_err(|e| format!("{} module probe: {e}", python()))
        })
        .clone()
}

/// Registry entries for the aliases, with availability on this machine.
pub fn entries() -> Vec<KernelEntry> {
    ALIASES
        .iter()
        .map(|a| KernelEntry {
            name: a.name.into(),
            description: format!(
                "{} (exec:{} kernels/external/{})",
                a.description,
                python(),
                a.script
            ),
            available: check(a).map(|_| ()),
            planted_bug: false,
        })
        .collect()
}
