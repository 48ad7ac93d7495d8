//! A generated block table's padding is its tail rule's (`BlockTable::tail`), the rule a
//! transport sends instead of the entries: every entry from the tail's column on, in
//! every padding kind and layout, must be the rule's entry of its index, or a worker
//! would run the kernel on another table than the one the harness judges.

use mqa_fuzz::case::{BlockTable, TailRule};
use mqa_fuzz::generate::{OffsetClass, Padding, PoolRecipe, Recipe};

const PADDINGS: [Padding; 5] = [
    Padding::Zero,
    Padding::MinusOne,
    Padding::Huge,
    Padding::Garbage,
    Padding::Stale,
];

/// A plain restatement of the hash rule, apart from `TailRule::entry`.
fn hashed(key: u64, lo: u64, span: u64, index: u64) -> i32 {
    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let v = lo as u128 + (mix(key ^ mix(index)) % span) as u128;
    v.min(i32::MAX as u128) as i32
}

fn recipes() -> Vec<Recipe> {
    let pool = PoolRecipe {
        blocks: 5000,
        stride: 64 * 132,
        churn: 64,
        occupancy_pct: 80,
        request_blocks: 40,
        rows_per_request: 2,
    };
    let mut v = Vec::new();
    for (i, padding) in PADDINGS.into_iter().enumerate() {
        for seed in 0..3u64 {
            let s = 10 * seed + i as u64;
            v.push(Recipe::small(vec![70, 3, 0, 200], 2, s).with(|k| {
                k.padding = padding;
                k.surplus_blocks = 9;
                k.table_stride_pad = 5;
            }));
            v.push(Recipe::small(vec![900, 17, 333], 1, s).with(|k| {
                k.padding = padding;
                k.block_size = 1;
                k.offsets = OffsetClass::Pool(pool);
                k.surplus_blocks = 40;
            }));
        }
    }
    v
}

#[test]
fn every_entry_past_a_generated_tables_tail_is_its_rules() {
    for r in recipes() {
        let c = r.materialize();
        let t = &c.block_table;
        let tail = t.tail.as_ref().expect("a generated table has a tail");
        let used: Vec<usize> = (0..c.shape.batch).map(|b| c.blocks_used(b)).collect();
        assert_eq!(tail.held, used, "{r:?}");
        for (b, &u) in used.iter().enumerate() {
            for j in u..t.row_stride {
                let i = (b * t.row_stride + j) as u64;
                let want = match tail.rule {
                    TailRule::Fill(v) => v,
                    TailRule::Hash { key, lo, span } => hashed(key, lo, span, i),
                };
                assert_eq!(t.entries[i as usize], want, "[{b}][{j}] {r:?}");
                assert_eq!(tail.rule.entry(i), want);
            }
        }
        assert!(t.tail_holds());
    }
}

#[test]
fn a_compact_table_reads_and_expands_as_the_whole_one() {
    for r in recipes() {
        let c = r.materialize();
        let t = &c.block_table;
        let tail = t.tail.clone().unwrap();
        let held = t.held_entries().unwrap();
        assert_eq!(held.len(), tail.held.iter().sum::<usize>());
        let mut compact =
            BlockTable::compact(t.max_blocks, t.row_stride, held, tail.rule, tail.held).unwrap();
        assert!(compact.is_compact());
        assert_eq!(compact.rows(), c.shape.batch);
        for b in 0..c.shape.batch {
            for j in 0..t.row_stride {
                assert_eq!(compact.get(b, j), t.get(b, j), "[{b}][{j}]");
            }
        }
        assert_eq!(&compact, t);
        let mut worker = c.clone();
        worker.block_table = compact.clone();
        worker.validate().unwrap();
        compact.expand();
        assert!(!compact.is_compact());
        assert_eq!(compact.entries, t.entries);
    }
}

/// Counts that do not add up to the entries, or pass the stride, make no table.
#[test]
fn a_compact_table_refuses_counts_that_do_not_fit() {
    let rule = TailRule::Fill(0);
    assert!(BlockTable::compact(4, 4, vec![1, 2, 3], rule, vec![2, 2]).is_none());
    assert!(BlockTable::compact(4, 4, vec![1; 5], rule, vec![5, 0]).is_none());
    let t = BlockTable::compact(4, 4, vec![1, 2, 3], rule, vec![2, 0, 1]).unwrap();
    assert_eq!(t.rows(), 3);
    assert_eq!(
        (t.get(0, 1), t.get(0, 2), t.get(1, 0), t.get(2, 0)),
        (2, 0, 0, 3)
    );
}

/// The big-output hazard prepends whole rows of another index stream: no tail rule.
#[test]
fn a_big_output_table_has_no_tail() {
    let c = Recipe::small(vec![5], 1, 1)
        .with(|k| k.big_output = true)
        .materialize();
    assert!(c.block_table.tail.is_none());
    assert!(!c.block_table.tail_holds());
}

/// A table that is mostly padding past `COMPACT_TABLE_PADDING` is generated compact:
/// each row's used entries and the rule, never the padding itself.
#[test]
fn a_huge_padded_table_is_generated_compact() {
    use mqa_fuzz::generate::recipe::COMPACT_TABLE_PADDING;
    for padding in PADDINGS {
        let c = Recipe::small(vec![70, 0, 33], 1, 5)
            .with(|k| {
                k.padding = padding;
                k.surplus_blocks = COMPACT_TABLE_PADDING / 3 + 1;
            })
            .materialize();
        let t = &c.block_table;
        assert!(t.is_compact(), "{padding:?}");
        let used: Vec<usize> = (0..c.shape.batch).map(|b| c.blocks_used(b)).collect();
        assert_eq!(t.entries.len(), used.iter().sum::<usize>());
        assert_eq!(t.rows(), c.shape.batch);
        assert_eq!(t.len(), c.shape.batch * t.row_stride);
        let rule = t.tail.as_ref().unwrap().rule;
        for (b, &u) in used.iter().enumerate() {
            for j in 0..u {
                assert!(c.kv.contains(t.get(b, j) as u64));
            }
            for j in [u, u + 1, t.row_stride / 2, t.row_stride - 1] {
                let i = (b * t.row_stride + j) as u64;
                assert_eq!(t.get(b, j), rule.entry(i) as i64, "[{b}][{j}]");
            }
        }
        c.validate().unwrap();
    }
}
