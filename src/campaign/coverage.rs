//! Coverage accounting: what the campaign generated, per axis and per risky
//! combination (block size × next_n × layout × offset class), so a user can see that
//! the risky regions were actually reached. Expected values start at 0, so a value
//! never reached shows as 0 instead of being absent.
//!
//! Every axis is a row of [`AXES`]: its name, its values, which of them a campaign is
//! expected to reach and the values a generated case hits. Both the expectation and the
//! counting read that table, so an axis is named and bucketed in one place.

use crate::case::{Case, ContextLens, ValueLayout};
use crate::generate::{OffsetClass, Padding, Profile, Recipe, TableOrder, ValueKind};
use crate::kernel::Capabilities;
use crate::report::Coverage;

/// One coverage axis.
struct Axis {
    name: &'static str,
    /// Every value the axis can take.
    values: &'static [&'static str],
    /// Whether a campaign (profile, kernels) is expected to reach a value.
    expected: fn(&Campaign, &str) -> bool,
    /// The values one generated case hits; a value may come more than once (one
    /// `context` hit per sequence).
    hits: fn(&Recipe, &Case) -> Vec<&'static str>,
}

/// What a campaign is expected to reach depends on: its profile and kernels.
struct Campaign<'a> {
    caps: &'a [&'a Capabilities],
    profile: Profile,
}

impl Campaign<'_> {
    fn production(&self) -> bool {
        self.profile == Profile::Production
    }

    /// Whether every kernel takes what `f` asks.
    fn all(&self, f: impl Fn(&Capabilities) -> bool) -> bool {
        self.caps.iter().all(|c| f(c))
    }

    /// Production campaigns expect a value where `production` says, the others always.
    fn generated_or(&self, production: bool) -> bool {
        !self.production() || production
    }
}

