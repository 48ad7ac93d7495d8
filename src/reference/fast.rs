//! The fast exact reference: one GEMM per sequence, fused with the head combine.
//!
//! For sequence `b` the logits of its `N` rows are `relu`/weight/scale combines of the
//! `(N·H) × T` product of its decoded queries (`N·H × D`, f64) with its decoded keys
//! (`D × T`). The dots are exact in any summation order (see the module above), so a
//! blocked, FMA-using GEMM gives the very same dot values as the plain loop of
//! [`super::compute_row`]; the combine after it performs the same f64 operations in
//! the same head order as [`super::combine`], which makes the result bit-identical
//! (NaN payloads aside: which of two NaNs survives a sum depends on its order).
//!
//! Work is split over `(sequence, token chunk)` pairs, not rows, so one long sequence
//! keeps every core busy. Inside a task, keys are decoded once per micro-panel of
//! [`NR`] tokens through the 256-entry table into a `D × NR` panel; each `MR × NR`
//! tile of dots is combined into the running logits as soon as it is computed, so the
//! dots never leave L1.

use super::RowReference;
use crate::case::{Case, ScalePlacement, ValueLayout};
use rayon::prelude::*;

/// Tokens per micro-panel: three AVX2 vectors of f64.
pub(crate) const NR: usize = 12;
/// Heads per micro-tile (broadcast operands). `MR × NR / 4` = 12 accumulators keep
/// both FMA pipes of a core busy (latency 4, two per cycle → 8 in flight needed).
pub(crate) const MR: usize = 4;
/// Tokens per task: large enough to amortize the query decode (`N·H·D` lookups per
/// task), small enough that one 65536-token sequence yields ~170 tasks for the pool.
const CHUNK: usize = 32 * NR;

/// The positions wanted of one row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Want {
    /// Every position of V(r): `0..valid_len`.
    Dense,
    /// These positions, sorted, unique, each `< valid_len`.
    Sparse(Vec<usize>),
}

/// Which GEMM does the dots (the micro-kernel of this module, or a crate's GEMM on a
/// whole chunk followed by a separate combine pass — kept to compare against).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The fused blocked micro-kernel here (AVX2/FMA when the CPU has it).
    Fused,
    /// Same micro-kernel forced to its portable (autovectorized) code path.
    FusedPortable,
    /// `matrixmultiply::dgemm` per chunk, then a combine pass.
    #[cfg(feature = "gemm-compare")]
    MatrixMultiply,
    /// `gemm::gemm` (the faer GEMM) per chunk, then a combine pass.
    #[cfg(feature = "gemm-compare")]
    Gemm,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Fused => "fused",
            Backend::FusedPortable => "fused-portable",
            #[cfg(feature = "gemm-compare")]
            Backend::MatrixMultiply => "matrixmultiply",
            #[cfg(feature = "gemm-compare")]
            Backend::Gemm => "gemm",
        }
    }

    /// Every backend compiled in.
    pub fn all() -> Vec<Backend> {
        vec![
            Backend::Fused,
            Backend::FusedPortable,
            #[cfg(feature = "gemm-compare")]
            Backend::MatrixMultiply,
            #[cfg(feature = "gemm-compare")]
            Backend::Gemm,
        ]
    }
}

/// Whether the AVX2/FMA code path runs on this CPU.
pub fn simd_path() -> &'static str {
    if avx2_fma() {
        "avx2+fma"
    } else {
        "portable"
    }
}

#[inline]
fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One row's slice of a task's output.
struct RowOut<'a> {
    /// Row index within the sequence (`r = b·N + i`).
    i: usize,
    valid_len: usize,
    /// `Some`: the row's wanted positions covered by this task (sparse row).
    positions: Option<&'a [usize]>,
    /// Dense row: the position of `value[0]`.
    first: usize,
    value: &'a mut [f64],
    relu_mag: &'a mut [f64],
}

/// The not yet assigned part of a row's output: values, relu magnitudes, positions.
type RowRest<'a> = (&'a mut [f64], &'a mut [f64], Option<&'a [usize]>);

