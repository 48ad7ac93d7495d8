//! Helpers shared by the integration tests: the one place for test recipes (all built
//! from `Recipe::small`), judging a case on a kernel, and realistic reports built the way
//! a campaign builds them (real cases, real kernels, planted bugs included, the real
//! oracle, the report module's own pictures; nothing hand-written but the signature
//! scheme). `skip` is the harness of the test files that decide at run time whether
//! they can run.
#![allow(dead_code)]

pub mod binary;
pub mod skip;

use mqa_fuzz::case::Case;
use mqa_fuzz::generate::*;
use mqa_fuzz::harness::{run_and_judge, ReferenceCache};
use mqa_fuzz::kernel;
use mqa_fuzz::oracle::{OracleConfig, Verdict};
use mqa_fuzz::report::*;
use mqa_fuzz::shard::Shard;

/// A small, valid recipe: permuted table with -1 padding, padded strides, pipeline values.
pub fn recipe(lens: Vec<usize>, next_n: usize) -> Recipe {
    Recipe::small(lens, next_n, 7).with(|k| {
        k.heads = 4;
        k.head_dim = 32;
    })
}

/// Runs `name` on `case` with a fresh reference.
pub fn judge(name: &str, case: &Case) -> Verdict {
    judge_cfg(name, case, &OracleConfig::default())
}

pub fn judge_cfg(name: &str, case: &Case, cfg: &OracleConfig) -> Verdict {
    let k = kernel::open(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut refs = ReferenceCache::new(case);
    run_and_judge(k.as_ref(), case, &mut refs, cfg).verdict
}

/// Asserts the production kernels are clean on `case`.
pub fn assert_clean_on_good_kernels(case: &Case) {
    case.validate().expect("case must be valid");
    for name in ["cpu:chunked", "cpu:naive"] {
        let v = judge(name, case);
        assert!(
            v.is_clean(),
            "{name} must be clean: {:?} {:?}",
            v.classes,
            v.examples
        );
        assert!(v.skipped.is_none(), "{name} skipped: {:?}", v.skipped);
    }
}

/// The recipe of case `seed`: lengths vary with the seed so cases differ in shape.
pub fn recipe_for(seed: u64) -> Recipe {
    let a = 200 + (seed as usize * 37) % 300;
    Recipe::small(vec![a, 0, 17 + seed as usize % 5, 300], 2, seed)
}

/// Runs `seeds` on `kernel_name` and folds the verdicts into a report, as a campaign
/// would: per-kernel statistics, guard summary, one finding per signature.
pub fn campaign(kernel_name: &str, profile: &str, seeds: &[u64], shard: Option<Shard>) -> Report {
    campaign_with(kernel_name, profile, seeds, shard, |_| {})
}

/// [`campaign`] with each recipe adjusted by `tweak` (e.g. the fp8 format a bug needs).
pub fn campaign_with(
    kernel_name: &str,
    profile: &str,
    seeds: &[u64],
    shard: Option<Shard>,
    tweak: impl Fn(&mut Recipe),
) -> Report {
    let k = kernel::open(kernel_name).unwrap();
    let mut report = Report {
        report_version: REPORT_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        run_id: format!("test-{kernel_name}-{}", seeds.first().copied().unwrap_or(0)),
        started_unix: 1_796_000_000 + seeds.first().copied().unwrap_or(0),
        finished_unix: 1_796_000_100 + seeds.last().copied().unwrap_or(0),
        profile: profile.into(),
        seed: 42,
        shard,
        kernels: vec![KernelInfo {
            name: kernel_name.into(),
            version: k.version(),
            planted_bug: kernel_name.contains("bug"),
            capabilities: serde_json::json!({}),
            worker: None,
        }],
        ..Default::default()
    };
    let stats = report
        .per_kernel
        .entry(kernel_name.to_string())
        .or_default();
    for &seed in seeds {
        // Data in a format the kernel declares (fnuz-as-fn only takes e4m3fnuz).
        let mut r = recipe_for(seed);
        tweak(&mut r);
        if !k.capabilities().formats.contains(&r.knobs.format) {
            r.knobs.format = k.capabilities().formats[0];
        }
        let case = r.materialize();
        report.counts.cases_generated += 1;
        *report
            .coverage
            .axes
            .entry("block_size".into())
            .or_default()
            .entry(case.shape.block_size.to_string())
            .or_default() += 1;
        *report
            .coverage
            .combos
            .entry(format!(
                "bs={},n={}",
                case.shape.block_size, case.shape.next_n
            ))
            .or_default() += 1;
        let mut refs = ReferenceCache::new(&case);
        let judged = run_and_judge(k.as_ref(), &case, &mut refs, &OracleConfig::default());
        let v = judged.verdict;
        stats.cases += 1;
        stats.rows_checked += v.metrics.rows_checked;
        stats.logits_checked += v.metrics.checked;
        stats.guard.cases += 1;
        stats.guard.redundant_cases += v.guard.redundant as u64;
        stats.guard.rows_affected += v.guard.rows_affected;
        stats.guard.nan += v.guard.nan;
        stats.guard.pos_inf += v.guard.pos_inf;
        stats.guard.neg_inf += v.guard.neg_inf;
        if v.metrics.max_err_over_bound > stats.max_err_over_bound {
            stats.max_err_over_bound = v.metrics.max_err_over_bound;
        }
        if v.is_clean() {
            stats.clean += 1;
            continue;
        }
        stats.with_findings += 1;
        for (c, n) in &v.classes {
            *stats.class_totals.entry(*c).or_default() += n;
        }
        let class = v.primary_class().unwrap();
        let signature = format!(
            "{kernel_name}/{}",
            v.classes
                .keys()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join("+")
        );
        if let Some(f) = report
            .findings
            .iter_mut()
            .find(|f| f.signature == signature)
        {
            f.occurrences += 1;
            continue;
        }
        let out = judged.output.expect("the kernel ran");
        let reference = refs.get(k.capabilities().scale_placement);
        report.findings.push(Finding {
            signature,
            kernel: kernel_name.into(),
            profile: profile.into(),
            class: Some(class),
            classes: v.classes.clone(),
            case_file: Some(format!("corpus/{kernel_name}-{seed}.json")),
            replay_command: format!(
                "mqa-fuzz replay corpus/{kernel_name}-{seed}.json --kernel {kernel_name}"
            ),
            seed: Some(seed),
            shrunk: false,
            rows: case.rows(),
            tokens: (0..case.shape.batch)
                .map(|b| case.seq_tokens(b) as u64)
                .sum(),
            occurrences: 1,
            picture: Some(class_map(&case, reference, k.capabilities(), &out)),
            error_histogram: error_histogram(&case, reference, k.capabilities(), &out),
            verdict: v,
            ..Default::default()
        });
    }
    report
}
