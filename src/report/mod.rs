//! Reports (DESIGN §5): `report.json` (the record, schema in `reports/README.md`),
//! `junit.xml` (CI), `summary.md` (one screen), `index.html` (people, with a picture of
//! every finding) and the pictures as SVG files beside it. Plus the folds a scaled-out
//! campaign needs: `merge` (shards → one report) and `diff` (release → release).

pub mod cli;
pub mod fold;
pub mod headline;
pub mod html;
pub mod junit;
pub mod launches;
pub mod markdown;
pub mod model;
pub mod picture;
mod stats;
pub mod svg;
pub mod workers;

pub use fold::{diff, diff_text, merge, missing_shards};
pub use headline::headline;
pub use model::*;
pub use picture::{class_map, error_histogram};

use crate::error::Fatal;
use crate::util::write_atomic;
use std::path::{Path, PathBuf};

pub const REPORT_JSON: &str = "report.json";
pub const JUNIT_XML: &str = "junit.xml";
pub const SUMMARY_MD: &str = "summary.md";
pub const INDEX_HTML: &str = "index.html";
pub const PICTURES_DIR: &str = "pictures";

/// The picture files of finding `i` (0-based), relative to the report directory.
pub fn picture_files(i: usize) -> (String, String) {
    (
        format!("{PICTURES_DIR}/finding-{:03}-map.svg", i + 1),
        format!("{PICTURES_DIR}/finding-{:03}-errors.svg", i + 1),
    )
}

/// Writes every file of the report into `dir` (created if needed), each atomically.
/// `report.json` is written last, so a directory whose `report.json` is new has every
/// other file at least as new. Stale pictures from an earlier render are removed.
pub fn write_all(dir: &Path, report: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join(PICTURES_DIR))?;
    let mut keep = Vec::new();
    for (i, f) in report.findings.iter().enumerate() {
        let (map_file, hist_file) = picture_files(i);
        let (map_title, hist_title) = html::picture_titles(i, f);
        if let Some(map) = &f.picture {
            write_atomic(
                &dir.join(&map_file),
                svg::class_map_svg(map, &map_title).as_bytes(),
            )?;
            keep.push(map_file);
        }
        if f.error_histogram.iter().any(|&n| n > 0) {
            write_atomic(
                &dir.join(&hist_file),
                svg::histogram_svg(&f.error_histogram, &hist_title).as_bytes(),
            )?;
            keep.push(hist_file);
        }
    }
    for entry in std::fs::read_dir(dir.join(PICTURES_DIR))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("finding-")
            && name.ends_with(".svg")
            && !keep.contains(&format!("{PICTURES_DIR}/{name}"))
        {
            std::fs::remove_file(entry.path())?;
        }
    }
    write_atomic(&dir.join(JUNIT_XML), junit::junit_xml(report).as_bytes())?;
    write_atomic(
        &dir.join(SUMMARY_MD),
        markdown::summary_md(report).as_bytes(),
    )?;
    write_atomic(&dir.join(INDEX_HTML), html::index_html(report).as_bytes())?;
    let json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    write_atomic(&dir.join(REPORT_JSON), json.as_bytes())
}

/// `dir/report.json`, or `dir` itself when it names a file.
pub fn report_path(dir: &Path) -> PathBuf {
    if dir.is_file() {
        dir.to_path_buf()
    } else {
        dir.join(REPORT_JSON)
    }
}

/// Reads a report written by [`write_all`] (give the directory or the JSON file).
/// Bad input is exit 2 with one line naming the file and the field
/// (`reports/x/report.json: field findings[0].verdict.metrics: ...`).
pub fn load(dir: &Path) -> Result<Report, Fatal> {
    let path = report_path(dir);
    let len = std::fs::metadata(&path)
        .map_err(|e| Fatal::usage(format!("{}: cannot read: {e}", path.display())))?
        .len();
    if len > MAX_REPORT_BYTES {
        return Err(Fatal::usage(format!(
            "{}: file: {len} bytes is above the {MAX_REPORT_BYTES}-byte limit",
            path.display()
        )));
    }
    let text = std::fs::read(&path)
        .map_err(|e| Fatal::usage(format!("{}: cannot read: {e}", path.display())))?;
    parse(&path, &text)
}

/// Largest `report.json` read: far above any real report (findings are deduplicated),
/// so a wrong or hostile file is refused before it is read into memory.
pub const MAX_REPORT_BYTES: u64 = 1 << 30;

/// Parses a report already in memory; `path` only names the file in errors. [`load`]
/// goes through here, so fuzzing this covers every check it makes.
pub fn parse(path: &Path, text: &[u8]) -> Result<Report, Fatal> {
    let de = &mut serde_json::Deserializer::from_slice(text);
    let report: Report = serde_path_to_error::deserialize(de).map_err(|e| {
        // The path ends in `?` where the error was in a key, not yet known.
        let field = match e.path().to_string() {
            f if matches!(f.as_str(), "" | "." | "?") => "(top level)".to_string(),
            f => match f.strip_suffix(".?") {
                Some(parent) => format!("{parent} (a key)"),
                None => f,
            },
        };
        let inner = e.inner();
        let truncated = if inner.is_eof() {
            "file is truncated: "
        } else {
            ""
        };
        Fatal::usage(format!(
            "{}: field {field}: {truncated}{inner}",
            path.display()
        ))
    })?;
    if report.report_version == 0 {
        return Err(Fatal::usage(format!(
            "{}: field report_version: missing or 0 (not a mqa-fuzz report?)",
            path.display()
        )));
    }
    if report.report_version > REPORT_VERSION {
        return Err(Fatal::usage(format!(
            "{}: field report_version: {} is newer than this mqa-fuzz understands ({REPORT_VERSION}); upgrade mqa-fuzz",
            path.display(),
            report.report_version
        )));
    }
    Ok(report)
}
