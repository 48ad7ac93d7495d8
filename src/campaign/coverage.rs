//! Coverage accounting: what the campaign generated, per axis and per risky
//! combination (block size × next_n × layout × offset class), so a user can see that
//! the risky regions were actually reached. Expected values start at 0, so a value
//! never reached shows as 0 instead of being absent.

use crate::case::{Case, ContextLens, ValueLayout};
use crate::generate::{OffsetClass, Recipe, TableOrder};
use crate::kernel::Capabilities;
use crate::report::Coverage;

fn bs_class(bs: usize) -> &'static str {
    match bs {
        1 => "1",
        16 => "16",
        64 => "64",
        256 => "256",
        _ => "other",
    }
}

fn n_class(n: usize) -> &'static str {
    match n {
        1 => "1",
        2 => "2",
        _ => "3+",
    }
}

fn offset_name(o: OffsetClass) -> &'static str {
    match o {
        OffsetClass::Low => "low",
        OffsetClass::Around2G => "around_2g",
        OffsetClass::Around4G => "around_4g",
        OffsetClass::Pool(_) => "pool",
    }
}

/// The band of the largest referenced KV byte offset (exclusive bands).
fn kv_band(case: &Case) -> &'static str {
    match case.max_kv_offset() {
        x if x >= 1 << 32 => "past_4g",
        x if x >= 1 << 31 => "2g_to_4g",
        _ => "below_2g",
    }
}

fn batch_bin(requests: usize) -> &'static str {
    match requests {
        0..=1 => "1",
        2..=8 => "2-8",
        9..=64 => "9-64",
        65..=256 => "65-256",
        _ => "257+",
    }
}

fn context_bin(ctx: usize) -> &'static str {
    match ctx {
        0..=4096 => "<=4K",
        4097..=32768 => "<=32K",
        32769..=131072 => "<=128K",
        _ => ">128K",
    }
}

fn workspace_bin(bytes: u64) -> &'static str {
    match bytes {
        x if x >= 2 << 30 => ">=2G",
        x if x >= 256 << 20 => "256M-2G",
        _ => "<256M",
    }
}

/// The production profile's axes: what an engine's batches reached.
fn expected_production(c: &mut Coverage, caps: &[&Capabilities]) {
    let mut put = |axis: &str, vals: &[&str]| {
        let m = c.axes.entry(axis.to_string()).or_default();
        for v in vals {
            m.insert(v.to_string(), 0);
        }
    };
    let bss: Vec<&str> = ["1", "16", "64", "256"]
        .into_iter()
        .filter(|b| {
            caps.iter()
                .all(|c| c.block_sizes.allows(b.parse().unwrap()))
        })
        .collect();
    put("block_size", &bss);
    let formats: Vec<&str> = crate::fp8::Fp8Format::ALL
        .iter()
        .filter(|f| caps.iter().all(|c| c.formats.contains(f)))
        .map(|f| f.name())
        .collect();
    put("format", &formats);
    let layouts: Vec<&str> = [ValueLayout::Normal, ValueLayout::Shuffle16]
        .into_iter()
        .filter(|l| caps.iter().all(|c| c.layouts.contains(l)))
        .map(|l| l.name())
        .collect();
    put("layout", &layouts);
    let native_max = caps.iter().map(|c| c.next_n.1).min().unwrap_or(1);
    put(
        "mtp",
        if native_max >= 4 {
            &["native"]
        } else {
            &["native", "flattened"]
        },
    );
    put(
        "length_class",
        &[
            "zero_trailing",
            "all_zero_batch32",
            "block_edge",
            "chunk_edge",
            "eq_max_model_len",
            "long",
        ],
    );
    put("table_order", &["sequential", "shared_prefix"]);
    put("padding", &["zero", "stale"]);
    put("kv_offsets", &["below_2g", "past_2g", "past_4g"]);
    put("kv_stride", &["tight", "padded"]);
    put("out_offsets", &["below_2g", "past_2g"]);
    put("values", &["pipeline"]);
    put("batch", &["1", "2-8", "9-64", "65-256", "257+"]);
    put("context", &["<=4K", "<=32K", "<=128K", ">128K"]);
    put("rows", &["<=512", ">512"]);
    put("workspace", &["<256M", "256M-2G", ">=2G"]);
    put("pool", &["fresh", "churned"]);
    for bs in &bss {
        for band in ["below_2g", "2g_to_4g", "past_4g"] {
            c.combos.insert(format!("bs={bs}|kv={band}"), 0);
        }
    }
}

