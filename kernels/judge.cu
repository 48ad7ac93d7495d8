// The judge on the device (src/oracle's rules, element for element): every element of
// the output is read once where the kernel left it, next to the exact GPU reference
// (kernels/reference.cu's compact value and relu-magnitude arrays), and only counts,
// maxima and sums come back. The CPU re-checks a sample of elements (value, magnitude
// and class) through `gather_checks`, so this code is never trusted alone.
//
// Arithmetic follows src/oracle/bound.rs and src/reference exactly: products and sums
// in f64 with explicit round-to-nearest intrinsics (no fused multiply-add), the head sum
// of the full bound's magnitude in head order, so a bound here has the CPU's bits.
//
// judge_rows:    grid (chunks of JUDGE_CHUNK columns of the row stride, rows); one part
//                per CTA: V(r) classes, guard counts, hostile tallies, outside-V(r)
//                statistics, row-padding writes, error maxima, calc_diff sums and the
//                row's digest (an order-independent hash of V(r)'s bits).
// judge_pending: the elements judge_rows set aside because their class or ratio needs
//                the full bound (its magnitude is H x D products a position): one warp
//                an element, the lanes splitting D, so a row where many elements need it
//                costs what they need, not a whole warp's serial loop for each.
// count_changed: words of a range that are not the poison (the guard zones).
// gather_checks: the output, reference and device class of listed elements.

#define JUDGE_CHUNK 65536
#define POISON 0x7FC0FFEEu
#define FLT_MAX_D 3.4028234663852886e38

// Element classes (the order of `DeviceClass` in src/kernel/device_judge.rs).
#define C_OK 0
#define C_MISMATCH 1
#define C_NAN 2
#define C_INF 3
#define C_UNWRITTEN 4
#define C_UNDEFINED 5
// Not a class: judge_rows hands the element to judge_pending (the full bound is needed).
#define C_PENDING 100

struct Bound {
    double dot_rel, head_rel, abs;
};

// Mirrors `JudgePart` in src/kernel/cuda/judge.rs, field for field.
struct JudgePart {
    u64 ok, mismatch, nan, inf, unwritten, undefined;
    u64 hostile_nan, hostile_inf, hostile_finite;
    u64 guard_nan, guard_pos_inf, guard_neg_inf;
    u64 out_elements, out_unwritten, out_nan, out_neg_inf, out_pos_inf, out_finite;
    u64 padding_written, digest;
    double max_abs_err, max_ratio, sxy, sxx;
};
#define PART_U64 20
#define PART_F64 4

