// The exact GPU reference: the f64 reference of `reference::compute`, bit for bit.
//
// Every fp8 value is an integer times 2^-9 (fn) or 2^-10 (fnuz) below 2^18 in
// magnitude, so each product is an integer times 2^-18/2^-20 below 2^36 and every
// partial sum of up to 2^17 of them fits f64's 53 bits: the dot products are exact
// whatever the order, so the FP64 tensor cores (mma.sync f64) compute them.
// What is not exact — the weighted head sum and the final scale — is done exactly as
// on the CPU: heads in order 0..H-1, explicit _rn operations (no FMA contraction),
// ReLU that keeps NaN.
//
// Layout: CTA (4 warps) = (sequence, up to `chunks_per_cta` chunks of 4 * WT tokens).
// The queries of `nr` next_n rows at a time are decoded once per CTA into shared
// memory (4 bytes each: exact for fp8 values); each warp decodes the keys of its WT
// tokens of a chunk (ONT n-tiles of 8) into registers once and sweeps every row and
// head in m-tiles of 8 (or 16 with DW), staging the dots in shared memory; then each
// lane owns one token and sums the heads in order. Thread t of a quad owns dims
// t*D/4 .. t*D/4 + D/4 - 1 (k-step s -> dim t*D/4 + s); the queries are stored
// permuted (s*4 + t, rows padded to D+4) so the loads are conflict-free.
//
// Tuning defines, chosen per shape and device by the host (src/kernel/cuda/reference_tuning.rs;
// `bench gpu` times them, BENCHMARKS.md has the numbers). None changes a bit of the
// result: the dots are exact and the head sum keeps the order 0..H-1.
//   DW=1    the m16n8k16 f64 MMA of sm_90 (16 heads x 8 tokens x 16 dims per
//           instruction) instead of m8n8k4 (8 x 8 x 4): Hopper runs m8n8k4 at about
//           half its FP64 tensor rate. Needs MTG=2 and QV=1.
//   QHI=1   queries kept as the high word of their f64 (an fp8 value's low word is
//           zero): the operand is a register move, not an f32->f64 conversion on the
//           FP64 pipe the MMAs need.
//   KHI=1   the decoded keys held as high words too: 64 registers instead of 128,
//           so four CTAs per SM instead of two or three.
//   SPAD=1  staged dots padded by one double per token: the head sum's loads (lane =
//           token, stride 16 doubles) were 16-way bank conflicts; with the pad they
//           are conflict-free (ncu: shared memory had been the busiest unit).
//   ONT=4   32 tokens per warp: each query fragment feeds four MMAs, and the head sum
//           keeps all 32 lanes busy (twice the key registers).
//   QV=1    each lane's queries contiguous, four k-steps per 128-bit load (4-byte
//           queries, D 64/128).
//   MTG=2   two m-tiles of 8 heads per pass; QF64=1 queries as f64 in shared memory;
//   OMINB   CTAs per SM for the register budget; PIPE=1 double-buffered stage, so a
//           group's head sum overlaps the next group's MMAs.
//   IMMA=1  the dots on the integer tensor cores instead (sm_80+; D a multiple of 32, at
//           most 128; MTG=2): see "Integer dots" below.
//   KPF=1   (with IMMA, D a multiple of 64) each warp copies its next chunk's keys and
//           scales into shared memory (cp.async) while it computes this chunk, the
//           table ids loaded a chunk ahead: no warp waits on two dependent global loads
//           at each chunk (ncu: "long scoreboard" stalls from 16% to 5% of the samples).
//   NB      (with IMMA) n-tiles per accumulator pass, ONT by default: fewer accumulator
//           registers (5 * 4 * NB), so three CTAs fit an SM, for more query fragment loads.
//   SWZ=1   (with IMMA, no SPAD) the staged dots skewed in rows of 32: see SWZ below.
//   FLAT=1  a grid of one wave of CTAs, each an equal share of the chunks of all sequences
//           (chunk_prefix, from the host), instead of a CTA per (sequence, every
//           gridDim.x-th chunk): the last wave no longer runs on a few SMs (production
//           case, H100: 0.952 against 1.078 ms with the padded stage, BENCHMARKS.md).
//
// Integer dots (IMMA=1). An fp8 value times 2^9 (fn) or 2^10 (fnuz) is an integer v,
// |v| < 2^18. Split |v| into 7-bit limbs (bits 0-6, 7-13, 14-17), each carrying v's
// sign, so every limb is an int8 in [-127, 127] (the top one in [-15, 15]) and
// v = l0 + l1*2^7 + l2*2^14. A dot of D <= 128 such values is then
//   sum_{i,j} P_ij * 2^(7(i+j)),  P_ij = sum_d q_i[d] * k_j[d],
// nine m16n8k32 s8 MMAs per 32 dims with int32 accumulators, one accumulator per
// i+j (S0..S4: |S0| < 2^21, |S1| < 2^22.1, |S2| < 2^21.3, |S3| < 2^18.9, |S4| < 2^14.9
// at D = 128, so none can overflow), combined exactly as
//   T01 = S0 + S1*2^7 (< 2^29.1), T234 = S2 + S3*2^7 + S4*2^14 (< 2^29.1),
//   dot = (T234*2^14 + T01) * 2^-18 (or 2^-20): an integer below 2^44 made a double
// exactly, times a power of two — the same f64 the DMMAs give (the head sum takes the
// integer and applies the power of two once at the end: see exact_int_dot). The MMAs
// of a k-step are ordered so that no two into one accumulator are close (LIMB_I/J), and
// the query limbs sit in shared memory in fragment order (QFRAG). An fp8 NaN has no
// integer: its limbs are 0 and a flag says NaN. A NaN query sets its head's weight
// to NaN, a NaN key sets its token's sums to NaN: every head term is NaN then, exactly
// as a NaN dot makes it in the f64 path (w * relu(NaN) and NaN * relu(x) are both NaN).
// So an integer dot is never NaN, and when the scale comes after the head sum its ReLU
// is taken on the integer as it becomes a double (exact_int_dot): the head sum is then
// one multiply and two adds a term, no FP64 compare.

