// The exact GPU oracle: the f64 reference of `reference::compute`, bit for bit.
//
// Every fp8 value is an integer times 2^-9 (fn) or 2^-10 (fnuz) below 2^18 in
// magnitude, so each product is an integer times 2^-18/2^-20 below 2^36 and every
// partial sum of up to 2^17 of them fits f64's 53 bits: the dot products are exact
// whatever the order, so the FP64 tensor cores (mma.sync m8n8k4 f64) compute them.
// What is not exact — the weighted head sum and the final scale — is done exactly as
// on the CPU: heads in order 0..H-1, explicit _rn operations (no FMA contraction),
// ReLU that keeps NaN.
//
// Layout: CTA (4 warps) = (sequence, up to OCH 64-token chunks). The queries of `nr`
// next_n rows at a time are decoded once per CTA into shared memory as f32 (exact for
// fp8 values; converted to f64 on load, which halves shared memory and so keeps three
// CTAs per SM); each warp decodes the keys of its 16 tokens of a chunk (two n-tiles of
// 8) to f64 registers once and sweeps every row and head in m-tiles of 8. Thread t of
// a quad owns dims t*D/4 .. t*D/4 + D/4 - 1 (k-step s -> dim t*D/4 + s); the queries
// are stored permuted (s*4 + t, rows padded to D+4) so the loads are conflict-free.
//
// Two tuning defines, chosen per shape by the host (src/kernel/cuda/oracle.rs):
// QF64=1 keeps the decoded queries in shared memory as f64 (no f32->f64 conversion in
// the inner loop, which competes with the DMMAs for the FP64 pipe; needs twice the
// shared memory, so only when one row of queries fits), MTG=2 sweeps two m-tiles of 8
// heads per pass (four independent accumulator chains instead of two, each query
// value loaded once per two DMMAs), OMINB=2 asks for two CTAs per SM instead of three
// (up to 255 registers: no spills with MTG=2), PIPE=1 double-buffers the staged dots so
// a group's head sum runs while the next group's DMMAs drain (ncu on v2: the DP tensor
// pipe was 64% busy, warps stalled on shared loads and the half-warp head sum), QV=1
// lays each lane's queries out contiguously and loads four k-steps with one float4
// (a quarter of the shared loads; f32 queries, one head tile, D 64/128). None
// changes a bit of the result: the
// dots are exact and the head sum keeps the order 0..H-1.

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
#define OTOK 64
#define ONT 2
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
#define SHEADS (8 * MTG)
#if QF64
typedef double qelem;
#else
typedef float qelem;
#endif

__device__ __forceinline__ void dmma(double* c, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
}