/// The coverage axes. A new generator axis is a row here.
const AXES: &[Axis] = &[
    Axis {
        name: "block_size",
        values: BS_CLASSES,
        expected: |c, v| c.generated_or(v != "other" && c.all(|k| k.block_sizes.allows(bs_of(v)))),
        hits: |_, case| vec![bs_class(case.shape.block_size)],
    },
    Axis {
        name: "next_n",
        values: N_CLASSES,
        expected: |c, _| !c.production(),
        hits: |_, case| vec![n_class(case.shape.next_n)],
    },
    Axis {
        name: "layout",
        values: &["normal", "shuffle16"],
        expected: |c, v| c.generated_or(c.all(|k| k.layouts.iter().any(|l| l.name() == v))),
        hits: |_, case| vec![case.shape.layout.name()],
    },
    Axis {
        name: "format",
        values: &["e4m3fn", "e4m3fnuz"],
        expected: |c, v| c.generated_or(c.all(|k| k.formats.iter().any(|f| f.name() == v))),
        hits: |_, case| vec![case.shape.format.name()],
    },
    Axis {
        name: "context_lens",
        values: &["1d", "2d"],
        expected: |c, _| !c.production() && c.all(|k| k.lens_2d),
        hits: |_, case| {
            vec![if case.context_lens.is_2d() {
                "2d"
            } else {
                "1d"
            }]
        },
    },
    Axis {
        name: "mtp",
        values: &["native", "flattened"],
        // MTP is flattened where a kernel takes fewer than an engine's 4 rows.
        expected: |c, v| {
            let native_max = c.caps.iter().map(|k| k.next_n.1).min().unwrap_or(1);
            c.production() && (v == "native" || native_max < 4)
        },
        hits: |r, _| match pool_of(r) {
            Some(p) if p.rows_per_request > 1 => vec!["flattened"],
            Some(_) => vec!["native"],
            None => vec![],
        },
    },
    Axis {
        name: "length_class",
        values: &[
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
        // An engine's zero-length requests are its CUDA-graph padding, at the batch's
        // end; its lengths are at least next_n.
        expected: |c, v| {
            c.generated_or(!matches!(
                v,
                "zero_leading" | "zero_middle" | "one" | "below_next_n"
            ))
        },
        hits: |_, case| length_classes(case),
    },
    Axis {
        name: "table_order",
        values: &["sequential", "permuted", "reversed", "shared_prefix"],
        expected: |c, v| c.generated_or(matches!(v, "sequential" | "shared_prefix")),
        hits: |r, _| vec![table_order_name(r.knobs.table_order)],
    },
    Axis {
        name: "padding",
        values: &["zero", "minus_one", "huge", "garbage", "stale"],
        expected: |c, v| {
            if c.production() {
                matches!(v, "zero" | "stale")
            } else {
                v != "stale"
            }
        },
        // Only a table with padding in it shows its padding.
        hits: |r, case| {
            let s = &case.shape;
            let used = (0..s.batch).any(|b| case.blocks_used(b) < case.block_table.row_stride);
            if used {
                vec![padding_name(r.knobs.padding)]
            } else {
                vec![]
            }
        },
    },
    Axis {
        name: "kv_offsets",
        values: &[
            "low",
            "around_2g",
            "around_4g",
            "below_2g",
            "past_2g",
            "past_4g",
        ],
        // Dense draws name their offset class, pools the band they reached.
        expected: |c, v| {
            if c.production() {
                matches!(v, "below_2g" | "past_2g" | "past_4g")
            } else {
                v != "below_2g"
            }
        },
        hits: |r, case| {
            let mut v = match r.knobs.offsets {
                OffsetClass::Pool(_) if kv_band(case) == "below_2g" => vec!["below_2g"],
                OffsetClass::Pool(_) => vec![],
                o => vec![offset_name(o)],
            };
            let max_off = case.max_kv_offset();
            if max_off >= 1 << 31 {
                v.push("past_2g");
            }
            if max_off >= 1 << 32 {
                v.push("past_4g");
            }
            v
        },
    },
    Axis {
        name: "kv_stride",
        values: &["tight", "padded"],
        expected: |_, _| true,
        hits: |_, case| {
            let padded = case.kv_block_stride > case.shape.block_bytes() as u64;
            vec![if padded { "padded" } else { "tight" }]
        },
    },
    Axis {
        name: "out_offsets",
        values: &["below_2g", "past_2g"],
        expected: |_, _| true,
        hits: |_, case| {
            let past = case.output_bytes() > 1 << 31;
            vec![if past { "past_2g" } else { "below_2g" }]
        },
    },
    Axis {
        name: "out_stride",
        values: &["tight", "padded"],
        expected: |c, _| !c.production(),
        hits: |_, case| {
            let padded = case.out_row_stride > case.max_model_len;
            vec![if padded { "padded" } else { "tight" }]
        },
    },
    Axis {
        name: "values",
        values: &[
            "pipeline",
            "uniform_codes",
            "extreme",
            "relu_boundary",
            "all_negative",
            "hostile",
        ],
        expected: |c, v| match v {
            "pipeline" => true,
            "hostile" => matches!(c.profile, Profile::Hostile | Profile::All),
            _ => !matches!(c.profile, Profile::Production | Profile::Hostile),
        },
        hits: |r, _| vec![value_name(r.knobs.values)],
    },
    Axis {
        name: "batch",
        values: &["1", "2-8", "9-64", "65-256", "257+"],
        expected: |c, _| c.production(),
        // Requests, not the rows MTP flattening makes of them.
        hits: |r, case| {
            let rows = pool_of(r).map_or(1, |p| p.rows_per_request.max(1) as usize);
            vec![batch_bin(case.shape.batch / rows)]
        },
    },
    Axis {
        name: "context",
        values: &["<=4K", "<=32K", "<=128K", ">128K"],
        expected: |c, _| c.production(),
        hits: |_, case| {
            (0..case.shape.batch)
                .map(|b| case.seq_tokens(b))
                .filter(|&t| t > 0)
                .map(context_bin)
                .collect()
        },
    },
    Axis {
        name: "rows",
        values: &["<=512", ">512"],
        expected: |c, _| c.production(),
        hits: |_, case| vec![if case.rows() > 512 { ">512" } else { "<=512" }],
    },
    Axis {
        name: "workspace",
        values: &["<256M", "256M-2G", ">=2G"],
        expected: |c, _| c.production(),
        hits: |_, case| vec![workspace_bin(case.output_bytes())],
    },
    Axis {
        name: "pool",
        values: &["fresh", "churned"],
        expected: |c, _| c.production(),
        hits: |r, _| match pool_of(r) {
            Some(p) if p.churn == 0 => vec!["fresh"],
            Some(_) => vec!["churned"],
            None => vec![],
        },
    },
];

const BS_CLASSES: &[&str] = &["1", "16", "64", "256", "other"];
const N_CLASSES: &[&str] = &["1", "2", "3+"];
const KV_BANDS: &[&str] = &["below_2g", "2g_to_4g", "past_4g"];
/// The dense offset classes of the risky combinations.
const OFFSETS: &[OffsetClass] = &[
    OffsetClass::Low,
    OffsetClass::Around2G,
    OffsetClass::Around4G,
];

fn bs_class(bs: usize) -> &'static str {
    match bs {
        1 => "1",
        16 => "16",
        64 => "64",
        256 => "256",
        _ => "other",
    }
}

