//! Tests of the parent module, in a file of their own (the parent passed 700 lines).

use super::*;
use crate::case::ValueLayout;
use crate::fp8::Fp8Format;
use crate::generate::{Knobs, LensRecipe, OffsetClass, Padding, Recipe, TableOrder, ValueKind};

fn case() -> Case {
    Recipe {
        knobs: Knobs {
            next_n: 2,
            heads: 4,
            head_dim: 32,
            block_size: 16,
            format: Fp8Format::E4m3fnuz,
            model_len_slack: 3,
            out_stride_pad: 5,
            big_output: false,
            table_order: TableOrder::Permuted,
            padding: Padding::MinusOne,
            surplus_blocks: 1,
            table_stride_pad: 2,
            kv_stride_pad: 12,
            offsets: OffsetClass::Around2G,
            values: ValueKind::Pipeline,
            seed: 3,
        },
        layout: ValueLayout::Shuffle16,
        lens: LensRecipe::PerToken(vec![vec![20, 21], vec![0, 3]]),
    }
    .materialize()
}

#[test]
fn case_file_round_trips_through_a_request() {
    let c = case();
    let dir = tempfile::tempdir().unwrap();
    let (cp, op) = (
        dir.path().join("c.safetensors"),
        dir.path().join("o.safetensors"),
    );
    let mut out = OutputBuffer::for_case(&c);
    write_case_file(&cp, &c, &out).unwrap();
    let req = RunRequest::new(
        9,
        &c,
        Transport::Files {
            case: &cp,
            output: &op,
        },
    );
    let line = req.to_line();
    let back: RunRequest = serde_json::from_str(&line).unwrap();
    assert_eq!(back, req);
    let (c2, out2) = read_case_file(&back).unwrap();
    assert_eq!(c2, c);
    assert!(out2
        .raw()
        .0
        .iter()
        .all(|x| x.to_bits() == crate::kernel::POISON_BITS));
    // An output with a guard write survives the trip, so oob checks stay meaningful.
    let mut o3 = out2.clone();
    o3.raw_mut().0[1] = 5.0;
    o3.set(0, 0, 1.25);
    write_output(&op, &o3).unwrap();
    read_output(&op, &mut out).unwrap();
    assert_eq!(out.get(0, 0), 1.25);
    assert_eq!(out.out_of_bounds_writes(), vec![1]);
}

#[test]
fn a_worker_chooses_the_newest_offered_version() {
    assert_eq!(chosen_protocol(Some("1,2")), 2);
    assert_eq!(chosen_protocol(Some("1")), 1);
    assert_eq!(chosen_protocol(Some("2, 7")), 2);
    assert_eq!(chosen_protocol(None), 1, "an older mqa-fuzz offers nothing");
    assert_eq!(chosen_protocol(Some("")), 1);
}

