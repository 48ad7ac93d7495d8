//! The campaign report model (`report.json`). Provisional copy of the agreed schema;
//! the report module owns and documents it.

use crate::oracle::{Class, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const REPORT_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub report_version: u32,
    pub tool_version: String,
    pub run_id: String,
    pub started_unix: u64,
    pub finished_unix: u64,
    pub interrupted: bool,
    pub environment: Environment,
    pub kernels: Vec<KernelInfo>,
    pub profile: String,
    pub seed: u64,
    pub shard: Option<Shard>,
    pub budget_secs: Option<f64>,
    pub max_cases: Option<u64>,
    pub counts: Counts,
    pub per_kernel: BTreeMap<String, KernelStats>,
    pub findings: Vec<Finding>,
    pub coverage: Coverage,
    pub timings: Timings,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Environment {
    pub hostname: String,
    pub os: String,
    pub cpus: usize,
    pub gpus: Vec<String>,
    pub command_line: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct KernelInfo {
    pub name: String,
    pub version: String,
    pub planted_bug: bool,
    pub capabilities: serde_json::Value,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Counts {
    pub cases_replayed: u64,
    pub cases_generated: u64,
    pub cases_skipped: u64,
    pub skip_reasons: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct KernelStats {
    pub cases: u64,
    pub clean: u64,
    pub with_findings: u64,
    pub skipped: u64,
    pub class_totals: BTreeMap<Class, u64>,
    pub rows_checked: u64,
    pub logits_checked: u64,
    pub guard: GuardSummary,
    pub kernel_secs: f64,
    pub max_err_over_bound: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GuardSummary {
    pub cases: u64,
    pub redundant_cases: u64,
    pub rows_affected: u64,
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    pub signature: String,
    pub kernel: String,
    pub profile: String,
    pub class: Option<Class>,
    pub classes: BTreeMap<Class, u64>,
    pub case_file: Option<String>,
    pub replay_command: String,
    pub seed: Option<u64>,
    pub shrunk: bool,
    pub rows: usize,
    pub tokens: u64,
    pub occurrences: u64,
    pub verdict: Verdict,
    pub picture: Option<ClassMap>,
    pub error_histogram: Vec<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassMap {}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Coverage {
    pub axes: BTreeMap<String, BTreeMap<String, u64>>,
    pub combos: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    pub wall_secs: f64,
    pub generate_secs: f64,
    pub kernel_secs: f64,
    pub reference_secs: f64,
    pub oracle_secs: f64,
    pub shrink_secs: f64,
}