/// A block size of the class (3 for `other`).
fn bs_of(class: &str) -> usize {
    class.parse().unwrap_or(3)
}

fn n_class(n: usize) -> &'static str {
    match n {
        1 => "1",
        2 => "2",
        _ => "3+",
    }
}

/// A next_n of the class (3 for `3+`).
fn n_of(class: &str) -> usize {
    class.parse().unwrap_or(3)
}

fn offset_name(o: OffsetClass) -> &'static str {
    match o {
        OffsetClass::Low => "low",
        OffsetClass::Around2G => "around_2g",
        OffsetClass::Around4G => "around_4g",
        OffsetClass::Pool(_) => "pool",
    }
}

fn table_order_name(t: TableOrder) -> &'static str {
    match t {
        TableOrder::Sequential => "sequential",
        TableOrder::Permuted => "permuted",
        TableOrder::Reversed => "reversed",
        TableOrder::SharedPrefix => "shared_prefix",
    }
}

fn padding_name(p: Padding) -> &'static str {
    match p {
        Padding::Zero => "zero",
        Padding::MinusOne => "minus_one",
        Padding::Huge => "huge",
        Padding::Garbage => "garbage",
        Padding::Stale => "stale",
    }
}

fn value_name(v: ValueKind) -> &'static str {
    match v {
        ValueKind::Pipeline => "pipeline",
        ValueKind::UniformCodes => "uniform_codes",
        ValueKind::Extreme => "extreme",
        ValueKind::ReluBoundary => "relu_boundary",
        ValueKind::AllNegative => "all_negative",
        ValueKind::Hostile => "hostile",
    }
}

fn pool_of(r: &Recipe) -> Option<crate::generate::PoolRecipe> {
    match r.knobs.offsets {
        OffsetClass::Pool(p) => Some(p),
        _ => None,
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

/// The axis values a campaign is expected to reach (for the kernels' capabilities).
pub fn expected(caps: &[&Capabilities], profile: Profile) -> Coverage {
    let campaign = Campaign { caps, profile };
    let mut c = Coverage::default();
    for axis in AXES {
        let vals: Vec<&str> = axis
            .values
            .iter()
            .copied()
            .filter(|v| (axis.expected)(&campaign, v))
            .collect();
        if !vals.is_empty() {
            let m = c.axes.entry(axis.name.to_string()).or_default();
            m.extend(vals.into_iter().map(|v| (v.to_string(), 0)));
        }
    }
    for combo in expected_combos(&campaign) {
        c.combos.insert(combo, 0);
    }
    c
}

/// The risky combinations a campaign is expected to reach: block size × KV band for
/// engine pools, block size × next_n × layout × offset class for the others.
fn expected_combos(c: &Campaign) -> Vec<String> {
    let mut v = Vec::new();
    let bss = BS_CLASSES
        .iter()
        .filter(|b| !c.production() || **b != "other")
        .filter(|b| c.all(|k| k.block_sizes.allows(bs_of(b))));
    for bs in bss {
        if c.production() {
            v.extend(KV_BANDS.iter().map(|band| format!("bs={bs}|kv={band}")));
            continue;
        }
        let ns = N_CLASSES.iter().filter(|n| {
            let n = n_of(n);
            c.all(|k| n >= k.next_n.0 && n <= k.next_n.1)
        });
        for n in ns {
            for layout in ValueLayout::ALL {
                let shuffle = layout == ValueLayout::Shuffle16;
                if (shuffle && matches!(*bs, "1" | "other"))
                    || !c.all(|k| k.layouts.contains(&layout))
                {
                    continue;
                }
                for off in OFFSETS {
                    let (layout, off) = (layout.name(), offset_name(*off));
                    v.push(format!("bs={bs}|n={n}|{layout}|{off}"));
                }
            }
        }
    }
    v
}

/// Counts one generated case.
pub fn record(cov: &mut Coverage, recipe: &Recipe, case: &Case) {
    for axis in AXES {
        for v in (axis.hits)(recipe, case) {
            debug_assert!(axis.values.contains(&v), "{}={v}", axis.name);
            let m = cov.axes.entry(axis.name.to_string()).or_default();
            *m.entry(v.to_string()).or_default() += 1;
        }
    }
    let s = &case.shape;
    let combo = if pool_of(recipe).is_some() {
        format!("bs={}|kv={}", bs_class(s.block_size), kv_band(case))
    } else {
        format!(
            "bs={}|n={}|{}|{}",
            bs_class(s.block_size),
            n_class(s.next_n),
            s.layout.name(),
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
