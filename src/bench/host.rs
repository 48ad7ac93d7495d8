//! `mqa-fuzz bench host`: the host side of full-scale production cases, the work a
//! `cuda:` campaign does on the CPU around each launch. Per case: the recipe made into a
//! case (`materialize`: tables, queries, weights; keys are drawn where they are read),
//! `validate`, the harness writing the request's tensors into a shared region (keys as
//! their recipe, as for a built-in worker) and the worker reading them back into a case
//! (`read`, validation included). The case read back must equal the one written. The
//! write and the read run twice a case, in alternating order: the block table sent
//! whole and sent as each row's used entries and padding rule (`block_table_tail`,
//! what built-in workers take), so the two are compared in one run.

use crate::campaign::{case_seed, value_tree};
use crate::error::Fatal;
use crate::generate::strategy::draw_strategy_scaled;
use crate::generate::Profile;
use crate::kernel::exec::protocol::{self, RunRequest, Transport, WireInts, WorkerDraws};
use crate::kernel::exec::shm::{SharedRegion, ShmReader};
use proptest::strategy::ValueTree;
use serde::Serialize;
use std::time::Instant;

#[derive(Serialize, Default, Clone, Copy)]
struct Steps {
    materialize_s: f64,
    validate_s: f64,
    harness_write_s: f64,
    worker_read_s: f64,
    /// The same with the block table sent whole.
    harness_write_whole_s: f64,
    worker_read_whole_s: f64,
}

impl Steps {
    fn add(&mut self, o: &Steps) {
        self.materialize_s += o.materialize_s;
        self.validate_s += o.validate_s;
        self.harness_write_s += o.harness_write_s;
        self.worker_read_s += o.worker_read_s;
        self.harness_write_whole_s += o.harness_write_whole_s;
        self.worker_read_whole_s += o.worker_read_whole_s;
    }
    fn total(&self) -> f64 {
        self.materialize_s + self.validate_s + self.harness_write_s + self.worker_read_s
    }

    /// Each step's median over `all` (the mean of a few engine-sized tables hides
    /// what a typical case costs).
    fn median(all: &[Steps]) -> Steps {
        let of = |f: fn(&Steps) -> f64| {
            let mut v: Vec<f64> = all.iter().map(f).collect();
            crate::util::median(&mut v).unwrap_or(0.0)
        };
        Steps {
            materialize_s: of(|s| s.materialize_s),
            validate_s: of(|s| s.validate_s),
            harness_write_s: of(|s| s.harness_write_s),
            worker_read_s: of(|s| s.worker_read_s),
            harness_write_whole_s: of(|s| s.harness_write_whole_s),
            worker_read_whole_s: of(|s| s.worker_read_whole_s),
        }
    }
}

#[derive(Serialize)]
struct Summary {
    cases: u64,
    seed: u64,
    table_entries: u64,
    summed: Steps,
    /// Each step's median over the cases.
    median: Steps,
    /// The case whose steps took longest, and its steps.
    slowest_case: u64,
    slowest: Steps,
    slowest_block_size: usize,
    slowest_table_entries: usize,
}

