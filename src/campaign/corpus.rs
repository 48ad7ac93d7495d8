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
