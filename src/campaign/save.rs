//! Saving a finding: its corpus file (atomically; into the report directory when the
//! corpus refuses it) and the command that replays it.

use super::progress::Progress;
use super::shrink::Shrunk;
use super::{corpus, Config};
use crate::case::{CaseFile, Provenance};
use crate::oracle::Class;
use std::path::{Path, PathBuf};

fn quote(s: &str) -> String {
    crate::util::shell_quote(s)
}

/// `mqa-fuzz replay FILE --kernel A [--kernel B]`: one kernel for a finding of that
/// kernel, both for a divergence (replay compares them again).
pub fn replay_command(file: &Path, kernels: &[&str]) -> String {
    let mut s = format!("mqa-fuzz replay {}", quote(&file.display().to_string()));
    for k in kernels {
        s.push_str(" --kernel ");
        s.push_str(&quote(k));
    }
    s
}

/// Where a finding goes when the corpus directory refuses it mid-campaign: inside the
/// report directory (checked writable before the campaign), so the case is never lost.
pub const FALLBACK_DIR: &str = "findings";

/// What a saved finding records besides the case itself.
pub(super) struct SaveRequest<'a> {
    /// The kernel of the finding, or the two kernels of a divergence.
    pub kernels: &'a [&'a str],
    pub class: Class,
    pub sig: &'a str,
    pub seed: u64,
    pub k: u64,
    pub shrunk: &'a Shrunk,
}

/// Saves a finding into the corpus; when that fails, says why and saves it into the
/// report directory instead ([`FALLBACK_DIR`]). `None` only when both fail (said too).
pub(super) fn save_finding(
    cfg: &Config,
    req: &SaveRequest,
    progress: &mut Progress,
) -> Option<PathBuf> {
    if !cfg.save_corpus {
        return None;
    }
    let name = req.kernels.join(" vs ");
    let path = corpus::path_for(&cfg.corpus_dir, &name, req.class, req.sig);
    if path.is_file() {
        return Some(path);
    }
    let s = req.shrunk;
    let file = CaseFile {
        provenance: Provenance {
            tool_version: super::setup::tool_version(),
            kernel: req.kernels.first().copied().unwrap_or_default().to_string(),
            kernels: if req.kernels.len() > 1 {
                req.kernels.iter().map(|k| k.to_string()).collect()
            } else {
                Vec::new()
            },
            profile: Some(cfg.profile.name().to_string()),
            seed: Some(req.seed),
            shrunk: s.shrunk,
            signature: Some(req.sig.to_string()),
            created_unix: Some(crate::util::unix_now()),
            note: Some(format!(
                "found by campaign seed {} at case {}; {} shrink steps",
                cfg.seed, req.k, s.steps
            )),
            recipe: serde_json::to_value(&s.recipe).ok(),
        },
        expected: crate::case::Expected {
            classes: s.verdict.finding_classes(),
        },
        case: s.case.clone(),
    };
    let e = match corpus::save(&path, &file) {
        Ok(()) => return Some(path),
        Err(e) => e,
    };
    let fallback = cfg
        .report_dir
        .join(FALLBACK_DIR)
        .join(path.file_name().unwrap_or_default());
    match corpus::save(&fallback, &file) {
        Ok(()) => {
            progress.warn(&format!(
                "mqa-fuzz: warning: cannot save the finding to {}: {e}; saved it to {} instead",
                path.display(),
                fallback.display()
            ));
            Some(fallback)
        }
        Err(e2) => {
            progress.warn(&format!(
                "mqa-fuzz: warning: cannot save the finding to {}: {e}, nor to {}: {e2}; only its verdict is in the report",
                path.display(),
                fallback.display()
            ));
            None
        }
    }
}
