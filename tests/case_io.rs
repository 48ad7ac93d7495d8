//! Corpus files (JSON + safetensors) round-trip bit-exactly, and every precondition
//! of the case model fails with an error naming the field, the value and the limit.

mod support;

use mqa_fuzz::case::{
    load_case_file, save_case_file, Case, CaseFile, ContextLens, Provenance, ValueLayout,
};
use mqa_fuzz::fp8::Fp8Format;
use mqa_fuzz::generate::{LensRecipe, OffsetClass, ValueKind};
use std::path::Path;
use support::recipe;

/// Everything but the weights compared with `==`, the weights bit for bit (NaN != NaN).
fn assert_bit_exact(a: &Case, b: &Case) {
    let bits = |c: &Case| c.weights.iter().map(|w| w.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(a), bits(b), "weights");
    let (mut a, mut b) = (a.clone(), b.clone());
    a.weights.clear();
    b.weights.clear();
    assert_eq!(a, b);
}

fn provenance(note: &str) -> Provenance {
    Provenance {
        kernel: "hand-made".into(),
        note: Some(note.into()),
        seed: Some(42),
        ..Default::default()
    }
}

/// Non-finite, signed-zero, subnormal and extreme f32s, NaNs with payloads and sign.
const ODD_WEIGHTS: [u32; 12] = [
    0x7FC0_0001, // quiet NaN, payload 1
    0xFFC0_1234, // negative quiet NaN with payload
    0x7F80_0001, // signalling NaN
    0x7FC0_FFEE, // the output poison pattern
    0x8000_0000, // -0.0
    0x7F80_0000, // +inf
    0xFF80_0000, // -inf
    0x0000_0001, // smallest subnormal
    0x7F7F_FFFF, // f32::MAX
    0x0080_0000, // f32::MIN_POSITIVE
    0x3DCC_CCCD, // 0.1f32
    0xBEAA_AAAB, // -1/3
];

fn with_odd_weights(mut c: Case) -> Case {
    for (w, bits) in c.weights.iter_mut().zip(ODD_WEIGHTS.iter().cycle()) {
        *w = f32::from_bits(*bits);
    }
    c
}

#[test]
fn inline_round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = recipe(vec![17, 0, 5], 2);
    r.knobs.values = ValueKind::Hostile;
    let case = with_odd_weights(r.materialize());
    let file = CaseFile {
        provenance: provenance("inline"),
        expected: Default::default(),
        case,
    };
    let path = dir.path().join("inline.json");
    save_case_file(&path, &file).unwrap();
    assert!(
        !dir.path().join("inline.safetensors").exists(),
        "small tensors stay inline"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"inline\"") && text.contains("0x7fc00001") && text.contains("\"-inf\"")
    );
    let back = load_case_file(&path).unwrap();
    assert_bit_exact(&file.case, &back.case);
    assert_eq!(back.provenance, file.provenance);
    // Saving what was loaded gives the same bytes.
    let path2 = dir.path().join("again.json");
    save_case_file(&path2, &back).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        std::fs::read(&path2).unwrap()
    );
}

#[test]
fn inline_round_trip_2d_lens_shuffle16_fnuz_sparse_4g() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = recipe(vec![], 3);
    r.lens = LensRecipe::PerToken(vec![vec![0, 33, 2], vec![64, 1, 0]]);
    r.layout = ValueLayout::Shuffle16;
    r.knobs.block_size = 16;
    r.knobs.format = Fp8Format::E4m3fnuz;
    r.knobs.offsets = OffsetClass::Around4G;
    r.knobs.kv_stride_pad = 4000;
    let case = r.materialize();
    assert!(case.kv_cache_bytes() > 1 << 32);
    let file = CaseFile {
        provenance: provenance("4g"),
        expected: Default::default(),
        case,
    };
    let path = dir.path().join("c.json");
    save_case_file(&path, &file).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < 64 * 1024);
    assert_bit_exact(&file.case, &load_case_file(&path).unwrap().case);
}

/// A case whose tensors exceed the inline limit.
fn large_case() -> Case {
    let mut r = recipe(vec![300, 129], 2);
    r.knobs.heads = 64;
    r.knobs.head_dim = 128;
    r.knobs.block_size = 64;
    with_odd_weights(r.materialize())
}