struct Task<'a> {
    b: usize,
    tokens: &'a [usize],
    outs: Vec<RowOut<'a>>,
}

/// Computes the wanted rows (`None`: not computed) with the given backend.
pub(crate) fn compute(
    case: &Case,
    placement: ScalePlacement,
    wants: &[Option<Want>],
    backend: Backend,
) -> Vec<Option<RowReference>> {
    let s = &case.shape;
    let n = s.next_n;
    // Row outputs, sized to their positions.
    let mut rows: Vec<Option<RowReference>> = wants
        .iter()
        .enumerate()
        .map(|(r, w)| {
            w.as_ref().map(|w| {
                let (len, positions) = match w {
                    Want::Dense => (case.valid_len(r), None),
                    Want::Sparse(p) => (p.len(), Some(p.clone())),
                };
                RowReference {
                    value: vec![0.0; len],
                    relu_mag: vec![0.0; len],
                    positions,
                }
            })
        })
        .collect();
    let tokens = sequence_tokens(case, wants);
    // Tasks: (sequence, chunk of its tokens), each holding its slices of the row outputs.
    let mut tasks: Vec<Task> = Vec::new();
    let mut rest: Vec<Option<RowRest>> = rows
        .iter_mut()
        .map(|o| {
            o.as_mut().map(|rr| {
                let RowReference {
                    value,
                    relu_mag,
                    positions,
                } = rr;
                (
                    value.as_mut_slice(),
                    relu_mag.as_mut_slice(),
                    positions.as_deref(),
                )
            })
        })
        .collect();
    for (b, toks) in tokens.iter().enumerate() {
        for chunk in toks.chunks(CHUNK) {
            let (lo, hi) = (chunk[0], chunk[chunk.len() - 1] + 1);
            let mut outs = Vec::new();
            for i in 0..n {
                let r = b * n + i;
                let Some((value, mag, positions)) = rest[r].take() else {
                    continue;
                };
                let valid_len = case.valid_len(r);
                // Slots of this row that fall inside [lo, hi).
                let (start, end) = match positions {
                    None => (lo.min(valid_len), hi.min(valid_len)),
                    Some(p) => (
                        p.partition_point(|&t| t < lo),
                        p.partition_point(|&t| t < hi),
                    ),
                };
                // The remaining slices start at `start` (pieces are taken in token order).
                debug_assert!(positions.is_none() || start == 0);
                let (v_here, v_rest) = value.split_at_mut(end - start);
                let (m_here, m_rest) = mag.split_at_mut(end - start);
                let (p_here, p_rest) = match positions {
                    None => (None, None),
                    Some(p) => {
                        let (a, c) = p.split_at(end - start);
                        (Some(a), Some(c))
                    }
                };
                rest[r] = Some((v_rest, m_rest, p_rest));
                if end > start {
                    outs.push(RowOut {
                        i,
                        valid_len,
                        positions: p_here,
                        first: lo.min(valid_len),
                        value: v_here,
                        relu_mag: m_here,
                    });
                }
            }
            if !outs.is_empty() {
                tasks.push(Task {
                    b,
                    tokens: chunk,
                    outs,
                });
            }
        }
    }
    drop(rest);
    let table: [f64; 256] = std::array::from_fn(|c| s.format.table()[c] as f64);
    tasks
        .into_par_iter()
        .for_each(|mut t| run_task(case, placement, &table, &mut t, backend));
    rows
}

/// Per sequence, the sorted tokens any wanted row of it needs.
fn sequence_tokens(case: &Case, wants: &[Option<Want>]) -> Vec<Vec<usize>> {
    let n = case.shape.next_n;
    (0..case.shape.batch)
        .map(|b| {
            let mut dense_len = 0;
            let mut sparse = Vec::new();
            for i in 0..n {
                let r = b * n + i;
                match &wants[r] {
                    None => {}
                    Some(Want::Dense) => dense_len = dense_len.max(case.valid_len(r)),
                    Some(Want::Sparse(p)) => {
                        sparse.extend(p.iter().copied().filter(|&t| t >= dense_len))
                    }
                }
            }
            sparse.retain(|&t| t >= dense_len);
            sparse.sort_unstable();
            sparse.dedup();
            (0..dense_len).chain(sparse).collect()
        })
        .collect()
}

