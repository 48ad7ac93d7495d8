//! Reports: `report.json` and the files rendered from it.

pub mod model;

pub use model::*;

use std::path::Path;

/// Writes the report files into `dir` (atomically).
pub fn write_all(dir: &Path, report: &Report) -> std::io::Result<()> {
    let mut text = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    text.push(b'\n');
    crate::util::write_atomic(&dir.join("report.json"), &text)
}