#[test]
fn safetensors_round_trip_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let case = large_case();
    let file = CaseFile {
        provenance: provenance("large"),
        expected: Default::default(),
        case,
    };
    let path = dir.path().join("large.json");
    save_case_file(&path, &file).unwrap();
    let st = dir.path().join("large.safetensors");
    assert!(
        st.exists(),
        "large tensors go to a sibling safetensors file"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"safetensors\": \"large.safetensors\""),
        "{}",
        &text[..text.len().min(2000)]
    );
    let back = load_case_file(&path).unwrap();
    assert_bit_exact(&file.case, &back.case);
    python_reads_safetensors(&st, &file.case);
}

/// An engine-sized block table (block size 1: one entry per token) goes to the
/// safetensors sibling, not into the JSON, and comes back entry for entry; a JSON that
/// lacks the entries without a tensor file to hold them is an error naming the field.
#[test]
fn a_large_block_table_lives_in_the_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = recipe(vec![70_000, 3], 1);
    r.knobs.block_size = 1;
    r.knobs.heads = 1;
    r.knobs.head_dim = 16;
    let case = r.materialize();
    assert!(case.block_table.entries.len() > mqa_fuzz::case::TABLE_INLINE_MAX);
    let file = CaseFile {
        provenance: provenance("big table"),
        expected: Default::default(),
        case,
    };
    let path = dir.path().join("t.json");
    save_case_file(&path, &file).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.len() < 64 * 1024,
        "the JSON holds no table entries: {} bytes",
        text.len()
    );
    assert!(
        !text.contains("\"entries\""),
        "{}",
        &text[..text.len().min(2000)]
    );
    let back = load_case_file(&path).unwrap();
    assert_bit_exact(&file.case, &back.case);
    python_reads_safetensors(&dir.path().join("t.safetensors"), &file.case);
    // The same JSON with its tensors inline instead: the table is nowhere.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["case"]["tensors"] = serde_json::json!({"inline": {"q": "", "weights": [], "kv_blocks": {}}});
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = load_case_file(&bad).unwrap_err().to_string();
    assert!(e.contains("case.block_table.entries"), "{e}");
}

