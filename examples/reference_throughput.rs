//! Throughput of the exact reference (and of `cpu:chunked`, for comparison) on one
//! production-like decode case: B=8, next_n=2, H=64, D=128, block size 64, context
//! lengths around 4096, pipeline-quantized values. 2·H·D flops per logit.
//!
//! Run: `cargo run --release --example reference_throughput [-- REPS]`

use mqa_fuzz::case::ScalePlacement;
use mqa_fuzz::generate::Recipe;
use mqa_fuzz::kernel::{self, OutputBuffer};
use mqa_fuzz::reference::{self, RowSelection};
use std::time::{Duration, Instant};

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let lens: Vec<usize> = (0..8).map(|b| 4096 - 61 * b + 17 * (b % 3)).collect();
    let recipe = Recipe::production(lens.clone(), 2, 1);
    let t = Instant::now();
    let case = recipe.materialize();
    println!("materialized in {:.3} s", t.elapsed().as_secs_f64());
    case.validate().expect("valid case");
    let s = &case.shape;
    let logits = case.valid_elements();
    let flops = 2.0 * (s.heads * s.head_dim) as f64 * logits as f64;
    println!(
        "case: B={} N={} H={} D={} block_size={} context_lens={:?} -> {} logits, {:.3} GFLOP per pass",
        s.batch, s.next_n, s.heads, s.head_dim, s.block_size, lens, logits, flops / 1e9
    );
    println!("threads: {}", rayon::current_num_threads());
    let report = |what: &str, times: &mut Vec<Duration>| {
        times.sort();
        let best = times[0].as_secs_f64();
        let median = times[times.len() / 2].as_secs_f64();
        println!(
            "{what}: best {:.3} s, median {:.3} s over {} reps -> {:.3e} logits/s, {:.2} GFLOP/s (best)",
            best,
            median,
            times.len(),
            logits as f64 / best,
            flops / best / 1e9
        );
    };
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let r = reference::compute(&case, ScalePlacement::AfterReluSum, &RowSelection::All);
        times.push(t.elapsed());
        std::hint::black_box(r);
    }
    report("reference::compute (exact f64)", &mut times);
    let k = kernel::open("cpu:chunked").unwrap();
    let mut out = OutputBuffer::for_case(&case);
    let mut times = Vec::new();
    for _ in 0..reps {
        out.repoison();
        let t = Instant::now();
        k.run(&case, &mut out).expect("runs");
        times.push(t.elapsed());
    }
    report("cpu:chunked (f32)", &mut times);
}