// value/mag: compact rows (row r starts at row_off[r]); inside: 1 for InsideRelu;
// nr: next_n rows whose queries fit shared memory at once. Heads must be a multiple
// of 8 * MTG.
extern "C" __global__ void __launch_bounds__(OWARPS * 32, OMINB) oracle_f64(const Params p, const u64* row_off, double* value, double* mag, int inside, int nr) {
    extern __shared__ __align__(16) double osm[];
    const int H = p.heads;
    double* tab = osm;                             // 256
    double* wd = tab + 256;                        // nr * H
    double* stage = wd + nr * H;                   // OWARPS * (1 + PIPE) * 16 tokens * SHEADS heads
    qelem* qf = (qelem*)(stage + OWARPS * (1 + PIPE) * 16 * SHEADS);  // nr * H rows of QRS (permuted)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    for (int k = threadIdx.x; k < 256; k += blockDim.x) tab[k] = (double)p.decode[(p.fnuz ? 256 : 0) + k];
    for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
        const int stok = seq_tokens(p, b);
        if ((int)blockIdx.x * OTOK >= stok) continue;  // uniform: no chunk of this sequence here
        for (int i0 = 0; i0 < p.next_n; i0 += nr) {
            const int rows_here = min(nr, p.next_n - i0);
            __syncthreads();
            for (int e = threadIdx.x; e < rows_here * H * DD; e += blockDim.x) {
                const int row = e / DD, d = e % DD;  // row = ii*H + h
                const int t = d / KPT, s = d % KPT;
#if QV
                qf[row * QRS + t * QSEG + s] = (qelem)p.decode[(p.fnuz ? 256 : 0) + p.q[((u64)(b * p.next_n + i0) * H) * DD + e]];
#else
                qf[row * QRS + s * 4 + t] = (qelem)p.decode[(p.fnuz ? 256 : 0) + p.q[((u64)(b * p.next_n + i0) * H) * DD + e]];
#endif
            }
            for (int e = threadIdx.x; e < rows_here * H; e += blockDim.x) wd[e] = (double)p.weights[(u64)(b * p.next_n + i0) * H + e];
            __syncthreads();
            for (int c = blockIdx.x; c * OTOK < stok; c += gridDim.x) {
                // Keys of this warp's 16 tokens, decoded to f64.
                double kd[ONT][KPT];
#pragma unroll
                for (int n = 0; n < ONT; n++) {
                    const int tok = c * OTOK + warp * 16 + n * 8 + g;
                    if (tok < stok) {
                        const int id = p.table[(i64)b * p.table_stride + tok / p.block_size];
                        const int slot = tok % p.block_size;
                        const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
#pragma unroll
                        for (int s = 0; s < KPT; s += 4) {
                            const u32 w = *(const u32*)(blk + value_offset(p.layout, DD, slot, t4 * KPT + s));
#pragma unroll
                            for (int e = 0; e < 4; e++) kd[n][s + e] = tab[(w >> (8 * e)) & 0xFF];
                        }
                    } else {
#pragma unroll
                        for (int s = 0; s < KPT; s++) kd[n][s] = 0.0;
                    }
                }
                // Lanes 0..15 of each warp own one token each for the combine.
                const int my_tok = c * OTOK + warp * 16 + lane;
                double my_scale = 0.0;
                if (lane < 16 && my_tok < stok) {
                    const int id = p.table[(i64)b * p.table_stride + my_tok / p.block_size];
                    const u8* blk = p.kv + (u64)((i64)id * (i64)p.kv_stride);
                    my_scale = (double)*(const float*)(blk + (u64)p.block_size * DD + 4 * (u64)(my_tok % p.block_size));
                }
                for (int ii = 0; ii < rows_here; ii++) {
                    const int r = b * p.next_n + i0 + ii;
                    const int len = valid_len(p, r);
                    if (c * OTOK + warp * 16 >= len) continue;  // uniform per warp
                    double v = 0.0, m = 0.0;
                    // Head sum of the m-tile group whose dots are staged in `sb`, in head
                    // order (lanes 0..15: one token each).
                    auto combine = [&](const double* sb, int mt) {
                        if (lane < 16) {
#pragma unroll
                            for (int hh = 0; hh < SHEADS; hh++) {
                                const double dot = sb[lane * SHEADS + hh];
                                const double w = wd[ii * H + mt * 8 + hh];
                                double t = inside ? __dmul_rn(w, relu_keep_nan_d(__dmul_rn(dot, my_scale)))
                                                  : __dmul_rn(w, relu_keep_nan_d(dot));
                                v = __dadd_rn(v, t);
                                m = __dadd_rn(m, fabs(t));
                            }
                        }
                    };
                    double* st0 = stage + warp * (1 + PIPE) * 16 * SHEADS;
                    for (int mt = 0; mt < H / 8; mt += MTG) {
                        double acc[MTG][ONT][2];
#pragma unroll
                        for (int u = 0; u < MTG; u++)
#pragma unroll
                            for (int n = 0; n < ONT; n++) { acc[u][n][0] = 0.0; acc[u][n][1] = 0.0; }
#if QV
                        // One 128-bit load feeds four k-steps (MTG == 1, f32 queries).
                        const float* qrow = qf + (ii * H + mt * 8 + g) * QRS + t4 * QSEG;
#pragma unroll
                        for (int s = 0; s < KPT; s += 4) {
                            const float4 a4 = *(const float4*)(qrow + s);
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], (double)a4.x, kd[n][s]);
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], (double)a4.y, kd[n][s + 1]);
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], (double)a4.z, kd[n][s + 2]);
#pragma unroll
                            for (int n = 0; n < ONT; n++) dmma(acc[0][n], (double)a4.w, kd[n][s + 3]);
                        }
#else
                        const qelem* qrow = qf + (ii * H + mt * 8 + g) * QRS + t4;
#pragma unroll
                        for (int s = 0; s < KPT; s++) {
#pragma unroll
                            for (int u = 0; u < MTG; u++) {
                                const double a = (double)qrow[u * 8 * QRS + s * 4];
#pragma unroll
                                for (int n = 0; n < ONT; n++) dmma(acc[u][n], a, kd[n][s]);
                            }
                        }
#endif
#if PIPE
                        // Software pipelining: the previous group's head sum runs while
                        // this group's DMMAs drain; its dots sit in the other buffer.
                        double* st = st0 + ((mt / MTG) & 1) * 16 * SHEADS;
                        if (mt > 0) combine(st0 + (((mt / MTG) - 1) & 1) * 16 * SHEADS, mt - MTG);
#else
                        double* st = st0;
#endif
                        // acc[u][n][j] = dot(head (mt+u)*8+g, token n*8 + 2*t4 + j)
#pragma unroll
                        for (int u = 0; u < MTG; u++)
#pragma unroll
                            for (int n = 0; n < ONT; n++) {
                                st[(n * 8 + 2 * t4) * SHEADS + u * 8 + g] = acc[u][n][0];
                                st[(n * 8 + 2 * t4 + 1) * SHEADS + u * 8 + g] = acc[u][n][1];
                            }
                        __syncwarp();
#if !PIPE
                        combine(st, mt);
                        __syncwarp();
#endif
                    }
#if PIPE
                    {
                        const int last = H / 8 - MTG;
                        combine(st0 + ((last / MTG) & 1) * 16 * SHEADS, last);
                        __syncwarp();
                    }
#endif
                    if (lane < 16 && my_tok < len) {
                        const u64 o = row_off[r] + my_tok;
                        value[o] = inside ? v : __dmul_rn(v, my_scale);
                        mag[o] = inside ? m : __dmul_rn(m, fabs(my_scale));
                    }
                }
            }
        }
    }
}
