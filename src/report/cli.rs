//! The report subcommands (`report`, `merge`, `diff`); parsing lives in `crate::cli`.

use super::{diff, diff_text, headline, load, merge, missing_shards, report_path, write_all};
use crate::error::{exit, Fatal};
use std::path::{Path, PathBuf};

fn write(dir: &Path, report: &super::Report) -> Result<(), Fatal> {
    write_all(dir, report)
        .map_err(|e| Fatal::environment(format!("{}: cannot write the report: {e}", dir.display())))
}

/// `mqa-fuzz report DIR`: re-renders every file from `DIR/report.json`. Exit code as a
/// campaign's: 1 when the report holds findings.
pub fn cmd_report(dir: &Path) -> Result<i32, Fatal> {
    let report = load(dir)?;
    let out = if dir.is_file() {
        dir.parent().unwrap_or(Path::new(".")).to_path_buf()
    } else {
        dir.to_path_buf()
    };
    write(&out, &report)?;
    crate::outln!("{}", headline(&report));
    crate::outln!("wrote {}", out.display());
    Ok(if report.findings.is_empty() {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}

/// `mqa-fuzz merge DIR... --out DIR`.
pub fn cmd_merge(dirs: &[PathBuf], out: &Path) -> Result<i32, Fatal> {
    let reports = dirs
        .iter()
        .map(|d| load(d))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((a, b, what)) = super::fold::repeated_shard(&reports) {
        return Err(Fatal::usage(format!(
            "{} and {} are both {what}: merging it twice would count its cases twice",
            dirs[a].display(),
            dirs[b].display()
        )));
    }
    let merged = merge(&reports);
    if report_path(out) == report_path(&dirs[0]) && dirs.len() > 1 {
        eprintln!("mqa-fuzz: note: --out is the first input; it is overwritten with the merge");
    }
    write(out, &merged)?;
    let missing = missing_shards(&merged);
    if !missing.is_empty() {
        eprintln!(
            "mqa-fuzz: warning: shards missing from the merge: {}",
            super::fold::shard_list(&missing)
        );
    }
    crate::outln!("{}", headline(&merged));
    crate::outln!(
        "merged {} report(s), {} distinct bug(s) into {}",
        reports.len(),
        merged.findings.len(),
        out.display()
    );
    Ok(if merged.findings.is_empty() {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}

/// Replays a finding's saved case: `Ok(true)` it still fails that way, `Ok(false)` it
/// does not, `Err(why)` it cannot be replayed here.
pub type Replay<'a> = &'a mut dyn FnMut(&super::Finding) -> Result<bool, String>;

/// `mqa-fuzz diff BASE CAND`: exit 1 when the candidate has findings the base has not.
/// A finding of the base that the candidate lacks is `fixed` only when its saved case
/// no longer fails on replay (`replay`: whether it still does; `None` with
/// `--no-replay`).
pub fn cmd_diff(
    base: &Path,
    cand: &Path,
    json: bool,
    replay: Option<Replay>,
) -> Result<i32, Fatal> {
    let b = load(base)?;
    let c = load(cand)?;
    let mut d = diff(&b, &c);
    if let Some(replay) = replay {
        super::fold::confirm_fixed(&mut d, replay);
    } else {
        let gone = std::mem::take(&mut d.fixed);
        d.unconfirmed = gone
            .into_iter()
            .map(|f| (f, "not replayed (--no-replay)".to_string()))
            .collect();
    }
    if json {
        let sigs = |v: &[super::Finding]| v.iter().map(|f| f.signature.clone()).collect::<Vec<_>>();
        let unconfirmed: Vec<serde_json::Value> = d
            .unconfirmed
            .iter()
            .map(|(f, why)| serde_json::json!({"signature": f.signature, "why": why}))
            .collect();
        let summary: serde_json::Value = serde_json::json!({
            "new": sigs(&d.new),
            "fixed": sigs(&d.fixed),
            "unchanged": sigs(&d.unchanged),
            "same_bug": d.same_bug.iter()
                .map(|(b, c)| serde_json::json!({"base": b, "candidate": c}))
                .collect::<Vec<_>>(),
            "still_failing": sigs(&d.still_failing),
            "unconfirmed": unconfirmed,
        });
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
    } else {
        crate::outln!("{}", diff_text(&d).trim_end_matches('\n'));
    }
    Ok(if d.new.is_empty() {
        exit::CLEAN
    } else {
        exit::FINDINGS
    })
}