/// How many independent tasks (sequence × token chunk) the fast reference splits a
/// selection into: what the thread pool has to balance.
pub fn task_count(case: &Case, sel: &super::RowSelection) -> usize {
    sequence_tokens(case, &super::wants(case, sel))
        .iter()
        .map(|t| t.len().div_ceil(CHUNK))
        .sum()
}

fn run_task(
    case: &Case,
    placement: ScalePlacement,
    table: &[f64; 256],
    task: &mut Task,
    backend: Backend,
) {
    match backend {
        Backend::Fused => {
            #[cfg(target_arch = "x86_64")]
            if avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (checked just above).
                unsafe { avx2::run_fused(case, placement, table, task) };
                return;
            }
            run_fused::<Portable>(case, placement, table, task)
        }
        Backend::FusedPortable => run_fused::<Portable>(case, placement, table, task),
        #[cfg(feature = "gemm-compare")]
        Backend::MatrixMultiply | Backend::Gemm => {
            crate_gemm::run(case, placement, table, task, backend)
        }
    }
}

/// A `MR × NR` tile of dots: `c[j][l] = Σ_d q[d·MR + j] · k[d·NR + l]`.
trait TileKernel {
    fn tile(q: &[f64], k: &[f64], d: usize, c: &mut [[f64; NR]; MR]);
}

/// Plain loops; the compiler vectorizes them for whatever the target has.
struct Portable;

impl TileKernel for Portable {
    #[inline(always)]
    fn tile(q: &[f64], k: &[f64], d: usize, c: &mut [[f64; NR]; MR]) {
        let mut acc = [[0.0f64; NR]; MR];
        for (qd, kd) in q[..d * MR]
            .chunks_exact(MR)
            .zip(k[..d * NR].chunks_exact(NR))
        {
            for j in 0..MR {
                for l in 0..NR {
                    acc[j][l] += qd[j] * kd[l];
                }
            }
        }
        *c = acc;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    // The assembly below hard-codes the 4×12 tile.
    const _: () = assert!(MR == 4 && NR == 12);

    pub(super) struct Avx2;

    impl TileKernel for Avx2 {
        #[inline(always)]
        fn tile(q: &[f64], k: &[f64], d: usize, c: &mut [[f64; NR]; MR]) {
            assert!(q.len() >= d * MR && k.len() >= d * NR);
            // SAFETY: only instantiated inside `run_fused` below, which is compiled
            // with AVX2+FMA and only called after detecting them; bounds asserted.
            unsafe { tile_avx2(q.as_ptr(), k.as_ptr(), d, c) }
        }
    }

    /// The 4×12 tile in assembly: 12 accumulators, 3 key vectors and one broadcast
    /// register are exactly the 16 ymm registers, a budget the compiler overshoots (it
    /// spilled one accumulator per step, putting a store-to-load round trip into that
    /// chain and halving the rate).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2(q: *const f64, k: *const f64, d: usize, c: &mut [[f64; NR]; MR]) {
        if d == 0 {
            *c = [[0.0; NR]; MR];
            return;
        }
        std::arch::asm!(
            "vxorpd ymm0, ymm0, ymm0",
            "vxorpd ymm1, ymm1, ymm1",
            "vxorpd ymm2, ymm2, ymm2",
            "vxorpd ymm3, ymm3, ymm3",
            "vxorpd ymm4, ymm4, ymm4",
            "vxorpd ymm5, ymm5, ymm5",
            "vxorpd ymm6, ymm6, ymm6",
            "vxorpd ymm7, ymm7, ymm7",
            "vxorpd ymm8, ymm8, ymm8",
            "vxorpd ymm9, ymm9, ymm9",
            "vxorpd ymm10, ymm10, ymm10",
            "vxorpd ymm11, ymm11, ymm11",
            ".p2align 5",
            "2:",
            "vmovupd ymm12, [{k}]",
            "vmovupd ymm13, [{k} + 32]",
            "vmovupd ymm14, [{k} + 64]",
            "vbroadcastsd ymm15, qword ptr [{q}]",
            "vfmadd231pd ymm0, ymm15, ymm12",
            "vfmadd231pd ymm1, ymm15, ymm13",
            "vfmadd231pd ymm2, ymm15, ymm14",
            "vbroadcastsd ymm15, qword ptr [{q} + 8]",
            "vfmadd231pd ymm3, ymm15, ymm12",
            "vfmadd231pd ymm4, ymm15, ymm13",
            "vfmadd231pd ymm5, ymm15, ymm14",
            "vbroadcastsd ymm15, qword ptr [{q} + 16]",
            "vfmadd231pd ymm6, ymm15, ymm12",
            "vfmadd231pd ymm7, ymm15, ymm13",
            "vfmadd231pd ymm8, ymm15, ymm14",
            "vbroadcastsd ymm15, qword ptr [{q} + 24]",
            "vfmadd231pd ymm9, ymm15, ymm12",
            "vfmadd231pd ymm10, ymm15, ymm13",
            "vfmadd231pd ymm11, ymm15, ymm14",
            "add {k}, 96",
            "add {q}, 32",
            "dec {n}",
            "jnz 2b",
            "vmovupd [{c}], ymm0",
            "vmovupd [{c} + 32], ymm1",
            "vmovupd [{c} + 64], ymm2",
            "vmovupd [{c} + 96], ymm3",
            "vmovupd [{c} + 128], ymm4",
            "vmovupd [{c} + 160], ymm5",
            "vmovupd [{c} + 192], ymm6",
            "vmovupd [{c} + 224], ymm7",
            "vmovupd [{c} + 256], ymm8",
            "vmovupd [{c} + 288], ymm9",
            "vmovupd [{c} + 320], ymm10",
            "vmovupd [{c} + 352], ymm11",
            k = inout(reg) k => _,
            q = inout(reg) q => _,
            n = inout(reg) d => _,
            c = in(reg) c.as_mut_ptr(),
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
            out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
            out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
            out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
            options(nostack),
        );
    }

