//! Shard reports as another machine (or a person) left them: parse up to three
//! `report.json` texts, merge them, diff them, and render every format from the
//! merge. Bad files are refused with a field; nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqa_fuzz::report;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    // Reports are separated by a 0xFF byte (never valid inside UTF-8 JSON).
    let reports: Vec<report::Report> = data
        .split(|&b| b == 0xFF)
        .take(3)
        .filter_map(|text| report::parse(Path::new("report.json"), text).ok())
        .collect();
    if reports.is_empty() {
        return;
    }
    let merged = report::merge(&reports);
    let _ = report::missing_shards(&merged);
    let d = report::diff(&reports[0], &merged);
    let _ = report::diff_text(&d);
    let _ = report::headline(&merged);
    let _ = report::junit::junit_xml(&merged);
    let _ = report::markdown::summary_md(&merged);
    let _ = report::html::index_html(&merged);
    for (i, f) in merged.findings.iter().enumerate() {
        let (map_title, hist_title) = report::html::picture_titles(i, f);
        if let Some(map) = &f.picture {
            let _ = report::svg::class_map_svg(map, &map_title);
        }
        let _ = report::svg::histogram_svg(&f.error_histogram, &hist_title);
    }
    // A merged report must survive its own round trip.
    let text = serde_json::to_vec(&merged).expect("a report serializes");
    report::parse(Path::new("merged.json"), &text).expect("a merged report parses back");
});
