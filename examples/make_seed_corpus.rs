//! Writes the hand-made seed corpus (`corpus/seed-*.json`): one small case per edge of
//! DESIGN §3 that a kernel must get right, each with a note saying which edge. The
//! files are deterministic (no timestamps), so re-running this reproduces them byte for
//! byte; every case must replay clean on `cpu:chunked` (tests/cli.rs checks that).
//!
//! Run: `cargo run --example make_seed_corpus [-- OUT_DIR]` (default `corpus`).

use mqa_fuzz::case::{save_case_file, CaseFile, Provenance, ValueLayout};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::{Knobs, LensRecipe, OffsetClass, Padding, Recipe, TableOrder, ValueKind};
use std::path::PathBuf;

fn base(lens: Vec<usize>, next_n: usize, seed: u64) -> Recipe {
    Recipe {
        knobs: Knobs {
            heads: 4,
            head_dim: 32,
            block_size: 16,
            model_len_slack: 3,
            table_order: TableOrder::Sequential,
            ..Knobs::production(next_n, seed)
        },
        layout: ValueLayout::Normal,
        lens: LensRecipe::PerSequence(lens),
    }
}

fn seeds() -> Vec<(&'static str, &'static str, Recipe)> {
    let mut v = Vec::new();

    let r = base(vec![0, 37, 0, 300, 0], 2, 1);
    v.push(("zero-length-rows", "context length 0 in the leading, a middle and the trailing sequence (their rows have empty V(r)), next to a 300-token sequence whose last chunk is partial", r));

    let mut r = base(vec![256, 100], 1, 2);
    r.knobs.model_len_slack = 0;
    r.knobs.out_stride_pad = 0;
    v.push(("ctx-equals-max-model-len", "ctx == max_model_len == 256 == one full chunk, output row stride == max_model_len: any store past the row lands in the next row", r));

    let r = base(vec![2, 1, 0, 3, 40], 3, 3);
    v.push(("mtp3-ctx-below-next-n", "next_n = 3 with context lengths 2, 1, 0 < next_n and 3 == next_n: early rows of those sequences have empty V(r), the last rows do not", r));

    let mut r = base(vec![48, 17], 2, 4);
    r.layout = ValueLayout::Shuffle16;
    r.knobs.head_dim = 64;
    v.push(("shuffle16-bs16", "AMD preshuffle value layout with block size 16 and head_dim 64 (16x16 tiles), partial last block", r));

    let mut r = base(vec![70, 33], 1, 5);
    r.knobs.format = Fp8Format::E4m3fnuz;
    r.knobs.values = ValueKind::Extreme;
    v.push(("e4m3fnuz-extreme", "e4m3fnuz (MI300: bias 8, max 240, NaN only 0x80) with extreme codes: +-max, subnormals, zeros", r));

    let mut r = base(vec![], 2, 6);
    r.lens = LensRecipe::PerToken(vec![vec![20, 5], vec![0, 33], vec![17, 17]]);
    v.push(("lens-2d", "2-D per-token context lengths [B, N], not causal (a kernel that reads one length per sequence gets them wrong)", r));

    let mut r = base(vec![40, 25], 1, 7);
    r.knobs.offsets = OffsetClass::Around4G;
    r.knobs.kv_stride_pad = 148; // 16*(32+4) + 148 = 724 bytes, not a power of two
    v.push(("block-offsets-past-4g", "block ids whose byte offset id*kv_block_stride straddles 2^32 with a padded stride (not a power of two): the device cache is over 4 GiB, the file holds only the referenced blocks", r));

    let mut r = base(vec![5, 1, 9], 2, 8);
    r.knobs.block_size = 1;
    r.knobs.table_order = TableOrder::Reversed;
    v.push((
        "block-size-1",
        "block size 1: one table entry per token, blocks allocated top-down",
        r,
    ));

    let mut r = base(vec![33, 70, 16], 1, 9);
    r.knobs.table_order = TableOrder::Permuted;
    r.knobs.padding = Padding::MinusOne;
    r.knobs.surplus_blocks = 2;
    r.knobs.table_stride_pad = 3;
    r.knobs.out_stride_pad = 5;
    v.push(("permuted-table-minus-one-padding", "permuted block table padded with -1 (past the used blocks and in the row-stride padding), max_blocks larger than needed, padded output rows", r));

    let r = base(vec![0; 32], 1, 10);
    v.push(("all-zero-batch-32", "every context length 0 with batch 32 (a multiple of 32): nothing to compute, nothing may be written out of bounds", r));

    v
}

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    for (name, note, recipe) in seeds() {
        let case = recipe.materialize();
        if let Err(e) = case.validate() {
            eprintln!("{name}: invalid case: {e}");
            std::process::exit(1);
        }
        let file = CaseFile {
            provenance: Provenance {
                tool_version: env!("CARGO_PKG_VERSION").into(),
                kernel: "hand-made".into(),
                seed: Some(recipe.knobs.seed),
                note: Some(note.into()),
                recipe: Some(serde_json::to_value(&recipe).expect("recipe serializes")),
                ..Default::default()
            },
            expected: Default::default(),
            case,
        };
        let path = out.join(format!("seed-{name}.json"));
        if let Err(e) = save_case_file(&path, &file) {
            eprintln!("{}: {e}", path.display());
            std::process::exit(1);
        }
        println!("{}", path.display());
    }
}