/// Loads the file with Python's `safetensors` + numpy and checks names, dtypes, shapes
/// and a checksum. Skips (with a message) when they are not installed; CI installs them.
fn python_reads_safetensors(path: &Path, c: &Case) {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import safetensors, numpy"])
        .output();
    if !matches!(&probe, Ok(o) if o.status.success()) {
        eprintln!("SKIP python check: python3 with safetensors and numpy is not available (pip install numpy safetensors)");
        return;
    }
    let script = r#"
import sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
for k in sorted(t):
    v = t[k]
    print(k, v.dtype, list(v.shape), int(v.view('uint8').astype('uint64').sum()))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = &c.shape;
    let sum = |b: &[u8]| b.iter().map(|&x| x as u64).sum::<u64>();
    let w: Vec<u8> = c.weights.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ids: Vec<u8> =
        c.kv.ids()
            .into_iter()
            .flat_map(|i| (i as i64).to_le_bytes())
            .collect();
    let blocks: Vec<u8> = c.kv.iter().flat_map(|(_, b)| b).copied().collect();
    let table: Vec<u8> = c
        .block_table
        .entries
        .iter()
        .flat_map(|&e| i64::from(e).to_le_bytes())
        .collect();
    let table_line = if c.block_table.entries.len() > mqa_fuzz::case::TABLE_INLINE_MAX {
        format!(
            "block_table int64 [{}, {}] {}\n",
            s.batch,
            c.block_table.row_stride,
            sum(&table)
        )
    } else {
        String::new()
    };
    let want = table_line
        + &format!(
        "kv_block_ids int64 [{n}] {}\nkv_blocks uint8 [{n}, {}] {}\nq uint8 [{}, {}, {}, {}] {}\nweights float32 [{}, {}] {}\n",
        sum(&ids),
        s.block_bytes(),
        sum(&blocks),
        s.batch,
        s.next_n,
        s.heads,
        s.head_dim,
        sum(&c.q),
        s.rows(),
        s.heads,
        sum(&w),
        n = c.kv.len(),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

// ---- validation ------------------------------------------------------------------

fn base() -> Case {
    let c = recipe(vec![40, 0, 17], 2).materialize();
    c.validate().unwrap();
    c
}

/// Asserts the edit breaks validation with an error on `field` whose message holds
/// every string of `mentions` (the value and the limit).
fn rejects(edit: impl FnOnce(&mut Case), field: &str, mentions: &[&str]) {
    let mut c = base();
    edit(&mut c);
    let e = c.validate().expect_err(field);
    assert_eq!(e.field, field, "{e}");
    for m in mentions {
        assert!(e.message.contains(m), "{e} should mention {m:?}");
    }
}

#[test]
fn validation_errors_name_field_value_and_limit() {
    rejects(
        |c| c.context_lens = ContextLens::PerSequence(vec![40, 0, 46]),
        "context_lens[2]",
        &["46", "max_model_len", "45"],
    );
    rejects(
        |c| c.context_lens = ContextLens::PerSequence(vec![40, -1, 17]),
        "context_lens[1]",
        &["-1"],
    );
    rejects(
        |c| c.context_lens = ContextLens::PerSequence(vec![40, 0]),
        "context_lens",
        &["2", "3"],
    );
    rejects(
        |c| c.context_lens = ContextLens::PerToken(vec![vec![1, 2], vec![0, 99], vec![0, 0]]),
        "context_lens[1][1]",
        &["99", "45"],
    );
    rejects(
        |c| c.context_lens = ContextLens::PerToken(vec![vec![1], vec![0, 0], vec![0, 0]]),
        "context_lens[0]",
        &["1", "next_n is 2"],
    );
    // 40 tokens in blocks of 16 need 3 table columns.
    rejects(
        |c| c.block_table.max_blocks = 2,
        "context_lens[0]",
        &["40", "3 blocks", "max_blocks is 2"],
    );
    rejects(
        |c| c.block_table.entries[0] = c.num_blocks as i32,
        "block_table.entries[0][0]",
        &["outside 0..num_blocks"],
    );
    rejects(
        |c| c.block_table.entries[1] = -1,
        "block_table.entries[0][1]",
        &["-1", "num_blocks"],
    );
    rejects(
        |c| {
            let id = c.block_table.entries[0] as u64;
            c.kv.remove(id);
        },
        "block_table.entries[0][0]",
        &["not stored"],
    );
    rejects(
        |c| c.kv_block_stride = c.shape.block_bytes() as u64 - 4,
        "kv_block_stride",
        &["572", "576"],
    );
    rejects(
        |c| c.kv_block_stride += 2,
        "kv_block_stride",
        &["not a multiple of 4"],
    );
    rejects(
        |c| c.num_blocks = u64::MAX / 8,
        "num_blocks",
        &["overflows"],
    );
    rejects(
        |c| c.num_blocks = 1 << 32,
        "num_blocks",
        &["4294967296", "2^31"],
    );
    rejects(
        |c| {
            c.shape.layout = ValueLayout::Shuffle16;
            c.shape.head_dim = 48;
        },
        "head_dim",
        &["48", "shuffle16"],
    );
    rejects(
        |c| {
            c.shape.layout = ValueLayout::Shuffle16;
            c.shape.block_size = 8;
        },
        "block_size",
        &["8", "shuffle16"],
    );
    rejects(
        |c| c.shape.head_dim = 40,
        "head_dim",
        &["40", "multiple of 16"],
    );
    rejects(|c| c.shape.next_n = 0, "next_n", &["0", "1..=8"]);
    rejects(|c| c.shape.next_n = 9, "next_n", &["9", "1..=8"]);
    rejects(
        |c| c.out_row_stride = c.max_model_len - 1,
        "out_row_stride",
        &["44", "45"],
    );
    rejects(
        |c| c.block_table.row_stride = 2,
        "block_table.row_stride",
        &["2", "max_blocks 4"],
    );
    rejects(
        |c| c.block_table.entries.pop().map(|_| ()).unwrap(),
        "block_table.entries",
        &["17", "18"],
    );
    rejects(|c| c.q.push(0), "q", &["shape needs"]);
    rejects(
        |c| c.weights.pop().map(|_| ()).unwrap(),
        "weights",
        &["shape needs"],
    );
    rejects(|c| c.shape.batch = 1 << 40, "batch", &["1099511627776"]);
    rejects(|c| c.max_model_len = 0, "max_model_len", &["0"]);
    rejects(
        |c| c.out_row_stride = 1 << 30,
        "out_row_stride",
        &["bytes", "limit"],
    );
    rejects(
        |c| {
            c.kv.insert(c.num_blocks + 5, vec![0; c.shape.block_bytes()]);
        },
        "kv_block_ids",
        &["outside 0..num_blocks"],
    );
    let first = base().kv.ids()[0];
    rejects(
        |c| {
            c.kv.get_mut(first).unwrap().pop();
        },
        &format!("kv_blocks[{first}]"),
        &["575", "576"],
    );
}