/// The axis values a campaign is expected to reach (for the kernels' capabilities).
pub fn expected(caps: &[&Capabilities], profile: crate::generate::Profile) -> Coverage {
    use crate::generate::Profile;
    let production = profile == Profile::Production;
    let hostile = matches!(profile, Profile::Hostile | Profile::All);
    let mut c = Coverage::default();
    if production {
        expected_production(&mut c, caps);
        return c;
    }
    let mut put = |axis: &str, vals: &[&str]| {
        let m = c.axes.entry(axis.to_string()).or_default();
        for v in vals {
            m.insert(v.to_string(), 0);
        }
    };
    let all = |f: &dyn Fn(&Capabilities) -> bool| caps.iter().all(|c| f(c));
    put("block_size", &["1", "16", "64", "256", "other"]);
    put("next_n", &["1", "2", "3+"]);
    put("layout", &["normal", "shuffle16"]);
    put("format", &["e4m3fn", "e4m3fnuz"]);
    if all(&|c| c.lens_2d) {
        put("context_lens", &["1d", "2d"]);
    }
    put(
        "length_class",
        &[
            "zero_leading",
            "zero_middle",
            "zero_trailing",
            "all_zero_batch32",
            "one",
            "below_next_n",
            "block_edge",
            "chunk_edge",
            "eq_max_model_len",
            "long",
        ],
    );
    put(
        "table_order",
        &["sequential", "permuted", "reversed", "shared_prefix"],
    );
    put("padding", &["zero", "minus_one", "huge", "garbage"]);
    put(
        "kv_offsets",
        &["low", "around_2g", "around_4g", "past_2g", "past_4g"],
    );
    put("kv_stride", &["tight", "padded"]);
    put("out_offsets", &["below_2g", "past_2g"]);
    put("out_stride", &["tight", "padded"]);
    let mut vals = vec!["pipeline"];
    if profile != Profile::Hostile {
        vals.extend(["uniform_codes", "extreme", "relu_boundary", "all_negative"]);
    }
    if hostile {
        vals.push("hostile");
    }
    put("values", &vals);
    let bs_ok = |bs: &str| {
        let n: usize = match bs {
            "other" => 3,
            x => x.parse().unwrap(),
        };
        caps.iter().all(|c| c.block_sizes.allows(n))
    };
    let n_ok = |n: &str| {
        let v: usize = match n {
            "3+" => 3,
            x => x.parse().unwrap(),
        };
        caps.iter().all(|c| v >= c.next_n.0 && v <= c.next_n.1)
    };
    let layout_ok = |l: ValueLayout| caps.iter().all(|c| c.layouts.contains(&l));
    let offsets: &[&str] = &["low", "around_2g", "around_4g"];
    for bs in ["1", "16", "64", "256", "other"]
        .into_iter()
        .filter(|b| bs_ok(b))
    {
        for n in ["1", "2", "3+"].into_iter().filter(|n| n_ok(n)) {
            for layout in ["normal", "shuffle16"] {
                if layout == "shuffle16"
                    && (bs == "1" || bs == "other" || !layout_ok(ValueLayout::Shuffle16))
                {
                    continue;
                }
                if layout == "normal" && !layout_ok(ValueLayout::Normal) {
                    continue;
                }
                for off in offsets {
                    c.combos.insert(format!("bs={bs}|n={n}|{layout}|{off}"), 0);
                }
            }
        }
    }
    c
}