    /// The whole task compiled for AVX2+FMA, so the combine vectorizes to 256 bits too.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run_fused(
        case: &Case,
        placement: ScalePlacement,
        table: &[f64; 256],
        task: &mut Task,
    ) {
        super::run_fused::<Avx2>(case, placement, table, task)
    }
}

/// Decodes the query heads of row `r` into `MR`-head panels, `D × MR` each, heads
/// padded with zeros to a multiple of `MR` (their dots are never combined).
pub(crate) fn pack_queries(case: &Case, table: &[f64; 256], r: usize, out: &mut Vec<f64>) {
    let s = &case.shape;
    let (h, d) = (s.heads, s.head_dim);
    let panels = h.div_ceil(MR);
    out.clear();
    out.resize(panels * d * MR, 0.0);
    let (b, i) = (r / s.next_n, r % s.next_n);
    for hh in 0..h {
        let (p, j) = (hh / MR, hh % MR);
        let panel = &mut out[p * d * MR..(p + 1) * d * MR];
        for (dd, &c) in case.q_codes(b, i, hh).iter().enumerate() {
            panel[dd * MR + j] = table[c as usize];
        }
    }
}

/// Decodes the keys of `tokens` (≤ `width`) of sequence `b` into a `D × width` panel
/// (token lanes past `tokens.len()` are zero) and their scales.
#[inline(always)]
pub(crate) fn pack_keys(
    case: &Case,
    table: &[f64; 256],
    b: usize,
    tokens: &[usize],
    width: usize,
    panel: &mut [f64],
    scales: &mut [f32],
) {
    let s = &case.shape;
    let (d, bs) = (s.head_dim, s.block_size);
    let mut cur: Option<(usize, &[u8])> = None;
    for (l, &t) in tokens.iter().enumerate() {
        let j = t / bs;
        let block = match cur {
            Some((cj, blk)) if cj == j => blk,
            _ => {
                let blk = case.block(case.block_table.get(b, j) as u64);
                cur = Some((j, blk));
                blk
            }
        };
        let p = t % bs;
        // Codes of one token come in contiguous runs: all D (normal) or 16 (shuffle16).
        let run = match s.layout {
            ValueLayout::Normal => d,
            ValueLayout::Shuffle16 => 16,
        };
        for g in (0..d).step_by(run) {
            let start = s.layout.value_offset(d, p, g);
            for (x, &c) in block[start..start + run].iter().enumerate() {
                panel[(g + x) * width + l] = table[c as usize];
            }
        }
        scales[l] = case.k_scale(block, p);
    }
    for l in tokens.len()..width {
        for dd in 0..d {
            panel[dd * width + l] = 0.0;
        }
        scales[l] = 0.0;
    }
}