/// Runs the benchmark; prints one line per step (or JSON). Exit 0; a case that does not
/// read back as written is an error of ours (exit 3, naming the case).
pub fn run_host_bench(cases: u64, seed: u64, json: bool) -> Result<i32, Fatal> {
    let caps = crate::kernel::open("cpu:chunked")
        .map_err(|e| Fatal::environment(e.to_string()))?
        .capabilities()
        .clone();
    let mut region = SharedRegion::create("bench-host")
        .map_err(|e| Fatal::environment(format!("a shared region: {e}")))?;
    let mut summed = Steps::default();
    let mut all = Vec::with_capacity(cases.min(1 << 16) as usize);
    let mut slowest = (0u64, Steps::default(), 0usize, 0usize);
    let mut entries = 0u64;
    for k in 0..cases {
        let t0 = Instant::now();
        let draw = value_tree(
            &draw_strategy_scaled(Profile::Production, k, 1.0),
            case_seed(seed, k),
        )
        .current();
        let (recipe, _) = draw.resolve(&[&caps]);
        let case = recipe.materialize();
        let t1 = Instant::now();
        case.validate()
            .map_err(|e| Fatal::environment(format!("case {k}: {}: {}", e.field, e.message)))?;
        let t2 = Instant::now();
        // The table sent whole, then as its tail rule (the other order on odd cases).
        let whole = WorkerDraws {
            values: true,
            table_tails: false,
        };
        let order = if k % 2 == 0 {
            [whole, WorkerDraws::ALL]
        } else {
            [WorkerDraws::ALL, whole]
        };
        let mut timed = [(0.0, 0.0); 2];
        for draws in order {
            let t2 = Instant::now();
            let layout = protocol::region_layout(&case, draws, region.path().to_string());
            region.ensure(layout.bytes).map_err(|e| {
                Fatal::environment(format!("a shared region of {} B: {e}", layout.bytes))
            })?;
            let ints = WireInts::with(&case, draws);
            region.write(&layout, &protocol::wire_inputs(&case, &ints));
            let t3 = Instant::now();
            let mut req = RunRequest::new(k, &case, Transport::Shm(layout.clone()));
            req.kv_values = ints.drawn();
            req.block_table_tail = ints.table_tail();
            let mut src = ShmReader {
                region: &region,
                layout: &layout,
            };
            let back = protocol::read_inputs(&req, &mut src, "region")
                .map_err(|e| Fatal::environment(format!("case {k} read back: {e}")))?;
            let t4 = Instant::now();
            let same = back.block_table == case.block_table
                && back.q == case.q
                && back.weights == case.weights
                && back.kv.ids() == case.kv.ids();
            if !same {
                return Err(Fatal::environment(format!(
                    "case {k} (seed {seed:#x}) did not read back as written"
                )));
            }
            timed[usize::from(draws.table_tails)] =
                ((t3 - t2).as_secs_f64(), (t4 - t3).as_secs_f64());
        }
        let s = Steps {
            materialize_s: (t1 - t0).as_secs_f64(),
            validate_s: (t2 - t1).as_secs_f64(),
            harness_write_s: timed[1].0,
            worker_read_s: timed[1].1,
            harness_write_whole_s: timed[0].0,
            worker_read_whole_s: timed[0].1,
        };
        summed.add(&s);
        all.push(s);
        entries += case.block_table.len() as u64;
        if s.total() > slowest.1.total() {
            slowest = (k, s, case.shape.block_size, case.block_table.len());
        }
        if !json && (k + 1) % 10 == 0 && k + 1 < cases {
            eprintln!("mqa-fuzz: bench host: {}/{cases} cases", k + 1);
        }
    }
    let summary = Summary {
        cases,
        seed,
        table_entries: entries,
        summed,
        median: Steps::median(&all),
        slowest_case: slowest.0,
        slowest: slowest.1,
        slowest_block_size: slowest.2,
        slowest_table_entries: slowest.3,
    };
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(&summary).expect("serializes")
        );
        return Ok(0);
    }
    let n = cases.max(1) as f64;
    crate::outln!(
        "{cases} full-scale production cases (seed {seed:#x}), {entries} block-table entries in all"
    );
    let m = &summary.median;
    let line = |name: &str, step: fn(&Steps) -> f64| {
        crate::outln!(
            "  {name:<14} {:>8.3} s summed, {:>7.2} ms a case (median {:>6.2}), {:>7.1} ms on the slowest",
            step(&summed),
            step(&summed) / n * 1e3,
            step(m) * 1e3,
            step(&slowest.1) * 1e3
        )
    };
    line("materialize", |s| s.materialize_s);
    line("validate", |s| s.validate_s);
    line("harness write", |s| s.harness_write_s);
    line("worker read", |s| s.worker_read_s);
    crate::outln!("  the same with the block table sent whole (not as its tail rule):");
    line("harness write", |s| s.harness_write_whole_s);
    line("worker read", |s| s.worker_read_whole_s);
    crate::outln!(
        "  write + read, whole / as the tail rule: {:.2}x summed, {:.2}x on the slowest case",
        (summed.harness_write_whole_s + summed.worker_read_whole_s)
            / (summed.harness_write_s + summed.worker_read_s).max(1e-9),
        (slowest.1.harness_write_whole_s + slowest.1.worker_read_whole_s)
            / (slowest.1.harness_write_s + slowest.1.worker_read_s).max(1e-9)
    );
    crate::outln!(
        "slowest: case {} (block size {}, {} table entries)",
        slowest.0,
        slowest.2,
        slowest.3
    );
    Ok(0)
}