#ifndef DD
#define DD 128
#endif
#ifndef QF64
#define QF64 0
#endif
#ifndef MTG
#define MTG 1
#endif
#ifndef OMINB
#define OMINB 3
#endif
#ifndef PIPE
#define PIPE 0
#endif
#define OWARPS 4
// ONT n-tiles of 8 tokens per warp (WT tokens: one per lane in the head sum), OTOK
// tokens per CTA; SPAD pads each staged token's dots by one double, so the head sum's
// loads (lane = token) hit distinct banks instead of one.
#ifndef ONT
#define ONT 2
#endif
#define WT (8 * ONT)
#define OTOK (OWARPS * WT)
#ifndef SPAD
#define SPAD 0
#endif
#define KPT (DD / 4)
#ifndef QV
#define QV 0
#endif
#if QV
// Vector query loads: lane t4's KPT values contiguous (segment QSEG = KPT + 4 floats,
// row QRS = 4 * QSEG), read as float4; for D = 64 and 128 the 8 lanes of each
// 128-bit phase then start on 8 distinct 4-bank groups (conflict-free).
#define QSEG (KPT + 4)
#define QRS (4 * QSEG)
#else
#define QRS (DD + 4)
#endif
#ifndef QHI
#define QHI 0
#endif
#ifndef DW
#define DW 0
#endif
#if QF64 && QV
#error "vector query loads take 4-byte queries"
#endif
#if DW && (MTG != 2 || !QV)
#error "DW (m16n8k16) takes two head tiles of 8 and vector query loads"
#endif
#ifndef KHI
#define KHI 0
#endif
#ifndef IMMA
#define IMMA 0
#endif
#ifndef KPF
#define KPF 0
#endif
// NB n-tiles per accumulator pass of the integer path (ONT a multiple of it): fewer hold
// fewer accumulator registers (5 * 4 * NB), so more CTAs fit an SM, at the cost of loading
// each query fragment ONT / NB times.
#ifndef NB
#define NB ONT
#endif
#if ONT % NB != 0
#error "NB divides ONT"
#endif
#ifndef FLAT
#define FLAT 0
#endif
#if KPF && (!IMMA || KPT % 16 != 0)
#error "KPF (keys copied ahead) is a form of the integer path, D a multiple of 64"
#endif
#if IMMA && (MTG != 2 || QF64 || QHI || KHI || QV || DW || PIPE || DD % 32 != 0 || DD > 128)
#error "IMMA takes two head tiles of its own int8 limbs, no pipelining, D a multiple of 32 up to 128"
#endif
#if IMMA
// The query limbs in shared memory, in the order the MMAs read them: for next_n row ii,
// 16-head tile u, limb j and k-step s, lane L = g*4 + t4 holds its whole A fragment (heads
// u*16 + g and u*16 + 8 + g, dims t4*KPT + 8*s + 0..7) as 16 contiguous bytes, so one
// conflict-free 128-bit load gives the four registers of the MMA's A operand in order
// (two 64-bit loads per head had to be shuffled into place by four moves per MMA).
// Word w of the fragment: a[0] head g dims +0..3, a[1] head g+8 dims +0..3, a[2] head g
// dims +4..7, a[3] head g+8 dims +4..7.
#define KSTEPS (DD / 32)
// Query words each thread loads at once when it decodes the queries.
#define QLOADS 16
#define QFRAG(ii, u, j, s, L) (((((ii) * (H / 16) + (u)) * 3 + (j)) * KSTEPS + (s)) * 32 + (L))
#endif
#define SHEADS (8 * MTG)
// SWZ=1 (integer path, no SPAD): each token's 16 staged dots start skewed by a function
// of the token within a row of 32 slots, so that both the MMA epilogue's stores (lanes: 4
// tokens x 8 heads) and the head sum's loads (lanes: 32 tokens, one head) are free of
// bank conflicts; with SPAD=1 the loads are, but each store is 2-way conflicted (ncu:
// about half the shared store wavefronts). The skew is added, not XORed, so every address
// is a lane's base plus an immediate (an XOR took registers: ptxas spilled).
#ifndef SWZ
#define SWZ 0
#endif
#if SWZ && (SPAD || !IMMA || MTG != 2)
#error "SWZ takes the integer path's 16 staged heads a token, unpadded"
#endif
#if SWZ
#define SROW 32
// Token bits 1-2 to skew bits 2-3, bit 0 to bit 0, bit 3 to bit 1: a bijection of 16
// tokens, and the 4 tokens of a store (bits 1-2) 4 slots apart.
#define STAGE_SLOT(tok, head) ((tok) * SROW + (head) + ((((tok) >> 1) & 3) << 2 | ((tok) & 1) | (((tok) >> 2) & 2)))
#else
#define SROW (SHEADS + SPAD)
#define STAGE_SLOT(tok, head) ((tok) * SROW + (head))
#endif
// How a decoded key sits in registers: as its f64, or (KHI) as the f64's high word,
// which halves the registers the keys hold (the operand is rebuilt by a move).
#if KHI
typedef unsigned kelem;
#define KSTORE(d) ((unsigned)__double2hiint(d))
#define KVAL(x) __hiloint2double((int)(x), 0)
#else
typedef double kelem;
#define KSTORE(d) (d)
#define KVAL(x) (x)
#endif
// How a decoded query sits in shared memory and becomes an f64 operand.
#if QF64
typedef double qelem;
#define QSTORE(f) ((double)(f))
#define QVAL(x) (x)
#elif QHI
// The high word of the f64: an fp8 value has at most 4 significant bits, so the low
// word of its f64 is zero and the operand is built with a register move, not a
// conversion on the FP64 pipe the DMMAs need.
typedef unsigned qelem;
typedef uint4 qvec4;
#define QSTORE(f) ((unsigned)__double2hiint((double)(f)))
#define QVAL(x) __hiloint2double((int)(x), 0)
#else
typedef float qelem;
typedef float4 qvec4;
#define QSTORE(f) ((float)(f))
#define QVAL(x) ((double)(x))
#endif

