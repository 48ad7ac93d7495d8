//! The planted bugs: the names, descriptions and production triggers of the realistic
//! edits that the CPU (`cpu:bug-*`, `kernel::cpu`) and CUDA (`cuda:bug-*`, `-DBUG_*`
//! defines of `kernels/tiled.cu`) kernels both implement. One list, shared by both
//! backends, the registry and the selftest.

/// A planted bug: one realistic edit of the chunked kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plant {
    TailUnwritten,
    Offset32Kv,
    Offset32Out,
    MaskOffByOne,
    Ctx2dIgnored,
    TablePaddingRead,
    ZeroBatch,
    FnuzAsFn,
    ScaleBeforeRelu,
    SplitBoundaryDrop,
    ShortRowSkipped,
    StorePastEnd,
    /// Breaks bitwise determinism (a property, DESIGN §7): invisible to the oracle.
    Nondeterministic,
    /// Breaks batch invariance (a property, DESIGN §7): invisible to the oracle.
    BatchVariant,
}

impl Plant {
    /// The planted bugs that break a property rather than a value: every result stays
    /// within its error bound, so only `--require deterministic,batch-invariant` (and
    /// `selftest`, which requires them for these rows) turns them into findings. Kept
    /// out of [`Plant::ALL`], whose bugs the reference alone must catch.
    pub const PROPERTY: [Plant; 2] = [Plant::Nondeterministic, Plant::BatchVariant];

    /// Every planted bug: [`Plant::ALL`] then [`Plant::PROPERTY`].
    pub fn every() -> impl Iterator<Item = Plant> {
        Plant::ALL.into_iter().chain(Plant::PROPERTY)
    }

    /// The property (its `--require` name) this planted bug breaks, if it is one of
    /// [`Plant::PROPERTY`].
    pub fn breaks_property(self) -> Option<&'static str> {
        match self {
            Plant::Nondeterministic => Some("deterministic"),
            Plant::BatchVariant => Some("batch-invariant"),
            _ => None,
        }
    }

    pub const ALL: [Plant; 12] = [
        Plant::TailUnwritten,
        Plant::Offset32Kv,
        Plant::Offset32Out,
        Plant::MaskOffByOne,
        Plant::Ctx2dIgnored,
        Plant::TablePaddingRead,
        Plant::ZeroBatch,
        Plant::FnuzAsFn,
        Plant::ScaleBeforeRelu,
        Plant::SplitBoundaryDrop,
        Plant::ShortRowSkipped,
        Plant::StorePastEnd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Plant::TailUnwritten => "tail-unwritten",
            Plant::Offset32Kv => "offset32-kv",
            Plant::Offset32Out => "offset32-out",
            Plant::MaskOffByOne => "mask-off-by-one",
            Plant::Ctx2dIgnored => "ctx2d-ignored",
            Plant::TablePaddingRead => "table-padding-read",
            Plant::ZeroBatch => "zero-batch",
            Plant::FnuzAsFn => "fnuz-as-fn",
            Plant::ScaleBeforeRelu => "scale-before-relu",
            Plant::SplitBoundaryDrop => "split-boundary-drop",
            Plant::ShortRowSkipped => "short-row-skipped",
            Plant::StorePastEnd => "store-past-end",
            Plant::Nondeterministic => "nondeterministic",
            Plant::BatchVariant => "batch-variant",
        }
    }

    pub fn parse(s: &str) -> Option<Plant> {
        Plant::every().find(|p| p.name() == s)
    }

    /// How a serving engine's own inputs reach this bug (`--profile production` must find
    /// it), or `None` when only inputs an engine never produces do: tables padded with
    /// -1 or huge ids (engines pad with 0, the null block, or stale valid ids), negative
    /// scales (pipeline scales are positive powers of two), and live requests shorter
    /// than next_n (an MTP request's context holds its own draft tokens).
    pub fn production_trigger(self) -> Option<&'static str> {
        match self {
            Plant::TailUnwritten => Some("context lengths that are not a multiple of 256"),
            Plant::Offset32Kv => Some("a churned pool of slab-strided blocks: ids past 4 GiB"),
            Plant::Offset32Out => Some("rows past 512 of a 1M-column workspace (V4)"),
            Plant::MaskOffByOne => Some("MTP: next_n > 1"),
            Plant::Ctx2dIgnored => Some("per-token lengths [L-N+1 … L] (NVIDIA)"),
            Plant::TablePaddingRead => None,
            Plant::ZeroBatch => Some("the dummy batch of a CUDA-graph capture or an idle DP rank"),
            Plant::FnuzAsFn => Some("MI300 (gfx942): e4m3fnuz caches"),
            Plant::ScaleBeforeRelu => None,
            Plant::SplitBoundaryDrop => Some("sequences longer than a split of the schedule"),
            Plant::ShortRowSkipped => None,
            Plant::StorePastEnd => {
                Some("a request at a max_model_len that is not a multiple of 256")
            }
            Plant::Nondeterministic => Some("any case with 3 or more index heads (V4: 64)"),
            Plant::BatchVariant => Some("any batch of 2 or more requests"),
        }
    }

    /// Planted bugs composed with `+` (`offset32-kv+scale-before-relu`): each at most
    /// once, in the order given. `None` for an unknown name, a repeat or an empty list.
    pub fn parse_set(s: &str) -> Option<Vec<Plant>> {
        let mut v: Vec<Plant> = Vec::new();
        for part in s.split('+') {
            let p = Plant::parse(part)?;
            if v.contains(&p) {
                return None;
            }
            v.push(p);
        }
        Some(v)
    }

    /// The real-world failure this reproduces.
    pub fn describe(self) -> &'static str {
        match self {
            Plant::TailUnwritten => "chunk count rounds down: the partial last chunk of each sequence is never stored",
            Plant::Offset32Kv => "block_id * kv_block_stride in 32 bits: blocks past 4 GiB wrap to unrelated (poisoned) bytes (AITER PR #4774)",
            Plant::Offset32Out => "output byte offset row*stride*4 in int32: rows past 2 GiB store to a wild address (AITER #4244)",
            Plant::MaskOffByOne => "causal mask for MTP uses < instead of <=: the last valid position of every row is -inf when next_n > 1",
            Plant::Ctx2dIgnored => "reads one length per sequence (context_lens[b] of the flattened [B,N] array), ignoring per-token lengths",
            Plant::TablePaddingRead => "loads block-table entries for the whole last chunk, padding included; -1 or huge ids fault",
            Plant::ZeroBatch => "an all-zero batch (B a multiple of 32) gets the sentinel schedule item, which stores into row B*N (DeepGEMM #353/#344)",
            Plant::FnuzAsFn => "decodes e4m3fnuz data with the e4m3fn table (values doubled, 0x80 read as -0)",
            Plant::ScaleBeforeRelu => "declares scale after the relu/head sum but applies it inside the relu (differs for negative scales)",
            Plant::SplitBoundaryDrop => "split-KV: a worker whose range starts mid-sequence skips its first chunk",
            Plant::ShortRowSkipped => "schedule drops sequences with context length < next_n, though their last rows have valid positions",
            Plant::StorePastEnd => "chunk store masks with t <= max_model_len: one element written past the end of each full row",
            Plant::Nondeterministic => "the head sum's partials are combined in an order that follows a run counter (as atomics arriving in another order would): two runs of one case differ in the last bits, within every error bound",
            Plant::BatchVariant => "the head sum is split where the batch's total length says (a schedule tuned to the whole batch): a sequence's summation order, and so its last bits, change with its neighbours, within every error bound",
        }
    }
}
