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
// exactly, times a power of two — the same f64 the DMMAs give. An fp8 NaN has no
// integer: its limbs are 0 and a flag says NaN. A NaN query sets its head's weight
// to NaN, a NaN key sets its token's sums to NaN: every head term is NaN then, exactly
// as a NaN dot makes it in the f64 path (w * relu(NaN) and NaN * relu(x) are both NaN).

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
#if IMMA && (MTG != 2 || QF64 || QHI || KHI || QV || DW || PIPE || DD % 32 != 0 || DD > 128)
#error "IMMA takes two head tiles of its own int8 limbs, no pipelining, D a multiple of 32 up to 128"
#endif
#if IMMA
// Bytes of one head's query limbs in shared memory: limb l of dims t*KPT + s at
// l*DD + t*KPT + s; padded so that the 8-byte fragment loads of a half warp (heads g,
// lanes t4) fall on distinct banks at D = 128.
#define QRSB (3 * DD + 8)
#endif
#define SHEADS (8 * MTG)
#define SROW (SHEADS + SPAD)
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
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
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

// (T234 * 2^14 + T01) * unit as a double, exactly: the integer is below 2^44, so it sits
// in the mantissa of 1.5 * 2^52 + t, and unit is a power of two.
__device__ __forceinline__ double exact_dot(int t01, int t234, double unit) {
    const i64 t = ((i64)t234 << 14) + (i64)t01;
    return __dmul_rn(__dsub_rn(__longlong_as_double(t + 0x4338000000000000LL), 6755399441055744.0), unit);
}
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
// nr: next_n rows whose queries fit shared memory at once. Heads must be a multiple
// of 8 * MTG.
extern "C" __global__ void __launch_bounds__(OWARPS * 32, OMINB) reference_f64(const Params p, const u64* row_off, double* value, double* mag, int inside, int nr) {
    extern __shared__ __align__(16) double osm[];
    const int H = p.heads;
    double* tab = osm;                             // 256
    double* wd = tab + 256;                        // nr * H
    double* stage = wd + nr * H;                   // OWARPS * (1 + PIPE) * WT tokens * SROW
    qelem* qf = (qelem*)(stage + OWARPS * (1 + PIPE) * WT * SROW);  // nr * H rows of QRS (permuted)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#if IMMA
    u32* ltab = (u32*)tab;  // 256 limb entries in the decode table's place
    for (int k = threadIdx.x; k < 256; k += blockDim.x) ltab[k] = limb_entry(p.decode[(p.fnuz ? 256 : 0) + k], p.fnuz);
    const double unit = p.fnuz ? 1.0 / 1048576.0 : 1.0 / 262144.0;
    u8* qb = (u8*)qf;
#else
    for (int k = threadIdx.x; k < 256; k += blockDim.x) tab[k] = (double)p.decode[(p.fnuz ? 256 : 0) + k];
#endif
    for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
        const int stok = seq_tokens(p, b);
        if ((int)blockIdx.x * OTOK >= stok) continue;  // uniform: no chunk of this sequence here
        for (int i0 = 0; i0 < p.next_n; i0 += nr) {
            const int rows_here = min(nr, p.next_n - i0);
            __syncthreads();
            // Four codes per 32-bit load (D % 16 == 0: they share a row and a lane's
            // segment), several loads in flight: a byte-wise loop waited out one global
            // latency per code, which made short chunks per CTA expensive.
            const u8* qsrc = p.q + ((u64)(b * p.next_n + i0) * H) * DD;
            for (int e = threadIdx.x; e < rows_here * H; e += blockDim.x) wd[e] = (double)p.weights[(u64)(b * p.next_n + i0) * H + e];
#if IMMA
            __syncthreads();  // the weights first: a NaN query below sets its head's to NaN
#pragma unroll 4
            for (int e = threadIdx.x * 4; e < rows_here * H * DD; e += blockDim.x * 4) {
                const int row = e / DD, d = e % DD;  // row = ii*H + h
                u32 l[3];
                if (split_limbs(ltab, *(const u32*)(qsrc + e), l)) wd[row] = __longlong_as_double(0x7ff8000000000000LL);
                u8* dst = qb + row * QRSB + d;  // limb j of dim d at j*DD + d
#pragma unroll
                for (int j = 0; j < 3; j++) *(u32*)(dst + j * DD) = l[j];
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
            for (int c = blockIdx.x; c * OTOK < stok; c += gridDim.x) {
#if IMMA
                // Keys of this warp's WT tokens as limbs: kb[n][s][j] is B fragment of
                // limb j, k-step s, n-tile n. my_nan: the key of this lane's token (the
                // head sum's) has a NaN code; ballots gather it from the four lanes
                // holding that token's dims.
                u32 kb[ONT][KPT / 8][3][2];
                bool my_nan = false;
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = c * OTOK + warp * WT + n * 8 + g;
                    u32 nan = 0;
                    if (tok < stok) {
                        const int id = p.table[(i64)b * p.table_stride + tok / p.block_size];
                        const int slot = tok % p.block_size;
                        const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
#pragma unroll
                        for (int s = 0; s < KPT / 8; s++)
#pragma unroll
                            for (int h2 = 0; h2 < 2; h2++) {
                                u32 l[3];
                                nan |= split_limbs(ltab, *(const u32*)(blk + value_offset(p.layout, DD, slot, t4 * KPT + 8 * s + 4 * h2)), l);
#pragma unroll
                                for (int j = 0; j < 3; j++) kb[n][s][j][h2] = l[j];
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
                    const int id = p.table[(i64)b * p.table_stride + my_tok / p.block_size];
                    const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
                    my_scale = (double)*(const float*)(blk + (u64)p.block_size * DD + 4 * (u64)(my_tok % p.block_size));
                }
                for (int ii = 0; ii < rows_here; ii++) {
                    const int r = b * p.next_n + i0 + ii;
                    const int len = valid_len(p, r);
                    if (c * OTOK + warp * WT >= len) continue;  // uniform per warp
                    double v = 0.0, m = 0.0;
                    // Head sum of the m-tile group whose dots are staged in `sb`, in head
                    // order (lanes 0..15: one token each).
                    auto combine = [&](const double* sb, int mt) {
                        if (lane < WT) {
#pragma unroll
                            for (int hh = 0; hh < SHEADS; hh++) {
                                const double dot = sb[lane * SROW + hh];
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
                        // acc[i + j][n]: sum of limb-i queries times limb-j keys.
                        int acc[5][ONT][4];
#pragma unroll
                        for (int i = 0; i < 5; i++)
#pragma unroll
                            for (int n = 0; n < ONT; n++) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0;
                        const u8* qrow = qb + (ii * H + mt * 8 + g) * QRSB + t4 * KPT;
#pragma unroll
                        for (int s = 0; s < KPT / 8; s++) {
                            u32 a[3][4];
#pragma unroll
                            for (int i = 0; i < 3; i++) {
                                const uint2 lo = *(const uint2*)(qrow + i * DD + 8 * s);
                                const uint2 hi = *(const uint2*)(qrow + 8 * QRSB + i * DD + 8 * s);
                                a[i][0] = lo.x; a[i][1] = hi.x; a[i][2] = lo.y; a[i][3] = hi.y;
                            }
#pragma unroll
                            for (int n = 0; n < ONT; n++)
#pragma unroll
                                for (int i = 0; i < 3; i++)
#pragma unroll
                                    for (int j = 0; j < 3; j++) imma(acc[i + j][n], a[i], kb[n][s][j]);
                        }
                        double* st = st0;
                        // acc[.][n][x]: head mt*8 + g (x = 0, 1) or + 8 (x = 2, 3), token
                        // n*8 + 2*t4 + (x & 1).
#pragma unroll
                        for (int n = 0; n < ONT; n++)
#pragma unroll
                            for (int x = 0; x < 4; x++) {
                                const int t01 = acc[0][n][x] + acc[1][n][x] * 128;
                                const int t234 = acc[2][n][x] + acc[3][n][x] * 128 + acc[4][n][x] * 16384;
                                st[(n * 8 + 2 * t4 + (x & 1)) * SROW + (x >> 1) * 8 + g] = exact_dot(t01, t234, unit);
                            }
                        __syncwarp();
                        combine(st, mt);
                        __syncwarp();
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
                    if (my_nan) v = m = __longlong_as_double(0x7ff8000000000000LL);
#endif
                    if (lane < WT && my_tok < len) {
                        const u64 o = row_off[r] + my_tok;
                        value[o] = inside ? v : __dmul_rn(v, my_scale);
                        mag[o] = inside ? m : __dmul_rn(m, fabs(my_scale));
                    }
                }
            }
        }
    }
}