#[test]
fn hello_version_skew_is_an_environment_error() {
    let all = &SUPPORTED_PROTOCOLS;
    let e = parse_hello(r#"{"type":"hello","protocol":3,"name":"x"}"#, all).unwrap_err();
    assert!(
        matches!(&e, RunError::Environment(m) if m.contains("protocol 3") && m.contains("[1, 2]")),
        "{e}"
    );
    // A version this build knows but did not offer (MQA_FUZZ_EXEC_PROTOCOL=1).
    let e = parse_hello(r#"{"type":"hello","protocol":2,"name":"x"}"#, &[1]).unwrap_err();
    assert!(
        matches!(&e, RunError::Environment(m) if m.contains("speaks protocol 1")),
        "{e}"
    );
    let e = parse_hello("garbage", all).unwrap_err();
    assert!(matches!(e, RunError::Crash(_)));
    let e = parse_hello(
        r#"{"type":"error","id":null,"kind":"environment","message":"no deep_gemm"}"#,
        all,
    )
    .unwrap_err();
    assert!(matches!(&e, RunError::Environment(m) if m.contains("no deep_gemm")));
    let caps = crate::kernel::Capabilities::everything(crate::case::ScalePlacement::AfterReluSum);
    let h = Hello {
        protocol: 1,
        name: "n".into(),
        library: "l".into(),
        version: "v".into(),
        device: "cpu".into(),
        capabilities: caps,
        compile_key: vec![CompileField::Heads, CompileField::Lens2d],
        draws_values: false,
        draws_table_tails: false,
        judges_on_device: false,
        warm_up_secs: Some(0.083),
    };
    let line = WorkerLine::Hello(Box::new(h.clone())).to_line();
    assert_eq!(parse_hello(&line, all).unwrap(), h);
    let e = parse_hello(r#"{"type":"hello","protocol":1,"name":"x","library":"l","version":"v","device":"d","capabilities":{}}"#, all).unwrap_err();
    assert!(
        matches!(&e, RunError::Environment(m) if m.contains("capabilities")),
        "{e}"
    );
}

/// The region's layout, sized from the case's dimensions, is the layout of the tensors
/// the harness writes, for stored blocks and for a drawn cache sent as its recipe, for
/// a table sent whole and one sent as each row's used entries and the padding rule.
#[test]
fn the_region_layout_fits_the_tensors_written() {
    let drawn = case();
    assert!(drawn.kv.drawn_values().is_some());
    assert!(drawn.block_table.tail.is_some());
    let mut stored = drawn.clone();
    let first = stored.kv.ids()[0];
    let b = stored.kv.get(first).unwrap().to_vec();
    stored.kv.insert(first, b);
    assert!(stored.kv.drawn_values().is_none());
    let values_only = WorkerDraws {
        values: true,
        table_tails: false,
    };
    let cases = [
        (&drawn, values_only),
        (&drawn, WorkerDraws::NONE),
        (&stored, values_only),
        (&drawn, WorkerDraws::ALL),
        (&stored, WorkerDraws::ALL),
    ];
    for (c, draws) in cases {
        let ints = WireInts::with(c, draws);
        assert_eq!(ints.table_tail().is_some(), draws.table_tails, "{draws:?}");
        let out = OutputBuffer::for_case(c);
        let written = ShmTensors::layout("p".into(), &wire_tensors(c, &ints, &out));
        let mut sized = region_layout(c, draws, "p".into());
        // `logits` comes first in the region, last in the wire's list: compare by name.
        assert_eq!(sized.tensors.len(), written.tensors.len(), "{draws:?}");
        for (name, t) in &written.tensors {
            let u = sized.tensors.remove(name).unwrap();
            assert_eq!(
                (&u.dtype, &u.shape, u.byte_len()),
                (&t.dtype, &t.shape, t.byte_len()),
                "{name}"
            );
        }
    }
}

/// `c`'s inputs as a worker drawing `draws` gets them from `ints` (each tensor list
/// passed through `edit`), written into a real shared region; the request, carrying
/// `tail` as its padding rule, through its JSON line; the case read back from the region.
fn read_through_region<'a>(
    c: &'a Case,
    draws: WorkerDraws,
    ints: &'a WireInts,
    tail: Option<TailRule>,
    edit: impl FnOnce(&mut Vec<(&'static str, Vec<usize>, Data<'a>)>),
) -> Result<Case, String> {
    use crate::kernel::exec::shm::{SharedRegion, ShmReader};
    let mut region = SharedRegion::create("mqa-fuzz-test").unwrap();
    let layout = region_layout(c, draws, region.path().to_string());
    region.ensure(layout.bytes).unwrap();
    let mut tensors = wire_inputs(c, ints);
    edit(&mut tensors);
    region.write(&layout, &tensors);
    let mut req = RunRequest::new(1, c, Transport::Shm(layout.clone()));
    req.kv_values = ints.drawn();
    req.block_table_tail = tail;
    let line = serde_json::to_string(&req).unwrap();
    let req: RunRequest = serde_json::from_str(&line).unwrap();
    let mut src = ShmReader {
        region: &region,
        layout: &layout,
    };
    read_inputs(&req, &mut src, "region")
}

/// A table sent as each row's used entries and the padding rule reads back as the same
/// table (compact on the worker, whole after `expand`), through a real shared region;
/// one whose entries were edited after generation travels whole.
#[test]
fn a_table_sent_as_its_tail_rule_reads_back_as_the_table() {
    let mut edited = case();
    edited.block_table.entries[edited.block_table.row_stride - 1] ^= 1;
    for (c, compact) in [(case(), true), (edited, false)] {
        let ints = WireInts::with(&c, WorkerDraws::ALL);
        assert_eq!(ints.table_tail().is_some(), compact);
        let mut back =
            read_through_region(&c, WorkerDraws::ALL, &ints, ints.table_tail(), |_| {}).unwrap();
        assert_eq!(back.block_table.is_compact(), compact);
        if compact {
            let held: usize = (0..c.shape.batch).map(|b| c.blocks_used(b)).sum();
            assert_eq!(back.block_table.entries.len(), held);
        }
        assert_eq!(back.block_table, c.block_table);
        back.block_table.expand();
        assert!(!back.block_table.is_compact());
        assert_eq!(back.block_table.entries, c.block_table.entries);
    }
}

/// A table generated compact (mostly padding) travels as its held entries and rule to a
/// worker that draws table tails, and whole (made whole here) to one that does not;
/// both read back as the same table.
#[test]
fn a_compact_table_travels_to_either_worker() {
    let c = Recipe::small(vec![40, 7], 1, 9)
        .with(|k| k.surplus_blocks = crate::generate::recipe::COMPACT_TABLE_PADDING / 2)
        .materialize();
    assert!(c.block_table.is_compact());
    for draws in [WorkerDraws::ALL, WorkerDraws::NONE] {
        let ints = WireInts::with(&c, draws);
        assert_eq!(ints.table_tail().is_some(), draws.table_tails);
        let back = read_through_region(&c, draws, &ints, ints.table_tail(), |_| {}).unwrap();
        assert_eq!(back.block_table.is_compact(), draws.table_tails);
        assert_eq!(back.block_table, c.block_table);
    }
}

/// A request whose `block_table_held` counts are negative, do not add up to the
/// `block_table` entries or are missing is refused with a message naming the tensor.
#[test]
fn bad_held_counts_are_refused_naming_the_tensor() {
    let c = case();
    let ints = WireInts::with(&c, WorkerDraws::ALL);
    let held: Vec<i32> = (0..c.shape.batch)
        .map(|b| c.blocks_used(b) as i32)
        .collect();
    let edits: [(&str, Vec<i32>); 3] = [
        ("negative", vec![-1; held.len()]),
        ("too many", held.iter().map(|h| h + 1).collect()),
        (
            "past the stride",
            vec![c.block_table.row_stride as i32 + 1; held.len()],
        ),
    ];
    for (what, bad) in &edits {
        let e = read_through_region(&c, WorkerDraws::ALL, &ints, ints.table_tail(), |tensors| {
            for t in tensors.iter_mut().filter(|t| t.0 == "block_table_held") {
                t.2 = Data::I32(bad);
            }
        })
        .unwrap_err();
        assert!(e.contains("block_table_held"), "{what}: {e}");
    }
    // A rule without the counts tensor (a layout for a whole-table worker).
    let whole = WireInts::with(&c, WorkerDraws::NONE);
    let e =
        read_through_region(&c, WorkerDraws::NONE, &whole, ints.table_tail(), |_| {}).unwrap_err();
    assert!(e.contains("block_table_held"), "{e}");
}