__device__ __forceinline__ u64 mix64(u64 x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

__device__ __forceinline__ double bound_lower(const Bound& b, double relu_mag) {
    return __dadd_rn(__dmul_rn(__dadd_rn(b.dot_rel, b.head_rel), relu_mag), b.abs);
}

__device__ __forceinline__ double bound_full(const Bound& b, double relu_mag, double abs_mag) {
    return __dadd_rn(__dadd_rn(__dmul_rn(b.dot_rel, abs_mag), __dmul_rn(b.head_rel, relu_mag)), b.abs);
}

// `abs_mag` of row r, position t: |s| * sum_h |w_h| * sum_d |q_d k_d| (reference::RowMagnitudes).
__device__ double abs_mag_at(const Params& p, int r, int t) {
    int b = r / p.next_n, i = r % p.next_n;
    int bs = p.block_size;
    u64 id = (u64)(unsigned)p.table[(i64)b * p.table_stride + t / bs];
    int slot = t % bs;
    const u8* blk = p.kv + id * p.kv_stride;
    const float* dec = p.decode + (p.fnuz ? 256 : 0);
    const u8* sp = blk + (u64)bs * p.head_dim + 4ULL * slot;
    u32 sb = (u32)sp[0] | ((u32)sp[1] << 8) | ((u32)sp[2] << 16) | ((u32)sp[3] << 24);
    double s = fabs((double)__uint_as_float(sb));
    const u8* q = p.q + ((i64)r * p.heads) * p.head_dim;
    double acc = 0.0;
    for (int h = 0; h < p.heads; ++h) {
        double dot = 0.0;
        for (int d = 0; d < p.head_dim; ++d) {
            double a = fabs((double)dec[q[(i64)h * p.head_dim + d]]);
            double k = fabs((double)dec[blk[value_offset(p.layout, p.head_dim, slot, d)]]);
            dot = __dadd_rn(dot, __dmul_rn(a, k)); // exact: fp8 products and their sums fit f64
        }
        double w = fabs((double)p.weights[(i64)r * p.heads + h]);
        acc = __dadd_rn(acc, __dmul_rn(w, dot));
    }
    return __dmul_rn(acc, s);
}

// `abs_mag_at` computed by a whole warp (every lane gets it): each head's exact dot
// split over the lanes (fp8 products and any partial sums of them are exact in f64, so
// the split changes no bit), the head sum in head order as the CPU does it.
__device__ double abs_mag_warp(const Params& p, const float* dec, int r, int t) {
    int lane = threadIdx.x & 31;
    int b = r / p.next_n;
    int bs = p.block_size;
    u64 id = (u64)(unsigned)p.table[(i64)b * p.table_stride + t / bs];
    int slot = t % bs;
    const u8* blk = p.kv + id * p.kv_stride;
    const u8* sp = blk + (u64)bs * p.head_dim + 4ULL * slot;
    u32 sb = (u32)sp[0] | ((u32)sp[1] << 8) | ((u32)sp[2] << 16) | ((u32)sp[3] << 24);
    double s = fabs((double)__uint_as_float(sb));
    const u8* q = p.q + ((i64)r * p.heads) * p.head_dim;
    double acc = 0.0;
    for (int h = 0; h < p.heads; ++h) {
        double dot = 0.0;
        for (int d = lane; d < p.head_dim; d += 32) {
            double a = fabs((double)dec[q[(i64)h * p.head_dim + d]]);
            double k = fabs((double)dec[blk[value_offset(p.layout, p.head_dim, slot, d)]]);
            dot = __dadd_rn(dot, __dmul_rn(a, k));
        }
        for (int o = 16; o > 0; o >>= 1) dot = __dadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
        double w = fabs((double)p.weights[(i64)r * p.heads + h]);
        acc = __dadd_rn(acc, __dmul_rn(w, dot));
    }
    return __dmul_rn(acc, s);
}

// src/oracle::classify and the bound a ratio is measured against (scan::listed_element):
// the cheap lower bound while the error is under a quarter of it, else the full one.
// With `defer`, an element that needs the full bound is C_PENDING (judge_pending's).
__device__ int classify(const Params& p, const Bound& b, int r, int t, u32 bits, double exp, double relu_mag,
                        double* err_out, double* bound_out, bool defer = false) {
    if (bits == POISON) return C_UNWRITTEN;
    if (!isfinite(exp) || fabs(exp) > FLT_MAX_D) return C_UNDEFINED;
    float got = __uint_as_float(bits);
    if (isnan(got)) return C_NAN;
    if (isinf(got)) return C_INF;
    double err = fabs(__dsub_rn((double)got, exp));
    double lo = bound_lower(b, relu_mag);
    *err_out = err;
    if (err <= lo) {
        if (err <= 0.25 * lo) {
            *bound_out = lo;
            return C_OK;
        }
        if (defer) return C_PENDING;
        *bound_out = bound_full(b, relu_mag, abs_mag_at(p, r, t));
        return C_OK;
    }
    if (defer) return C_PENDING;
    double full = bound_full(b, relu_mag, abs_mag_at(p, r, t));
    *bound_out = full;
    return err <= full ? C_OK : C_MISMATCH;
}

__device__ __forceinline__ double ratio(double err, double bound) {
    if (bound > 0.0) return err / bound;
    return err == 0.0 ? 0.0 : __longlong_as_double(0x7FF0000000000000LL);
}

__device__ __forceinline__ u64 warp_sum(u64 x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_sum_d(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double warp_max_d(double x) {
    for (int o = 16; o > 0; o >>= 1) x = fmax(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// 256 threads. Row r's columns [cx*JUDGE_CHUNK, ...) of its stride: V(r) below the row's
// length, outside statistics up to max_model_len, row padding after.
// Elements that need the full bound go to pending[] (row << 32 | position; *n_pending
// counts them): judge_pending classifies them and takes their ratios.
extern "C" __global__ void __launch_bounds__(256) judge_rows(Params p, const u64* row_off, const double* value,
                                                             const double* mag, int rows, Bound b,
                                                             JudgePart* parts, u64* pending,
                                                             unsigned long long* n_pending) {
    __shared__ u64 su[8][PART_U64];
    __shared__ double sd[8][PART_F64];
    int cx = blockIdx.x;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        u64 c[PART_U64];
        double f[PART_F64];
        for (int k = 0; k < PART_U64; ++k) c[k] = 0;
        for (int k = 0; k < PART_F64; ++k) f[k] = 0.0;
        u64 base = row_off[r];
        i64 len = (i64)(row_off[r + 1] - base);
        i64 cols = p.max_model_len, stride = p.out_stride;
        const u32* row = (const u32*)(p.out + (i64)r * stride);
        i64 t0 = (i64)cx * JUDGE_CHUNK, t1 = min(t0 + JUDGE_CHUNK, stride);
        for (i64 t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
            u32 bits = row[t];
            float got = __uint_as_float(bits);
            if (t < len) {
                double exp = value[base + t], rm = mag[base + t];
                double err = 0.0, bnd = 0.0;
                int cls = classify(p, b, r, (int)t, bits, exp, rm, &err, &bnd, true);
                c[19] += mix64(((u64)t << 32) ^ bits);
                if (cls == C_PENDING) {
                    // A finite output: no guard count; the error's maximum and calc_diff's
                    // sums do not depend on the bound.
                    pending[atomicAdd(n_pending, 1ULL)] = ((u64)r << 32) | (u64)t;
                    f[0] = fmax(f[0], err);
                    double g = (double)got;
                    f[2] = __dadd_rn(f[2], __dmul_rn(g, exp));
                    f[3] = __dadd_rn(f[3], __dadd_rn(__dmul_rn(g, g), __dmul_rn(exp, exp)));
                    continue;
                }
                if (cls == C_UNDEFINED) {
                    c[5]++;
                    if (isnan(got)) c[6]++;
                    else if (isinf(got)) c[7]++;
                    else c[8]++;
                    continue;
                }
                // nan_to_num_(-inf) would change it: NaN (poison too) or an infinity.
                if (!isfinite(got)) {
                    if (isnan(got)) c[9]++;
                    else if (got > 0.0f) c[10]++;
                    else c[11]++;
                }
                c[cls]++;
                if (cls == C_OK || cls == C_MISMATCH) {
                    f[0] = fmax(f[0], err);
                    f[1] = fmax(f[1], ratio(err, bnd));
                    double g = (double)got;
                    f[2] = __dadd_rn(f[2], __dmul_rn(g, exp));
                    f[3] = __dadd_rn(f[3], __dadd_rn(__dmul_rn(g, g), __dmul_rn(exp, exp)));
                } else {
                    f[1] = __longlong_as_double(0x7FF0000000000000LL);
                }
            } else if (t < cols) {
                c[12]++;
                if (bits == POISON) c[13]++;
                else if (isnan(got)) c[14]++;
                else if (isinf(got)) c[got < 0.0f ? 15 : 16]++;
                else c[17]++;
            } else if (bits != POISON) {
                c[18]++;
            }
        }
        // Block reduction in a fixed order: the same sums on every run.
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int k = 0; k < PART_U64; ++k) {
            u64 v = warp_sum(c[k]);
            if (lane == 0) su[warp][k] = v;
        }
        double m0 = warp_max_d(f[0]), m1 = warp_max_d(f[1]);
        double s2 = warp_sum_d(f[2]), s3 = warp_sum_d(f[3]);
        if (lane == 0) {
            sd[warp][0] = m0;
            sd[warp][1] = m1;
            sd[warp][2] = s2;
            sd[warp][3] = s3;
        }
        __syncthreads();
        if (threadIdx.x < PART_U64) {
            u64 v = 0;
            for (int w = 0; w < 8; ++w) v += su[w][threadIdx.x];
            ((u64*)&parts[(i64)r * gridDim.x + cx])[threadIdx.x] = v;
        } else if (threadIdx.x >= 32 && threadIdx.x < 32 + PART_F64) {
            int k = threadIdx.x - 32;
            double v = 0.0;
            for (int w = 0; w < 8; ++w) v = k < 2 ? fmax(v, sd[w][k]) : __dadd_rn(v, sd[w][k]);
            ((double*)((u64*)&parts[(i64)r * gridDim.x + cx] + PART_U64))[k] = v;
        }
        __syncthreads();
    }
}

// The set-aside elements of judge_rows, one warp each: out[0] += OK, out[1] += mismatch,
// out[2] = max(out[2], ratio's bits) (non-negative doubles order as their bits do).
extern "C" __global__ void __launch_bounds__(256) judge_pending(Params p, const u64* row_off, const double* value,
                                                                const double* mag, Bound b, const u64* pending,
                                                                u64 n, unsigned long long* out) {
    __shared__ float dec[512];
    for (int i = threadIdx.x; i < 512; i += blockDim.x) dec[i] = p.decode[i];
    __syncthreads();
    const float* table = dec + (p.fnuz ? 256 : 0);
    int lane = threadIdx.x & 31;
    u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    unsigned long long ok = 0, bad = 0;
    double worst = 0.0;
    for (u64 j = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        u64 e = pending[j];
        int r = (int)(e >> 32), t = (int)(e & 0xffffffffu);
        u32 bits = ((const u32*)(p.out + (i64)r * p.out_stride))[t];
        double exp = value[row_off[r] + t], rm = mag[row_off[r] + t];
        double err = fabs(__dsub_rn((double)__uint_as_float(bits), exp));
        double full = bound_full(b, rm, abs_mag_warp(p, table, r, t));
        // err > lo needs err <= full to pass; err <= lo passes (lo <= full).
        bool pass = err <= full;
        ok += pass;
        bad += !pass;
        worst = fmax(worst, ratio(err, full));
    }
    if (lane == 0 && (ok || bad)) {
        atomicAdd(&out[0], ok);
        atomicAdd(&out[1], bad);
        atomicMax(&out[2], (unsigned long long)__double_as_longlong(worst));
    }
}

// Words of `data[0..n)` that differ from the poison, added to *count.
extern "C" __global__ void count_changed(const u32* data, u64 n, u64* count) {
    u64 k = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        k += data[i] != POISON;
    k = warp_sum(k);
    if ((threadIdx.x & 31) == 0 && k) atomicAdd(count, k);
}

// Element j of the check list: row rows[j], position pos[j] (inside V(r)): the output's
// bits, the reference's value and magnitude, and the class the judge gives it.
extern "C" __global__ void gather_checks(Params p, const u64* row_off, const double* value, const double* mag,
                                         Bound b, int n, const u32* rows, const u32* pos, u32* got,
                                         double* ref_value, double* ref_mag, int* cls) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int r = (int)rows[j], t = (int)pos[j];
    u32 bits = ((const u32*)(p.out + (i64)r * p.out_stride))[t];
    double exp = value[row_off[r] + t], rm = mag[row_off[r] + t];
    double err = 0.0, bnd = 0.0;
    got[j] = bits;
    ref_value[j] = exp;
    ref_mag[j] = rm;
    cls[j] = classify(p, b, r, t, bits, exp, rm, &err, &bnd);
}

// Per row, the digest of V(r) alone (a property's re-run): grid (chunks, rows).
extern "C" __global__ void digest_rows(Params p, const u64* row_off, int rows, u64* digests) {
    int cx = blockIdx.x;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        i64 len = (i64)(row_off[r + 1] - row_off[r]);
        const u32* row = (const u32*)(p.out + (i64)r * p.out_stride);
        i64 t0 = (i64)cx * JUDGE_CHUNK, t1 = min(t0 + JUDGE_CHUNK, len);
        u64 h = 0;
        for (i64 t = t0 + threadIdx.x; t < t1; t += blockDim.x) h += mix64(((u64)t << 32) ^ row[t]);
        h = warp_sum(h);
        if ((threadIdx.x & 31) == 0 && h) atomicAdd(&digests[r], h);
    }
}
