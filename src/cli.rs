//! Command line (clap derive). Each subcommand parses here and runs in its module;
//! errors come back as [`Fatal`] and are rendered once in `main`.

use crate::case::{load_case_file, CaseFile};
use crate::error::{exit, Fatal};
use crate::harness::{self, ReferenceCache};
use crate::kernel;
use crate::oracle::{OracleConfig, Verdict};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "mqa-fuzz",
    version,
    about = "Differential fuzzer for FP8 paged MQA logits kernels (DeepGEMM, AITER, your own)",
    long_about = "Generates cases of the DeepSeek V3.2/V4 indexer's fp8_paged_mqa_logits operation, runs a kernel \
on them, compares with an exact reference element by element, and says where and why the output diverges.\n\n\
Exit codes: 0 clean, 1 findings, 2 bad usage or input, 3 environment (e.g. GPU required but absent)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List kernels and whether this machine can run them.
    Kernels {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay saved cases (corpus files) on a kernel and judge them.
    Replay {
        /// Corpus JSON files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Kernel to run (default: the kernel recorded in each file when available, else the default kernel).
        #[arg(long)]
        kernel: Option<String>,
        /// k of the downstream top-k check.
        #[arg(long, default_value_t = 2048)]
        topk: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Serve a built-in kernel over the worker protocol on stdin/stdout (used by
    /// `exec:` pools to isolate kernels in child processes).
    #[command(hide = true)]
    Worker {
        /// Kernel to serve (any name `mqa-fuzz kernels` lists).
        #[arg(long)]
        kernel: String,
        /// Misbehave on purpose (tests): crash-at=N, hang-at=N, garbage-at=N, wrong-id-at=N, fault-exit-at=N, skew.
        #[arg(long)]
        fault: Option<String>,
    },
}

/// Runs the parsed command; returns the exit code.
pub fn dispatch(cli: Cli) -> Result<i32, Fatal> {
    match cli.command {
        Command::Kernels { json } => cmd_kernels(json),
        Command::Replay { files, kernel, topk, json } => cmd_replay(&files, kernel.as_deref(), topk, json),
        Command::Worker { kernel, fault } => cmd_worker(&kernel, fault.as_deref()),
    }
}

fn cmd_worker(name: &str, fault: Option<&str>) -> Result<i32, Fatal> {
    let fault = fault.map(kernel::exec::server::Fault::parse).transpose().map_err(Fatal::usage)?;
    kernel::exec::server::serve(name, fault)
}

fn cmd_kernels(json: bool) -> Result<i32, Fatal> {
    let entries = kernel::registry();
    if json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name,
                    "description": e.description,
                    "available": e.available.is_ok(),
                    "unavailable_reason": e.available.as_ref().err(),
                    "planted_bug": e.planted_bug,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
        return Ok(exit::CLEAN);
    }
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(10);
    for e in &entries {
        let status = match &e.available {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        println!("{:width$}  {:<11}  {}", e.name, if e.planted_bug { "planted bug" } else { "" }, status);
        println!("{:width$}  {:<11}  {}", "", "", e.description);
    }
    Ok(exit::CLEAN)
}

/// One line summarizing a verdict for the terminal.
pub fn verdict_line(v: &Verdict) -> String {
    if let Some(why) = &v.skipped {
        return format!("skipped ({why})");
    }
    if v.is_clean() {
        return format!(
            "clean ({} rows, {} logits checked, max err/bound {:.3}, calc_diff {:.2e}, guard {})",
            v.metrics.rows_checked,
            v.metrics.checked,
            v.metrics.max_err_over_bound,
            v.metrics.calc_diff,
            if v.guard.redundant { "redundant" } else { "NEEDED" }
        );
    }
    let classes: Vec<String> = v.classes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
    let mut s = format!("FINDING {}", classes.join(", "));
    if let Some(e) = v.examples.first() {
        s.push_str(&format!("; first {}", e.class));
        if let (Some(r), Some(t)) = (e.row, e.pos) {
            s.push_str(&format!(" at row {r} position {t}"));
        }
        if let Some(x) = e.expected {
            s.push_str(&format!(" expected {x:e}"));
        }
        if let Some(g) = &e.got {
            s.push_str(&format!(" got {g}"));
        }
        if let Some(d) = &e.detail {
            s.push_str(&format!(": {d}"));
        }
    }
    s
}

fn cmd_replay(files: &[PathBuf], kernel_name: Option<&str>, topk: usize, json: bool) -> Result<i32, Fatal> {
    // Load everything first: bad input is reported before any work is done.
    let cases: Vec<(PathBuf, CaseFile)> = files
        .iter()
        .map(|f| load_case_file(f).map(|c| (f.clone(), c)))
        .collect::<Result<_, _>>()?;
    let cfg = OracleConfig { topk, ..Default::default() };
    let mut any_finding = false;
    let mut out = Vec::new();
    for (path, file) in &cases {
        let name = match kernel_name {
            Some(k) => k.to_string(),
            None if kernel::open(&file.provenance.kernel).is_ok() => file.provenance.kernel.clone(),
            None => kernel::default_kernel_name().to_string(),
        };
        let k = kernel::open(&name)?;
        let mut refs = ReferenceCache::new(&file.case);
        let judged = harness::run_and_judge(k.as_ref(), &file.case, &mut refs, &cfg);
        let v = judged.verdict;
        any_finding |= harness::has_findings(&v);
        if json {
            out.push(serde_json::json!({
                "file": path,
                "kernel": name,
                "expected_classes": file.expected.classes,
                "verdict": v,
            }));
        } else {
            println!("{}  {}  {}", path.display(), name, verdict_line(&v));
            let want: Vec<_> = file.expected.classes.clone();
            let got = v.finding_classes();
            if kernel_name.is_none() && want != got {
                println!(
                    "  note: the file expected [{}], this replay found [{}]",
                    want.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "),
                    got.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
                );
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
    Ok(if any_finding { exit::FINDINGS } else { exit::CLEAN })
}