__device__ __forceinline__ void dmma(double* c, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
}

#if IMMA
// m16n8k32 s8 (sm_80+): A rows g (a[0], a[2]) and g+8 (a[1], a[3]), k = 4*t4 + 0..3 in
// a[0], a[1] and 16 + 4*t4 + 0..3 in a[2], a[3]; B column g, the same k in b[0], b[1];
// C rows g (c0, c1) and g+8 (c2, c3), columns 2*t4 + {0, 1}. As for the f64 MMA, which
// dimension a k is does not matter as long as A and B agree: lane t4's k-slots of
// k-step s are dims t4*KPT + 8*s + 0..7.
__device__ __forceinline__ void imma(int* c, const u32* a, const u32* b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The limbs of one fp8 code (ltab entry: l0, l1, l2 as bytes 0-2, byte 3 nonzero for
// NaN) from the decode table's float: exact, the float is an integer times 2^-9/2^-10.
__device__ __forceinline__ u32 limb_entry(float f, int fnuz) {
    if (f != f) return 0xFF000000u;
    const int v = (int)(f * (fnuz ? 1024.0f : 512.0f));
    const int m = v < 0 ? -v : v;
    int l0 = m & 127, l1 = (m >> 7) & 127, l2 = m >> 14;
    if (v < 0) { l0 = -l0; l1 = -l1; l2 = -l2; }
    return (u32)(l0 & 0xFF) | ((u32)(l1 & 0xFF) << 8) | ((u32)(l2 & 0xFF) << 16);
}

// Four codes (one 32-bit word) to their limbs: l[j] holds limb j of the four codes,
// byte e for code e, the order an MMA fragment register takes. Returns the NaN flags.
__device__ __forceinline__ u32 split_limbs(const u32* ltab, u32 w, u32* l) {
    const u32 e0 = ltab[w & 0xFF], e1 = ltab[(w >> 8) & 0xFF], e2 = ltab[(w >> 16) & 0xFF], e3 = ltab[w >> 24];
    const u32 a = __byte_perm(e0, e1, 0x5140), b = __byte_perm(e2, e3, 0x5140);  // l0 l0' l1 l1'
    const u32 c = __byte_perm(e0, e1, 0x7362), d = __byte_perm(e2, e3, 0x7362);  // l2 l2' nan nan'
    l[0] = __byte_perm(a, b, 0x5410);
    l[1] = __byte_perm(a, b, 0x7632);
    l[2] = __byte_perm(c, d, 0x5410);
    return (e0 | e1 | e2 | e3) >> 24;
}

// Sixteen key bytes (dims 8*s .. 8*s + 15 of a lane's share: k-steps s and s+1) to the
// limbs of that token tile's B fragments kbn[s][j][h2]. Returns the NaN flags.
__device__ __forceinline__ u32 split_key16(const u32* ltab, uint4 w, u32 (*kbn)[3][2], int s) {
    const u32 ws[4] = {w.x, w.y, w.z, w.w};
    u32 nan = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        u32 l[3];
        nan |= split_limbs(ltab, ws[e], l);
#pragma unroll
        for (int j = 0; j < 3; j++) kbn[s + (e >> 1)][j][e & 1] = l[j];
    }
    return nan;
}

// T234 * 2^14 + T01 as a double, exactly: the integer is below 2^44, so it sits in the
// mantissa of 1.5 * 2^52 + t. The dot is this times `unit` (2^-18 or 2^-20); the head
// sum takes the integer and applies `unit` once at the end, which gives the same bits:
// every product and sum of the head sum is scaled by the same power of two, and none
// comes near f64's subnormals or overflow (|dot| < 2^44, the f32 weight and scale
// within 2^+-149: every nonzero term is above 2^-320, below 2^220).
// relu_mask -1: the ReLU is taken here, on the integer (the scale comes after the head
// sum, so relu(dot) is the dot's own ReLU: a negative integer becomes +0.0, as
// relu_keep_nan_d makes it; an integer dot is never NaN), which spares the head sum an
// FP64 compare and two selects a term. 0: the dot as it is. The bias's low word is zero,
// so it is added to the high word alone.
__device__ __forceinline__ double exact_int_dot(int t01, int t234, int relu_mask) {
    const i64 t = ((i64)t234 << 14) + (i64)t01;
    const int hi = (int)(t >> 32), lo = (int)t;
    const int drop = (hi >> 31) & relu_mask;
    return __dsub_rn(__hiloint2double((hi & ~drop) + 0x43380000, lo & ~drop), 6755399441055744.0);
}

// The order of the nine limb products (i, j) of a k-step, as nibbles: the MMAs into
// one accumulator (i + j) are at least four pairs apart (sums 2 1 3 0 2 1 3 4 2), so a
// warp issues them back to back without waiting for an MMA's result.
#define LIMB_I 0x222110100u
#define LIMB_J 0x021010212u

// Asynchronous copies into shared memory (sm_80+), for the next chunk's keys.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
#endif

#if DW
// m16n8k16 (sm_90+): A rows g (a[0,2,4,6]) and g+8 (a[1,3,5,7]) at k = t4 + 4j for
// a[2j], a[2j+1] and b[j]; C rows g (c0, c1) and g+8 (c2, c3), columns 2*t4 + {0, 1}.
// Which dimension a k is does not matter (the dots are exact in any order) as long as
// A and B agree: here k = t4 + 4j is dimension t4*KPT + s + j, as for the m8n8k4 form.
__device__ __forceinline__ void dmma16(double* lo, double* hi, const double* a, const double* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
                 : "+d"(lo[0]), "+d"(lo[1]), "+d"(hi[0]), "+d"(hi[1])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                   "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}
#endif

// value/mag: compact rows (row r starts at row_off[r]); inside: 1 for InsideRelu;
// nr: next_n rows whose queries fit shared memory at once; chunk_prefix (FLAT): the
// chunks before each sequence, batch + 1 of them (null otherwise). Heads must be a
// multiple of 8 * MTG.
extern "C" __global__ void __launch_bounds__(OWARPS * 32, OMINB) reference_f64(const Params p, const u64* row_off, double* value, double* mag, int inside, int nr,
                                                                             const int* chunk_prefix) {
    extern __shared__ __align__(16) double osm[];
    const int H = p.heads;
    double* tab = osm;                             // 256
    double* wd = tab + 256;                        // nr * H
#if IMMA
    // Each row's output offset and V(r) length, read once per block of rows.
    u64* soff = (u64*)(wd + nr * H);               // nr
    int* slen = (int*)(soff + nr);                 // nr (in nr u64s)
    double* stage = (double*)(soff + 2 * nr);      // OWARPS * (1 + PIPE) * WT tokens * SROW
#else
    double* stage = wd + nr * H;                   // OWARPS * (1 + PIPE) * WT tokens * SROW
#endif
    qelem* qf = (qelem*)(stage + OWARPS * (1 + PIPE) * WT * SROW);  // nr * H rows of QRS (permuted)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#if IMMA
    u32* ltab = (u32*)tab;  // 256 limb entries in the decode table's place
    for (int k = threadIdx.x; k < 256; k += blockDim.x) ltab[k] = limb_entry(p.decode[(p.fnuz ? 256 : 0) + k], p.fnuz);
    const double unit = p.fnuz ? 1.0 / 1048576.0 : 1.0 / 262144.0;
    const int relu_mask = inside ? 0 : -1;  // the ReLU on the integer dots (exact_int_dot)
    u8* qb = (u8*)qf;
    // Keys by 128-bit loads where every block starts 16-byte aligned (a padded block
    // stride may leave it 4-byte aligned only).
    const bool kvec = (((u64)p.kv | (u64)p.kv_stride) & 15) == 0;
#if KPF
    // Keys copied ahead: this warp's next chunk, as the raw bytes each lane will split
    // (word e of lane L's 16-byte piece q of n-tile n at kpw[(n * KPT/16 + q) * 128 + L * 4
    // + e], so the read back is one conflict-free 128-bit load), and each lane's scale.
    u32* kpw = (u32*)(qb + nr * H * 3 * DD) + warp * (ONT * KPT * 8);
    float* ksc = (float*)((u32*)(qb + nr * H * 3 * DD) + OWARPS * ONT * KPT * 8) + warp * 32;
#endif
#else
    for (int k = threadIdx.x; k < 256; k += blockDim.x) tab[k] = (double)p.decode[(p.fnuz ? 256 : 0) + k];
#endif
#if FLAT
    // This CTA's share of all the chunks, sequence after sequence (chunk_prefix[b]: the
    // chunks before sequence b), as equal as whole chunks allow. A share spans one
    // sequence or a few; the queries are decoded for each.
    const int all_chunks = chunk_prefix[p.batch];
    const int g_begin = (int)((i64)blockIdx.x * all_chunks / gridDim.x);
    const int g_end = (int)((i64)(blockIdx.x + 1) * all_chunks / gridDim.x);
    int b_first = 0, b_hi = p.batch - 1;  // the last sequence whose chunks start at or before g_begin
    while (b_first < b_hi) {
        const int mid = (b_first + b_hi + 1) / 2;
        if (chunk_prefix[mid] <= g_begin) b_first = mid; else b_hi = mid - 1;
    }
    for (int b = b_first; b < p.batch && chunk_prefix[b] < g_end; b++) {
        const int stok = seq_tokens(p, b);
        const int c_first = max(g_begin - chunk_prefix[b], 0), c_step = 1;
        const int c_end = min(g_end, chunk_prefix[b + 1]) - chunk_prefix[b];
        if (c_first >= c_end) continue;  // uniform: no chunk of this sequence here
#else
    for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
        const int stok = seq_tokens(p, b);
        // Chunks blockIdx.x, + gridDim.x, ... of sequence b.
        const int c_first = blockIdx.x, c_step = gridDim.x, c_end = (stok + OTOK - 1) / OTOK;
        if (c_first >= c_end) continue;  // uniform: no chunk of this sequence here
#endif
        for (int i0 = 0; i0 < p.next_n; i0 += nr) {
            const int rows_here = min(nr, p.next_n - i0);
            __syncthreads();
#if KPF
            // The next chunk's keys: the table ids first (pf_ids), the copies once they
            // have arrived (pf_copy, after a group's MMAs), so neither load stalls the warp.
            int nid[ONT], nsid = 0;
            auto pf_ids = [&](int cn) {
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = cn * OTOK + warp * WT + n * 8 + g;
                    if (tok < stok) nid[n] = p.table[(i64)b * p.table_stride + tok / p.block_size];
                }
                const int st = cn * OTOK + warp * WT + lane;
                if (lane < WT && st < stok) nsid = p.table[(i64)b * p.table_stride + st / p.block_size];
            };
            auto pf_copy = [&](int cn) {
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = cn * OTOK + warp * WT + n * 8 + g;
                    u32* dst = kpw + n * (KPT / 16) * 128 + lane * 4;
                    if (tok < stok) {
                        const u8* blk = p.kv + (u64)((i64)nid[n] * (i64)p.kv_stride);
                        const int slot = tok % p.block_size;
#pragma unroll
                        for (int q = 0; q < KPT / 16; q++) {
                            // 16 dims from a multiple of 16: contiguous in both layouts.
                            const u8* src = blk + value_offset(p.layout, DD, slot, t4 * KPT + 16 * q);
                            if (kvec) {
                                cp_async16(dst + q * 128, src);
                            } else {
#pragma unroll
                                for (int e = 0; e < 4; e++) cp_async4(dst + q * 128 + e, src + 4 * e);
                            }
                        }
                    } else {
#pragma unroll
                        for (int q = 0; q < KPT / 16; q++) *(uint4*)(dst + q * 128) = make_uint4(0, 0, 0, 0);
                    }
                }
                const int st = cn * OTOK + warp * WT + lane;
                if (lane < WT && st < stok) {
                    const u8* blk = p.kv + (u64)((i64)nsid * (i64)p.kv_stride);
                    cp_async4(ksc + lane, blk + (u64)p.block_size * DD + 4 * (u64)(st % p.block_size));
                } else {
                    ksc[lane] = 0.0f;
                }
                cp_async_commit();
            };
            // The first chunk's copies overlap the query decode below.
            pf_ids(c_first);
            pf_copy(c_first);
#endif
            // Four codes per 32-bit load (D % 16 == 0: they share a row and a lane's
            // segment), several loads in flight: a byte-wise loop waited out one global
            // latency per code, which made short chunks per CTA expensive.
            const u8* qsrc = p.q + ((u64)(b * p.next_n + i0) * H) * DD;
            for (int e = threadIdx.x; e < rows_here * H; e += blockDim.x) wd[e] = (double)p.weights[(u64)(b * p.next_n + i0) * H + e];
#if IMMA
            __syncthreads();  // the weights first: a NaN query below sets its head's to NaN
            // QLOADS words per thread loaded before any is split: the loads are in flight
            // together (split one by one, each waited out its own global latency: ncu put
            // 13% of the kernel's stall samples in this loop).
            const int qbytes = rows_here * H * DD;
            for (int e0 = threadIdx.x * 4; e0 < qbytes; e0 += blockDim.x * 4 * QLOADS) {
                u32 qw[QLOADS];
#pragma unroll
                for (int k = 0; k < QLOADS; k++) {
                    const int e = e0 + k * blockDim.x * 4;
                    qw[k] = e < qbytes ? *(const u32*)(qsrc + e) : 0u;
                }
#pragma unroll
                for (int k = 0; k < QLOADS; k++) {
                    const int e = e0 + k * blockDim.x * 4;
                    if (e >= qbytes) break;
                    const int row = e / DD, d = e % DD;  // row = ii*H + h
                    u32 l[3];
                    if (split_limbs(ltab, qw[k], l)) wd[row] = __longlong_as_double(0x7ff8000000000000LL);
                    const int ii = row / H, h = row % H, ft = d / KPT, fs = (d % KPT) >> 3, fh = (d >> 2) & 1;
                    u32* dst = (u32*)qb + 4 * QFRAG(ii, h >> 4, 0, fs, (h & 7) * 4 + ft) + fh * 2 + ((h >> 3) & 1);
#pragma unroll
                    for (int j = 0; j < 3; j++) dst[j * KSTEPS * 32 * 4] = l[j];
                }
            }
            for (int ii = threadIdx.x; ii < rows_here; ii += blockDim.x) {
                const int r = b * p.next_n + i0 + ii;
                soff[ii] = row_off[r];
                slen[ii] = valid_len(p, r);
            }
#else
#pragma unroll 4
            for (int e = threadIdx.x * 4; e < rows_here * H * DD; e += blockDim.x * 4) {
                const u32 w = *(const u32*)(qsrc + e);
                const int row = e / DD, d = e % DD;  // row = ii*H + h
                const int t = d / KPT, s = d % KPT;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const double f = tab[(w >> (8 * j)) & 0xFF];
#if QV
                    qf[row * QRS + t * QSEG + s + j] = QSTORE(f);
#else
                    qf[row * QRS + (s + j) * 4 + t] = QSTORE(f);
#endif
                }
            }
#endif
            __syncthreads();
            for (int c = c_first; c < c_end; c += c_step) {
#if IMMA
                // Keys of this warp's WT tokens as limbs: kb[n][s][j] is B fragment of
                // limb j, k-step s, n-tile n. my_nan: the key of this lane's token (the
                // head sum's) has a NaN code; ballots gather it from the four lanes
                // holding that token's dims.
                u32 kb[ONT][KPT / 8][3][2];
                bool my_nan = false;
#if KPF
                cp_async_wait_all();  // this lane's own copies: it reads only those
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    u32 nan = 0;
#pragma unroll
                    for (int q = 0; q < KPT / 16; q++)
                        nan |= split_key16(ltab, *(const uint4*)(kpw + (n * (KPT / 16) + q) * 128 + lane * 4), kb[n], 2 * q);
                    const u32 bal = __ballot_sync(0xffffffffu, nan != 0);
                    if ((lane >> 3) == n) my_nan = ((bal >> ((lane & 7) * 4)) & 0xF) != 0;
                }
                const int cn = c + c_step;
                bool pf_pending = cn < c_end;
                if (pf_pending) pf_ids(cn);
#else
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = c * OTOK + warp * WT + n * 8 + g;
                    u32 nan = 0;
                    if (tok < stok) {
                        const int id = p.table[(i64)b * p.table_stride + tok / p.block_size];
                        const int slot = tok % p.block_size;
                        const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
#if KPT % 16 == 0
                        if (kvec) {
                            // 16 bytes (two k-steps) per load: contiguous in both layouts.
#pragma unroll
                            for (int s = 0; s < KPT / 8; s += 2)
                                nan |= split_key16(ltab, *(const uint4*)(blk + value_offset(p.layout, DD, slot, t4 * KPT + 8 * s)), kb[n], s);
                        } else
#endif
                        {
#pragma unroll
                            for (int s = 0; s < KPT / 8; s++)
#pragma unroll
                                for (int h2 = 0; h2 < 2; h2++) {
                                    u32 l[3];
                                    nan |= split_limbs(ltab, *(const u32*)(blk + value_offset(p.layout, DD, slot, t4 * KPT + 8 * s + 4 * h2)), l);
#pragma unroll
                                    for (int j = 0; j < 3; j++) kb[n][s][j][h2] = l[j];
                                }
                        }
                    } else {
#pragma unroll
                        for (int s = 0; s < KPT / 8; s++)
#pragma unroll
                            for (int j = 0; j < 3; j++) { kb[n][s][j][0] = 0; kb[n][s][j][1] = 0; }
                    }
                    const u32 bal = __ballot_sync(0xffffffffu, nan != 0);
                    if ((lane >> 3) == n) my_nan = ((bal >> ((lane & 7) * 4)) & 0xF) != 0;
                }
#endif
#else
                // Keys of this warp's WT tokens, decoded to f64.
                kelem kd[ONT][KPT];
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = c * OTOK + warp * WT + n * 8 + g;
                    if (tok < stok) {
                        const int id = p.table[(i64)b * p.table_stride + tok / p.block_size];
                        const int slot = tok % p.block_size;
                        const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
#pragma unroll
                        for (int s = 0; s < KPT; s += 4) {
                            const u32 w = *(const u32*)(blk + value_offset(p.layout, DD, slot, t4 * KPT + s));
#pragma unroll
                            for (int e = 0; e < 4; e++) kd[n][s + e] = KSTORE(tab[(w >> (8 * e)) & 0xFF]);
                        }
                    } else {
#pragma unroll
                        for (int s = 0; s < KPT; s++) kd[n][s] = KSTORE(0.0);
                    }
                }
