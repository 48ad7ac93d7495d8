//! `--verify full|sample:<f>|boundaries`: what each mode selects, that the oracle judges
//! sampled references correctly, and that a planted error at a boundary is caught.

use mqa_fuzz::generate::recipe::{Padding, Recipe};
use mqa_fuzz::kernel::{self, OutputBuffer};
use mqa_fuzz::oracle::{self, Class, OracleConfig};
use mqa_fuzz::reference::{
    self, fraction_checked, verify::boundary_positions, PositionSet, RowSelection, VerifyMode,
};
use mqa_fuzz::{Case, ScalePlacement};

fn case(lens: Vec<usize>, next_n: usize, block_size: usize) -> Case {
    Recipe::small(lens, next_n, 42)
        .with(|k| {
            k.head_dim = 32;
            k.block_size = block_size;
            k.padding = Padding::Zero;
            k.table_stride_pad = 0;
            k.kv_stride_pad = 0;
        })
        .materialize()
}

#[test]
fn parses_modes_and_rejects_bad_ones() {
    assert_eq!("full".parse::<VerifyMode>(), Ok(VerifyMode::Full));
    assert_eq!(
        "boundaries".parse::<VerifyMode>(),
        Ok(VerifyMode::Boundaries)
    );
    assert_eq!(
        "sample:0.25".parse::<VerifyMode>(),
        Ok(VerifyMode::Sample(0.25))
    );
    for bad in ["sample:1.5", "sample:-0.1", "sample:x", "sample", "all", ""] {
        assert!(bad.parse::<VerifyMode>().is_err(), "{bad} accepted");
    }
    for m in [
        VerifyMode::Full,
        VerifyMode::Boundaries,
        VerifyMode::Sample(0.5),
    ] {
        assert_eq!(m.to_string().parse::<VerifyMode>(), Ok(m));
    }
}

