//! `gpu-selfcheck`'s check of the device generator: `kernels/generate.cu` against the
//! CPU materialiser's `generate::values`, byte for byte.

use super::gpu::line;
use crate::case::ValueLayout;
use crate::fp8::Fp8Format;
use crate::generate::recipe::rng_for;
use crate::generate::ValueKind;
use crate::kernel::cuda::device::with_gpu;
use rand::RngExt;
use std::time::Instant;

/// The device generator (kernels/generate.cu) against the CPU's `generate::values` on
/// `cases` random shapes (both formats and layouts, D 16..128, H 1..64, block sizes 1
/// to 64) and value seeds: every query code, weight bit and block byte must agree.
/// Returns the number of shapes that did not.
pub fn identity(cases: usize) -> usize {
    use crate::generate::philox::{Stream, BLOCK_STREAM};
    use crate::generate::values::Values;
    let (mut failures, mut bytes) = (0, 0u64);
    let start = Instant::now();
    let mut rng = rng_for(0x6E4E);
    for k in 0..cases {
        let layout = if rng.random_bool(0.3) {
            ValueLayout::Shuffle16
        } else {
            ValueLayout::Normal
        };
        let block_size = match layout {
            ValueLayout::Shuffle16 => [16, 32, 64][rng.random_range(0..3)],
            ValueLayout::Normal => [1, 2, 5, 16, 64][rng.random_range(0..5)],
        };
        let shape = crate::case::Shape {
            batch: rng.random_range(1..=6),
            next_n: rng.random_range(1..=3),
            heads: rng.random_range(1..=64),
            head_dim: 16 * rng.random_range(1..=8),
            block_size,
            layout,
            format: Fp8Format::ALL[rng.random_range(0..2)],
        };
        let seed: u64 = rng.random();
        let n_blocks = rng.random_range(1..=40);
        let device = with_gpu(|gpu| {
            let rows = crate::kernel::cuda::generate::pipeline_rows(gpu, &shape, seed)?;
            let blocks =
                crate::kernel::cuda::generate::pipeline_blocks(gpu, &shape, seed, n_blocks)?;
            Ok((rows, blocks))
        });
        let ((dq, dw), db) = match device {
            Ok(x) => x,
            Err(e) => {
                failures += 1;
                line(format!("  FAIL device generator, shape {k}: {e:?}"));
                continue;
            }
        };
        let (mut q, mut w, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..shape.rows() {
            let (codes, weights) = Values::draw_row(
                &shape,
                ValueKind::Pipeline,
                &mut Stream::new(seed, r as u64),
            );
            q.extend(codes);
            w.extend(weights.iter().map(|x| x.to_bits()));
        }
        for i in 0..n_blocks as u64 {
            b.extend(Values::draw_block(
                &shape,
                ValueKind::Pipeline,
                &mut Stream::new(seed, BLOCK_STREAM | i),
            ));
        }
        let dw: Vec<u32> = dw.iter().map(|x| x.to_bits()).collect();
        let first = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
        let bad = if q != dq {
            Some(format!("query code {:?}", first(&q, &dq)))
        } else if w != dw {
            Some(format!(
                "weight {:?}",
                w.iter().zip(&dw).position(|(x, y)| x != y)
            ))
        } else if b != db {
            Some(format!("block byte {:?}", first(&b, &db)))
        } else {
            None
        };
        bytes += (q.len() + 4 * w.len() + b.len()) as u64;
        if let Some(what) = bad {
            failures += 1;
            line(format!("  FAIL device generator differs from the CPU at the first {what}, shape {k}: {shape:?}, seed {seed:#x}"));
        }
    }
    line(format!(
        "device generator: {}/{cases} random shapes byte-identical to the CPU materialiser ({bytes} bytes compared), {:.1}s",
        cases - failures,
        start.elapsed().as_secs_f64()
    ));
    failures
}

/// Block tables made whole on the device from each row's used entries and padding rule
/// (`kernels/generate.cu`'s `table_tail`, what a worker does with a request's
/// `block_table_tail`) against the generator's tables, entry for entry: `cases` random
/// recipes, every padding kind, pool layouts at block size 1 among them. Returns the
/// number that differ.
pub fn table_tails(cases: usize) -> usize {
    use crate::case::BlockTable;
    use crate::generate::{OffsetClass, Padding, PoolRecipe, Recipe};
    let start = Instant::now();
    let mut rng = rng_for(0x7A11);
    let (mut failures, mut entries) = (0, 0u64);
    for k in 0..cases {
        let padding = [
            Padding::Zero,
            Padding::MinusOne,
            Padding::Huge,
            Padding::Garbage,
            Padding::Stale,
        ][k % 5];
        let lens: Vec<usize> = (0..rng.random_range(1..=8))
            .map(|_| rng.random_range(0..=3000))
            .collect();
        let seed: u64 = rng.random();
        let pool = rng.random_bool(0.5);
        let recipe = Recipe::small(lens, rng.random_range(1..=2), seed).with(|kn| {
            kn.padding = padding;
            kn.surplus_blocks = rng.random_range(1..=100_000);
            if pool {
                kn.block_size = 1;
                kn.offsets = OffsetClass::Pool(PoolRecipe {
                    blocks: 100_000,
                    stride: 132,
                    churn: 256,
                    occupancy_pct: 70,
                    request_blocks: 500,
                    rows_per_request: 1,
                });
            }
        });
        let case = recipe.materialize();
        let t = &case.block_table;
        let compact = t.tail.as_ref().filter(|_| t.tail_holds()).and_then(|tail| {
            let held = t.held_entries()?;
            BlockTable::compact(
                t.max_blocks,
                t.row_stride,
                held,
                tail.rule,
                tail.held.clone(),
            )
        });
        let Some(compact) = compact else {
            failures += 1;
            line(format!(
                "  FAIL table {k}: the generator's table has no tail that holds"
            ));
            continue;
        };
        let device = with_gpu(|gpu| {
            let mem = crate::kernel::cuda::generate::whole_table(gpu, &compact)?;
            let mut host = vec![0i32; t.entries.len()];
            mem.download(0, &mut host)
                .map_err(crate::kernel::cuda::device::GpuFailure::Environment)?;
            Ok(host)
        });
        entries += t.entries.len() as u64;
        match device {
            Err(e) => {
                failures += 1;
                line(format!("  FAIL table {k}: {e:?}"));
            }
            Ok(d) if d != t.entries => {
                failures += 1;
                let at = d.iter().zip(&t.entries).position(|(x, y)| x != y);
                line(format!(
                    "  FAIL table {k} ({padding:?}) differs at entry {at:?}"
                ));
            }
            Ok(_) => {}
        }
    }
    line(format!(
        "table tails: {}/{cases} block tables made whole on the device equal the generator's ({entries} entries), {:.1}s",
        cases - failures,
        start.elapsed().as_secs_f64()
    ));
    failures
}