#endif
                // Lanes 0..WT-1 of each warp own one token each for the combine.
                const int my_tok = c * OTOK + warp * WT + lane;
                double my_scale = 0.0;
                if (lane < WT && my_tok < stok) {
#if KPF
                    my_scale = (double)ksc[lane];
#else
                    const int id = p.table[(i64)b * p.table_stride + my_tok / p.block_size];
                    const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
                    my_scale = (double)*(const float*)(blk + (u64)p.block_size * DD + 4 * (u64)(my_tok % p.block_size));
#endif
                }
                for (int ii = 0; ii < rows_here; ii++) {
                    const int r = b * p.next_n + i0 + ii;
#if IMMA
                    const int len = slen[ii];
#else
                    const int len = valid_len(p, r);
#endif
                    if (c * OTOK + warp * WT >= len) continue;  // uniform per warp
                    double v = 0.0, m = 0.0;
                    // Head sum of the m-tile group whose dots are staged in `sb`, in head
                    // order (lanes 0..15: one token each).
                    auto combine = [&](const double* sb, int mt) {
                        if (lane < WT) {
#if IMMA
                            // The dots staged with their ReLU taken when the scale comes
                            // after the sum (exact_int_dot): two loops, so that path has
                            // no compare left.
                            if (!inside) {
                                // The weights two at a time (one broadcast 128-bit load).
                                const double2* w2 = (const double2*)(wd + ii * H + mt * 8);
#pragma unroll
                                for (int hh = 0; hh < SHEADS; hh += 2) {
                                    const double2 w = w2[hh / 2];
                                    const double t0 = __dmul_rn(w.x, sb[STAGE_SLOT(lane, hh)]);
                                    v = __dadd_rn(v, t0);
                                    m = __dadd_rn(m, fabs(t0));
                                    const double t1 = __dmul_rn(w.y, sb[STAGE_SLOT(lane, hh + 1)]);
                                    v = __dadd_rn(v, t1);
                                    m = __dadd_rn(m, fabs(t1));
                                }
                                return;
                            }
#endif
#pragma unroll
                            for (int hh = 0; hh < SHEADS; hh++) {
                                const double dot = sb[STAGE_SLOT(lane, hh)];
                                const double w = wd[ii * H + mt * 8 + hh];
                                double t = inside ? __dmul_rn(w, relu_keep_nan_d(__dmul_rn(dot, my_scale)))
                                                  : __dmul_rn(w, relu_keep_nan_d(dot));
                                v = __dadd_rn(v, t);
                                m = __dadd_rn(m, fabs(t));
                            }
                        }
                    };
                    double* st0 = stage + warp * (1 + PIPE) * WT * SROW;
                    for (int mt = 0; mt < H / 8; mt += MTG) {
#if IMMA
                        double* st = st0;
                        // NB n-tiles per pass: acc[i + j][n] sums limb-i queries times limb-j
                        // keys of n-tile n0 + n (fewer passes reload fewer query fragments,
                        // more hold more accumulators).
#pragma unroll
                        for (int n0 = 0; n0 < ONT; n0 += NB) {
                            int acc[5][NB][4];
#pragma unroll
                            for (int i = 0; i < 5; i++)
#pragma unroll
                                for (int n = 0; n < NB; n++) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0;
#pragma unroll
                            for (int s = 0; s < KPT / 8; s++) {
                                u32 a[3][4];
#pragma unroll
                                for (int i = 0; i < 3; i++) {
                                    const uint4 f = ((const uint4*)qb)[QFRAG(ii, mt / 2, i, s, lane)];
                                    a[i][0] = f.x; a[i][1] = f.y; a[i][2] = f.z; a[i][3] = f.w;
                                }
#pragma unroll
                                for (int q = 0; q < 9; q++) {
                                    const int i = (LIMB_I >> (4 * q)) & 0xF, j = (LIMB_J >> (4 * q)) & 0xF;
#pragma unroll
                                    for (int n = 0; n < NB; n++) imma(acc[i + j][n], a[i], kb[n0 + n][s][j]);
                                }
                            }
#if KPF
                            if (pf_pending) {  // the table ids have had the MMAs' time to arrive
                                pf_copy(cn);
                                pf_pending = false;
                            }
#endif
                            // acc[.][n][x]: head mt*8 + g (x = 0, 1) or + 8 (x = 2, 3), token
                            // (n0 + n)*8 + 2*t4 + (x & 1).
#pragma unroll
                            for (int n = 0; n < NB; n++)
#pragma unroll
                                for (int x = 0; x < 4; x++) {
                                    const int t01 = acc[0][n][x] + acc[1][n][x] * 128;
                                    const int t234 = acc[2][n][x] + acc[3][n][x] * 128 + acc[4][n][x] * 16384;
                                    st[STAGE_SLOT((n0 + n) * 8 + 2 * t4 + (x & 1), (x >> 1) * 8 + g)] = exact_int_dot(t01, t234, relu_mask);
                                }
                        }
                        __syncwarp();
#if !PIPE
                        combine(st, mt);
                        __syncwarp();
#endif
#else
                        double acc[MTG][ONT][2];
#pragma unroll
                        for (int u = 0; u < MTG; u++)
#pragma unroll
                            for (int n = 0; n < ONT; n++) { acc[u][n][0] = 0.0; acc[u][n][1] = 0.0; }
#if DW
                        // Heads mt*8 + g and mt*8 + 8 + g: two 128-bit loads feed one
                        // m16n8k16 per n-tile (four k-steps of each lane).
                        const qelem* qrow = qf + (ii * H + mt * 8 + g) * QRS + t4 * QSEG;
#pragma unroll
                        for (int s = 0; s < KPT; s += 4) {
                            const qvec4 lo = *(const qvec4*)(qrow + s);
                            const qvec4 hi = *(const qvec4*)(qrow + 8 * QRS + s);
                            const double a[8] = {QVAL(lo.x), QVAL(hi.x), QVAL(lo.y), QVAL(hi.y),
                                                 QVAL(lo.z), QVAL(hi.z), QVAL(lo.w), QVAL(hi.w)};
#pragma unroll
                            for (int n = 0; n < ONT; n++) {
                                const double bk[4] = {KVAL(kd[n][s]), KVAL(kd[n][s + 1]), KVAL(kd[n][s + 2]), KVAL(kd[n][s + 3])};
                                dmma16(acc[0][n], acc[1][n], a, bk);
                            }
                        }
#elif QV
                        // One 128-bit load feeds four k-steps (MTG == 1).
                        const qelem* qrow = qf + (ii * H + mt * 8 + g) * QRS + t4 * QSEG;
#pragma unroll
                        for (int s = 0; s < KPT; s += 4) {
                            const qvec4 a4 = *(const qvec4*)(qrow + s);
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], QVAL(a4.x), KVAL(kd[n][s]));
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], QVAL(a4.y), KVAL(kd[n][s + 1]));
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], QVAL(a4.z), KVAL(kd[n][s + 2]));
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], QVAL(a4.w), KVAL(kd[n][s + 3]));
                        }
