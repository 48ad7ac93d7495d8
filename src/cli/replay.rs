//! `mqa-fuzz replay`: saved cases re-run and judged, on the kernels recorded in each file
//! or on those given; with two or more kernels their outputs are also compared.

use crate::case::{load_case_file, CaseFile};
use crate::error::{exit, Fatal};
use crate::harness::{self, ReferenceCache};
use crate::kernel;
use crate::oracle::OracleConfig;
use std::path::PathBuf;

/// The kernels a file replays on without `--kernel`: those recorded in it (both of a
/// divergence), or the default kernel for a file that records none (hand-made cases).
fn recorded_kernels(file: &CaseFile) -> Option<Vec<String>> {
    let p = &file.provenance;
    if !p.kernels.is_empty() {
        Some(p.kernels.clone())
    } else if !p.kernel.is_empty() && p.kernel != "hand-made" {
        Some(vec![p.kernel.clone()])
    } else {
        None
    }
}

/// The judge of a replay: where two or more kernels replay a file their outputs are
/// compared element by element here, so they are judged here; else where `--judge auto`
/// would.
fn replay_oracle(topk: usize, plan: &[Vec<String>]) -> OracleConfig {
    OracleConfig {
        topk,
        judge: if plan.iter().any(|names| names.len() >= 2) {
            crate::oracle::JudgeMode::Cpu
        } else {
            crate::oracle::JudgeMode::Auto
        },
        ..Default::default()
    }
}

pub(super) fn cmd_replay(
    files: &[PathBuf],
    kernel_names: &[String],
    topk: usize,
    json: bool,
) -> Result<i32, Fatal> {
    if topk == 0 {
        return Err(Fatal::usage(
            "--topk 0: k of the top-k check must be at least 1",
        ));
    }
    // Load everything first: bad input is reported before any work is done.
    let cases: Vec<(PathBuf, CaseFile)> = files
        .iter()
        .map(|f| load_case_file(f).map(|c| (f.clone(), c)))
        .collect::<Result<_, _>>()?;
    // Then open every kernel: a recorded kernel this machine cannot run is exit 3 naming
    // it, never a silent replay on another kernel (which would read as "fixed").
    let mut opened: std::collections::BTreeMap<String, Box<dyn kernel::Kernel>> =
        Default::default();
    let mut plan: Vec<Vec<String>> = Vec::new();
    for (path, file) in &cases {
        let names = if !kernel_names.is_empty() {
            kernel_names.to_vec()
        } else {
            recorded_kernels(file)
                .unwrap_or_else(|| vec![kernel::default_kernel_name().to_string()])
        };
        for name in &names {
            if opened.contains_key(name) {
                continue;
            }
            let k = match kernel::open(name) {
                Ok(k) => k,
                Err(e) if !kernel_names.is_empty() => return Err(e.into()),
                Err(kernel::OpenError::Unavailable { reason, .. }) => {
                    return Err(Fatal::environment(format!(
                        "{}: {name} is not available here: {reason}; pass --kernel to replay on another",
                        path.display()
                    )))
                }
                Err(e) => {
                    return Err(Fatal::usage(format!(
                        "{}: field provenance.kernel: {e}; pass --kernel to replay on another",
                        path.display()
                    )))
                }
            };
            opened.insert(name.clone(), k);
        }
        plan.push(names);
    }
    let cfg = replay_oracle(topk, &plan);
    let mut any_finding = false;
    let mut out = Vec::new();
    for ((path, file), names) in cases.iter().zip(&plan) {
        let kernels: Vec<&dyn kernel::Kernel> = names.iter().map(|n| opened[n].as_ref()).collect();
        let mut refs = ReferenceCache::new(&file.case);
        let mut got = Vec::new();
        let mut outputs = Vec::new();
        for (name, k) in names.iter().zip(&kernels) {
            let judged = harness::run_and_judge(*k, &file.case, &mut refs, &cfg);
            if let Some(e) = judged.environment_error {
                return Err(Fatal::environment(format!("{name}: {e}")));
            }
            let mut v = judged.verdict;
            outputs.push(judged.output);
            // A property finding's file: its property is checked again (runs the case
            // more times); its class joins the verdict.
            for p in crate::property::expected_properties(&file.expected.classes) {
                let pv = crate::property::replay(*k, &file.case, p, &cfg);
                for (c, n) in pv.classes.iter().filter(|(c, _)| **c == p.class()) {
                    v.classes.insert(*c, *n);
                }
                v.examples
                    .extend(pv.examples.into_iter().filter(|e| e.class == p.class()));
            }
            any_finding |= harness::has_findings(&v);
            for c in v.finding_classes() {
                if !got.contains(&c) {
                    got.push(c);
                }
            }
            if json {
                out.push(serde_json::json!({
                    "file": path,
                    "kernel": name,
                    "expected_classes": file.expected.classes,
                    "verdict": v,
                }));
            } else {
                crate::outln!("{}  {}  {}", path.display(), name, v);
            }
        }
        if kernels.len() >= 2 {
            let divergence = outputs.first().and_then(Option::as_ref).and_then(|a| {
                kernels.iter().zip(&outputs).skip(1).find_map(|(kb, ob)| {
                    harness::divergence(&file.case, (kernels[0], a), (*kb, ob.as_ref()?))
                })
            });
            if divergence.is_some() {
                any_finding = true;
                got.push(crate::oracle::Class::Divergent);
            }
            if json {
                out.push(serde_json::json!({
                    "file": path,
                    "kernels": names,
                    "divergent": divergence,
                }));
            } else {
                crate::outln!(
                    "{}  {}  {}",
                    path.display(),
                    names.join(" vs "),
                    match &divergence {
                        Some(msg) => format!("FINDING divergent: {msg}"),
                        None => "agree (no element differs by more than both bounds)".into(),
                    }
                );
            }
        }
        let want = &file.expected.classes;
        got.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        if !json && kernel_names.is_empty() && want_sorted != got {
            crate::outln!(
                "  note: the file expected [{}], this replay found [{}]",
                want.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "),
                got.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
            );
        }
    }
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
    Ok(if any_finding {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}