/// Counts one generated case.
pub fn record(cov: &mut Coverage, recipe: &Recipe, case: &Case) {
    let mut hit = |axis: &str, v: &str| {
        *cov.axes
            .entry(axis.to_string())
            .or_default()
            .entry(v.to_string())
            .or_default() += 1;
    };
    let s = &case.shape;
    hit("block_size", bs_class(s.block_size));
    hit("next_n", n_class(s.next_n));
    hit("layout", s.layout.name());
    hit("format", s.format.name());
    hit(
        "context_lens",
        if case.context_lens.is_2d() {
            "2d"
        } else {
            "1d"
        },
    );
    for class in length_classes(case) {
        hit("length_class", class);
    }
    hit(
        "table_order",
        match recipe.knobs.table_order {
            TableOrder::Sequential => "sequential",
            TableOrder::Permuted => "permuted",
            TableOrder::Reversed => "reversed",
            TableOrder::SharedPrefix => "shared_prefix",
        },
    );
    let pad_used = (0..s.batch).any(|b| case.blocks_used(b) < case.block_table.row_stride);
    if pad_used {
        hit(
            "padding",
            match recipe.knobs.padding {
                crate::generate::Padding::Zero => "zero",
                crate::generate::Padding::MinusOne => "minus_one",
                crate::generate::Padding::Huge => "huge",
                crate::generate::Padding::Garbage => "garbage",
                crate::generate::Padding::Stale => "stale",
            },
        );
    }
    let pool = match recipe.knobs.offsets {
        OffsetClass::Pool(p) => Some(p),
        _ => None,
    };
    if let Some(p) = pool {
        if kv_band(case) == "below_2g" {
            hit("kv_offsets", "below_2g");
        }
        hit("pool", if p.churn == 0 { "fresh" } else { "churned" });
        hit(
            "mtp",
            if p.rows_per_request > 1 {
                "flattened"
            } else {
                "native"
            },
        );
    } else {
        hit("kv_offsets", offset_name(recipe.knobs.offsets));
    }
    let requests = s.batch / pool.map_or(1, |p| p.rows_per_request.max(1) as usize);
    hit("batch", batch_bin(requests));
    let live = (0..s.batch).map(|b| case.seq_tokens(b)).filter(|&t| t > 0);
    for ctx in live {
        hit("context", context_bin(ctx));
    }
    hit("rows", if case.rows() > 512 { ">512" } else { "<=512" });
    hit("workspace", workspace_bin(case.output_bytes()));
    let max_off = case.max_kv_offset();
    if max_off >= 1 << 31 {
        hit("kv_offsets", "past_2g");
    }
    if max_off >= 1 << 32 {
        hit("kv_offsets", "past_4g");
    }
    hit(
        "kv_stride",
        if case.kv_block_stride > s.block_bytes() as u64 {
            "padded"
        } else {
            "tight"
        },
    );
    hit(
        "out_offsets",
        if case.output_bytes() > 1 << 31 {
            "past_2g"
        } else {
            "below_2g"
        },
    );
    hit(
        "out_stride",
        if case.out_row_stride > case.max_model_len {
            "padded"
        } else {
            "tight"
        },
    );
    hit(
        "values",
        match recipe.knobs.values {
            crate::generate::ValueKind::Pipeline => "pipeline",
            crate::generate::ValueKind::UniformCodes => "uniform_codes",
            crate::generate::ValueKind::Extreme => "extreme",
            crate::generate::ValueKind::ReluBoundary => "relu_boundary",
            crate::generate::ValueKind::AllNegative => "all_negative",
            crate::generate::ValueKind::Hostile => "hostile",
        },
    );
    let layout = if s.layout == ValueLayout::Shuffle16 {
        "shuffle16"
    } else {
        "normal"
    };
    let combo = if pool.is_some() {
        format!("bs={}|kv={}", bs_class(s.block_size), kv_band(case))
    } else {
        format!(
            "bs={}|n={}|{layout}|{}",
            bs_class(s.block_size),
            n_class(s.next_n),
            offset_name(recipe.knobs.offsets)
        )
    };
    *cov.combos.entry(combo).or_default() += 1;
}

/// The length edges a case contains.
pub fn length_classes(case: &Case) -> Vec<&'static str> {
    let s = &case.shape;
    let seq: Vec<usize> = (0..s.batch).map(|b| case.seq_tokens(b)).collect();
    let mut v = Vec::new();
    let b = seq.len();
    if seq.iter().all(|&x| x == 0) && b.is_multiple_of(32) {
        v.push("all_zero_batch32");
    }
    if seq.first() == Some(&0) && b > 1 {
        v.push("zero_leading");
    }
    if b > 2 && seq[1..b - 1].contains(&0) {
        v.push("zero_middle");
    }
    if seq.last() == Some(&0) && b > 1 {
        v.push("zero_trailing");
    }
    if seq.contains(&1) {
        v.push("one");
    }
    let lens_1d = matches!(case.context_lens, ContextLens::PerSequence(_));
    if lens_1d && seq.iter().any(|&x| x > 0 && x < s.next_n) {
        v.push("below_next_n");
    }
    let bs = s.block_size;
    if bs > 1
        && seq
            .iter()
            .any(|&x| x + 1 >= bs && (matches!(x % bs, 0 | 1) || (x + 1) % bs == 0))
    {
        v.push("block_edge");
    }
    if seq
        .iter()
        .any(|&x| x >= 255 && matches!(x % 256, 255 | 0 | 1))
    {
        v.push("chunk_edge");
    }
    if seq.contains(&case.max_model_len) {
        v.push("eq_max_model_len");
    }
    if seq.iter().any(|&x| x > 1024) {
        v.push("long");
    }
    v
}

/// Adds `b` into `a` (merging shard or per-kernel coverage).
pub fn add(a: &mut Coverage, b: &Coverage) {
    for (axis, vals) in &b.axes {
        let m = a.axes.entry(axis.clone()).or_default();
        for (k, n) in vals {
            *m.entry(k.clone()).or_default() += n;
        }
    }
    for (k, n) in &b.combos {
        *a.combos.entry(k.clone()).or_default() += n;
    }
}

/// Axis values and combinations never reached.
pub fn missing(cov: &Coverage) -> Vec<String> {
    let mut v: Vec<String> = cov
        .axes
        .iter()
        .flat_map(|(axis, vals)| {
            vals.iter()
                .filter(|(_, n)| **n == 0)
                .map(move |(k, _)| format!("{axis}={k}"))
        })
        .collect();
    v.extend(
        cov.combos
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(k, _)| k.clone()),
    );
    v
}