#[test]
fn boundary_positions_cover_block_chunk_and_context_edges() {
    let p = boundary_positions(1000, 64);
    for t in [
        0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 767, 768, 769, 959, 960,
        961, 998, 999,
    ] {
        assert!(p.contains(&t), "{t} missing from {p:?}");
    }
    assert!(
        !p.contains(&1000),
        "positions outside V(r) are never listed"
    );
    assert!(!p.contains(&100));
    assert!(p.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
    // Tiny rows: whatever exists.
    assert_eq!(boundary_positions(1, 64), vec![0]);
    assert_eq!(boundary_positions(2, 64), vec![0, 1]);
    assert!(boundary_positions(0, 64).is_empty());
    // Block size 1: every position is a block edge.
    assert_eq!(boundary_positions(10, 1), (0..10).collect::<Vec<_>>());
}

#[test]
fn selections_and_fraction_checked() {
    let c = case(vec![700, 0, 300, 1], 2, 64);
    let full = reference::compute(
        &c,
        ScalePlacement::AfterReluSum,
        &VerifyMode::Full.selection(&c, 1),
    );
    assert_eq!(fraction_checked(&c, &full), 1.0);
    let sel = VerifyMode::Boundaries.selection(&c, 1);
    let RowSelection::Positions(map) = &sel else {
        panic!("boundaries must select positions")
    };
    for r in 0..c.rows() {
        let len = c.valid_len(r);
        match map.get(&r) {
            None => assert_eq!(len, 0, "row {r} with {len} valid positions left out"),
            Some(PositionSet::Some(p)) => assert_eq!(p, &boundary_positions(len, 64)),
            Some(PositionSet::All) => panic!("boundaries selected a whole row"),
        }
    }
    let bnd = reference::compute(&c, ScalePlacement::AfterReluSum, &sel);
    let f = fraction_checked(&c, &bnd);
    assert!(f > 0.0 && f < 0.2, "boundaries checked {f}");
    // The sparse values are the dense ones at those positions.
    for (r, row) in bnd.rows.iter().enumerate() {
        if let Some(row) = row {
            let dense = full.rows[r].as_ref().unwrap();
            for (t, v, m) in row.elements() {
                assert_eq!(v.to_bits(), dense.value[t].to_bits());
                assert_eq!(m.to_bits(), dense.relu_mag[t].to_bits());
            }
        }
    }
    // sample:1 is everything; sample:0.5 lies between boundaries and full, and is the
    // same for the same seed.
    let all = reference::compute(
        &c,
        ScalePlacement::AfterReluSum,
        &VerifyMode::Sample(1.0).selection(&c, 9),
    );
    assert_eq!(fraction_checked(&c, &all), 1.0);
    let big = case(vec![300; 64], 1, 16);
    let half = VerifyMode::Sample(0.5).selection(&big, 3);
    assert_eq!(half, VerifyMode::Sample(0.5).selection(&big, 3));
    let r = reference::compute(&big, ScalePlacement::AfterReluSum, &half);
    let f = fraction_checked(&big, &r);
    let fb = fraction_checked(
        &big,
        &reference::compute(
            &big,
            ScalePlacement::AfterReluSum,
            &VerifyMode::Boundaries.selection(&big, 3),
        ),
    );
    assert!(
        fb < f && f < 1.0 && (f - 0.5).abs() < 0.3,
        "sample:0.5 checked {f} (boundaries {fb})"
    );
}

/// Runs the correct CPU kernel, then corrupts one element of its output.
fn judged_with_error(c: &Case, mode: VerifyMode, r: usize, t: usize) -> oracle::Verdict {
    let k = kernel::open("cpu:chunked").unwrap();
    let caps = k.capabilities().clone();
    let mut out = OutputBuffer::for_case(c);
    let info = k.run(c, &mut out).expect("cpu:chunked runs");
    let x = out.get(r, t);
    out.set(r, t, x + 1.0 + x.abs());
    let reference = reference::compute(c, caps.scale_placement, &mode.selection(c, 5));
    oracle::judge(
        c,
        &reference,
        &caps,
        Ok((&info, &out)),
        &OracleConfig::default(),
    )
}

#[test]
fn planted_boundary_error_is_caught_in_boundaries_mode() {
    let c = case(vec![700, 300], 1, 64);
    let len = c.valid_len(0);
    // A block edge, a chunk edge, the last valid position.
    for t in [64, 256, 257, len - 1] {
        let v = judged_with_error(&c, VerifyMode::Boundaries, 0, t);
        assert_eq!(
            v.classes.get(&Class::Mismatch),
            Some(&1),
            "error at {t} not caught: {:?}",
            v.classes
        );
        assert_eq!(v.examples[0].pos, Some(t));
        assert_eq!(v.examples[0].row, Some(0));
    }
    // An interior position is outside what boundaries mode checks, but full mode sees it.
    let v = judged_with_error(&c, VerifyMode::Boundaries, 0, 100);
    assert!(
        v.is_clean(),
        "boundaries mode judged position 100: {:?}",
        v.classes
    );
    let v = judged_with_error(&c, VerifyMode::Full, 0, 100);
    assert_eq!(v.classes.get(&Class::Mismatch), Some(&1));
    // The clean run checks exactly the boundary elements.
    let v = judged_with_error(&c, VerifyMode::Boundaries, 1, 100);
    let expected: usize = (0..c.rows())
        .map(|r| boundary_positions(c.valid_len(r), 64).len())
        .sum();
    assert_eq!(v.metrics.checked as usize, expected);
}

/// A NaN between boundaries is still a finding in boundaries mode (the guard verdict
/// would call it needed; the verdict must not be clean).
#[test]
fn nan_between_boundaries_is_caught_in_boundaries_mode() {
    let c = case(vec![700, 300], 1, 64);
    let k = kernel::open("cpu:chunked").unwrap();
    let caps = k.capabilities().clone();
    let mut out = OutputBuffer::for_case(&c);
    let info = k.run(&c, &mut out).unwrap();
    out.set(0, 100, f32::NAN);
    let reference = reference::compute(
        &c,
        caps.scale_placement,
        &VerifyMode::Boundaries.selection(&c, 0),
    );
    let v = oracle::judge(
        &c,
        &reference,
        &caps,
        Ok((&info, &out)),
        &OracleConfig::default(),
    );
    assert_eq!(v.classes.get(&Class::Nan), Some(&1), "{:?}", v.classes);
    assert_eq!((v.examples[0].row, v.examples[0].pos), (Some(0), Some(100)));
    assert!(!v.guard.redundant);
}

#[test]
fn planted_tail_bug_is_caught_in_boundaries_mode() {
    // cpu:chunked with its tail chunk unwritten: the last valid positions are poison.
    let c = case(vec![700, 300], 1, 64);
    let k = kernel::open("cpu:bug-tail-unwritten").unwrap();
    let caps = k.capabilities().clone();
    let mut out = OutputBuffer::for_case(&c);
    let info = k.run(&c, &mut out).unwrap();
    let reference = reference::compute(
        &c,
        caps.scale_placement,
        &VerifyMode::Boundaries.selection(&c, 0),
    );
    let v = oracle::judge(
        &c,
        &reference,
        &caps,
        Ok((&info, &out)),
        &OracleConfig::default(),
    );
    assert!(v.classes.contains_key(&Class::Unwritten), "{:?}", v.classes);
}