/// Same as [`super::relu`], in a form that vectorizes to compare + and.
#[inline(always)]
fn relu_lane(x: f64) -> f64 {
    if x <= 0.0 {
        0.0
    } else {
        x
    }
}

/// Folds the dots of heads `h0..h0+count` (rows of `c`) into the running sums, in head
/// order, with exactly the operations of [`super::combine`].
#[inline(always)]
pub(crate) fn combine_heads(
    placement: ScalePlacement,
    weights: &[f32],
    c: &[[f64; NR]],
    scales: &[f64; NR],
    v: &mut [f64; NR],
    m: &mut [f64; NR],
) {
    for (w, dots) in weights.iter().zip(c) {
        let w = *w as f64;
        match placement {
            ScalePlacement::AfterReluSum => {
                for l in 0..NR {
                    let t = w * relu_lane(dots[l]);
                    v[l] += t;
                    m[l] += t.abs();
                }
            }
            ScalePlacement::InsideRelu => {
                for l in 0..NR {
                    let t = w * relu_lane(dots[l] * scales[l]);
                    v[l] += t;
                    m[l] += t.abs();
                }
            }
        }
    }
}

/// The final multiply of [`super::combine`].
#[inline(always)]
pub(crate) fn finish(
    placement: ScalePlacement,
    scales: &[f64; NR],
    v: &mut [f64; NR],
    m: &mut [f64; NR],
) {
    if placement == ScalePlacement::AfterReluSum {
        for l in 0..NR {
            v[l] *= scales[l];
            m[l] *= scales[l].abs();
        }
    }
}

/// Stores the lanes of panel `tokens` into a row's slots.
#[inline(always)]
fn store(o: &mut RowOut, tokens: &[usize], v: &[f64; NR], m: &[f64; NR], cursor: &mut usize) {
    match o.positions {
        None => {
            for (l, &t) in tokens.iter().enumerate() {
                if t < o.valid_len {
                    o.value[t - o.first] = v[l];
                    o.relu_mag[t - o.first] = m[l];
                }
            }
        }
        Some(p) => {
            for (l, &t) in tokens.iter().enumerate() {
                if *cursor < p.len() && p[*cursor] == t {
                    o.value[*cursor] = v[l];
                    o.relu_mag[*cursor] = m[l];
                    *cursor += 1;
                }
            }
        }
    }
}

#[inline(always)]
fn run_fused<K: TileKernel>(
    case: &Case,
    placement: ScalePlacement,
    table: &[f64; 256],
    task: &mut Task,
) {
    let s = &case.shape;
    let (n, h, d) = (s.next_n, s.heads, s.head_dim);
    let panels = h.div_ceil(MR);
    let queries: Vec<Vec<f64>> = task
        .outs
        .iter()
        .map(|o| {
            let mut q = Vec::new();
            pack_queries(case, table, task.b * n + o.i, &mut q);
            q
        })
        .collect();
    let mut kpanel = vec![0.0f64; d * NR];
    let mut scales32 = [0f32; NR];
    let mut cursors = vec![0usize; task.outs.len()];
    let mut c = [[0.0f64; NR]; MR];
    for tokens in task.tokens.chunks(NR) {
        pack_keys(case, table, task.b, tokens, NR, &mut kpanel, &mut scales32);
        let scales: [f64; NR] = std::array::from_fn(|l| scales32[l] as f64);
        for ((o, q), cursor) in task.outs.iter_mut().zip(&queries).zip(cursors.iter_mut()) {
            let r = task.b * n + o.i;
            let weights = &case.weights[r * h..(r + 1) * h];
            let (mut v, mut m) = ([0.0f64; NR], [0.0f64; NR]);
            for p in 0..panels {
                K::tile(&q[p * d * MR..(p + 1) * d * MR], &kpanel, d, &mut c);
                let heads = &weights[p * MR..h.min((p + 1) * MR)];
                combine_heads(placement, heads, &c[..heads.len()], &scales, &mut v, &mut m);
            }
            finish(placement, &scales, &mut v, &mut m);
            store(o, tokens, &v, &m, cursor);
        }
    }
}

