//! The corpus directory: saved cases, replayed first by every campaign. One bug gives
//! one file: files are named by the finding's signature (kernel, class, crash reason,
//! trigger; see [`crate::finding::Signature`]), and a finding whose signature is
//! already saved only counts an occurrence.

use crate::case::{load_case_file, save_case_file, CaseFile, CaseFileError};
use crate::oracle::Class;
use std::path::{Path, PathBuf};

/// FNV-1a, for short stable file names.
pub fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("{:08x}", (h >> 32) as u32 ^ h as u32)
}

/// The corpus file of a signature.
pub fn path_for(dir: &Path, kernel: &str, class: Class, signature: &str) -> PathBuf {
    let k: String = kernel
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    dir.join(format!(
        "{k}__{}__{}.json",
        class.name(),
        short_hash(signature)
    ))
}

/// Every `*.json` case in the directory, sorted by name (a missing directory is empty).
pub fn list(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    v.sort();
    v
}

pub fn load_all(dir: &Path) -> Result<Vec<(PathBuf, CaseFile)>, CaseFileError> {
    list(dir)
        .into_iter()
        .map(|p| load_case_file(&p).map(|c| (p, c)))
        .collect()
}

pub fn save(path: &Path, file: &CaseFile) -> std::io::Result<()> {
    save_case_file(path, file)
}

/// Whether a finding's saved case still fails on replay with the finding's class (and,
/// for a crash, its reason): `Err` says why it cannot be replayed here (no case file,
/// a file that does not load, a kernel that does not open, a skip). `diff` uses it to
/// call a bug fixed only when its case no longer fails.
pub fn reproduces(
    f: &crate::report::Finding,
    oracle: &crate::oracle::OracleConfig,
) -> Result<bool, String> {
    use crate::harness::{self, ReferenceCache};
    let class = f.class.ok_or("the finding has no class")?;
    let path = f
        .case_file
        .as_deref()
        .ok_or("the finding has no saved case")?;
    let file = load_case_file(Path::new(path)).map_err(|e| e.to_string())?;
    let names: Vec<String> = if file.provenance.kernels.len() > 1 {
        file.provenance.kernels.clone()
    } else {
        vec![f.kernel.clone()]
    };
    let kernels = names
        .iter()
        .map(|n| crate::kernel::open(n).map_err(|e| format!("kernel {n}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut refs = ReferenceCache::new(&file.case);
    let judged: Vec<_> = kernels
        .iter()
        .map(|k| harness::run_and_judge(k.as_ref(), &file.case, &mut refs, oracle))
        .collect();
    if let Some(e) = judged.iter().find_map(|j| j.environment_error.clone()) {
        return Err(e);
    }
    if let Some(why) = judged.iter().find_map(|j| j.verdict.skipped.clone()) {
        return Err(format!("skipped: {why}"));
    }
    if class == Class::Divergent {
        let (Some(a), Some(b)) = (&judged[0].output, &judged[judged.len() - 1].output) else {
            return Ok(false);
        };
        let (ka, kb) = (kernels[0].as_ref(), kernels[kernels.len() - 1].as_ref());
        return Ok(harness::divergence(&file.case, (ka, a), (kb, b)).is_some());
    }
    Ok(crate::finding::shows(
        &judged[0].verdict,
        class,
        f.reason.as_deref(),
    ))
}