#else
                        const qelem* qrow = qf + (ii * H + mt * 8 + g) * QRS + t4;
#pragma unroll
                        for (int s = 0; s < KPT; s++) {
#pragma unroll
                            for (int u = 0; u < MTG; u++) {
                                const double a = QVAL(qrow[u * 8 * QRS + s * 4]);
#pragma unroll
                                for (int n = 0; n < ONT; n++) dmma(acc[u][n], a, KVAL(kd[n][s]));
                            }
                        }
#endif
#if PIPE
                        // Software pipelining: the previous group's head sum runs while
                        // this group's DMMAs drain; its dots sit in the other buffer.
                        double* st = st0 + ((mt / MTG) & 1) * WT * SROW;
                        if (mt > 0) combine(st0 + (((mt / MTG) - 1) & 1) * WT * SROW, mt - MTG);
#else
                        double* st = st0;
#endif
                        // acc[u][n][j] = dot(head (mt+u)*8+g, token n*8 + 2*t4 + j)
#pragma unroll
                        for (int u = 0; u < MTG; u++)
#pragma unroll
                            for (int n = 0; n < ONT; n++) {
                                st[(n * 8 + 2 * t4) * SROW + u * 8 + g] = acc[u][n][0];
                                st[(n * 8 + 2 * t4 + 1) * SROW + u * 8 + g] = acc[u][n][1];
                            }
                        __syncwarp();
#if !PIPE
                        combine(st, mt);
                        __syncwarp();
#endif
#endif
                    }
#if PIPE
                    {
                        const int last = H / 8 - MTG;
                        combine(st0 + ((last / MTG) & 1) * WT * SROW, last);
                        __syncwarp();
                    }
#endif
#if IMMA
                    // The head sum took the dots as integers: scale by `unit` (exact).
                    v = __dmul_rn(v, unit);
                    m = __dmul_rn(m, unit);
                    if (my_nan) v = m = __longlong_as_double(0x7ff8000000000000LL);
#endif
                    if (lane < WT && my_tok < len) {
#if IMMA
                        const u64 o = soff[ii] + my_tok;
#else
                        const u64 o = row_off[r] + my_tok;
#endif
                        value[o] = inside ? v : __dmul_rn(v, my_scale);
                        mag[o] = inside ? m : __dmul_rn(m, fabs(my_scale));
                    }
                }
#if KPF
                if (pf_pending) pf_copy(cn);  // no row of this chunk had tokens for this warp
#endif
            }
        }
    }
}