/// The comparison backends: a crate GEMM on the whole chunk, then a combine pass.
#[cfg(feature = "gemm-compare")]
mod crate_gemm {
    use super::*;

    pub(super) fn run(
        case: &Case,
        placement: ScalePlacement,
        table: &[f64; 256],
        task: &mut Task,
        backend: Backend,
    ) {
        let s = &case.shape;
        let (n, h, d) = (s.next_n, s.heads, s.head_dim);
        let t = task.tokens.len();
        let width = t.div_ceil(NR) * NR;
        // Keys D × width (row-major), scales per token.
        let mut keys = vec![0.0f64; d * width];
        let mut scales32 = vec![0f32; width];
        for (pi, toks) in task.tokens.chunks(NR).enumerate() {
            let mut panel = vec![0.0f64; d * NR];
            let mut sc = [0f32; NR];
            pack_keys(case, table, task.b, toks, NR, &mut panel, &mut sc);
            for dd in 0..d {
                keys[dd * width + pi * NR..dd * width + pi * NR + NR]
                    .copy_from_slice(&panel[dd * NR..dd * NR + NR]);
            }
            scales32[pi * NR..pi * NR + NR].copy_from_slice(&sc);
        }
        let mut cursors = vec![0usize; task.outs.len()];
        let mut dots = vec![0.0f64; h * width];
        for (o, cursor) in task.outs.iter_mut().zip(cursors.iter_mut()) {
            let r = task.b * n + o.i;
            let (b, i) = (r / n, r % n);
            // Queries H × D row-major.
            let q: Vec<f64> = (0..h)
                .flat_map(|hh| case.q_codes(b, i, hh).iter().map(|&c| table[c as usize]))
                .collect();
            match backend {
                Backend::MatrixMultiply => unsafe {
                    matrixmultiply::dgemm(
                        h,
                        d,
                        width,
                        1.0,
                        q.as_ptr(),
                        d as isize,
                        1,
                        keys.as_ptr(),
                        width as isize,
                        1,
                        0.0,
                        dots.as_mut_ptr(),
                        width as isize,
                        1,
                    )
                },
                Backend::Gemm => unsafe {
                    gemm::gemm(
                        h,
                        width,
                        d,
                        dots.as_mut_ptr(),
                        1,
                        width as isize,
                        false,
                        q.as_ptr(),
                        1,
                        d as isize,
                        keys.as_ptr(),
                        1,
                        width as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                },
                _ => unreachable!(),
            }
            let weights = &case.weights[r * h..(r + 1) * h];
            for (pi, toks) in task.tokens.chunks(NR).enumerate() {
                let scales: [f64; NR] = std::array::from_fn(|l| scales32[pi * NR + l] as f64);
                let (mut v, mut m) = ([0.0f64; NR], [0.0f64; NR]);
                let c: Vec<[f64; NR]> = (0..h)
                    .map(|hh| std::array::from_fn(|l| dots[hh * width + pi * NR + l]))
                    .collect();
                combine_heads(placement, weights, &c, &scales, &mut v, &mut m);
                finish(placement, &scales, &mut v, &mut m);
                store(o, toks, &v, &m, cursor);
            }
        }
    }
}
