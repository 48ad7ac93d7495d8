//! The corpus directory: saved cases, replayed first by every campaign. One bug gives
//! one file: files are named by a signature (kernel, class, axis fingerprint), and a
//! finding whose signature is already saved only counts an occurrence.

use crate::case::{load_case_file, save_case_file, Case, CaseFile, CaseFileError};
use crate::oracle::Class;
use std::path::{Path, PathBuf};

/// The coarse axes that tell bugs of one class apart: where the addresses lie (a
/// wrapped 32-bit offset is a different bug from a masking error with the same class).
/// Shape, format and layout are left out on purpose: shrinking drives them to their
/// simplest values, and one bug must give one corpus file, not one per layout.
pub fn fingerprint(case: &Case) -> String {
    let max_off = case.max_kv_offset();
    let offsets = if max_off >= 1 << 32 {
        "kv>4g"
    } else if max_off >= 1 << 31 {
        "kv>2g"
    } else {
        "kv-low"
    };
    format!(
        "{offsets}/{}",
        if case.output_bytes() > 1 << 31 {
            "out>2g"
        } else {
            "out-low"
        }
    )
}

/// The deduplication signature of a finding: kernel and class. One planted bug gives
/// one corpus file; a second, different bug of the same class in the same kernel is
/// counted as an occurrence of the first until the first is fixed (its file then
/// replays clean and the second one gets saved).
pub fn signature(kernel: &str, class: Class, _case: &Case) -> String {
    format!("{kernel}|{}", class.name())
}

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
