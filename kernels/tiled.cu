// cuda:tiled — the production algorithm (DeepGEMM / AITER paged MQA logits) on
// tensor cores:
//   * a schedule kernel turns the context lengths into a prefix sum of 256-token
//     chunks (ChunkK) per sequence; the main kernel's CTAs each take a contiguous
//     range of (sequence, chunk) items (split-KV over the SMs);
//   * per item, each of 4 warps takes 64 tokens in passes of 32 (4 MMA n-tiles of 8
//     tokens); the query heads of all next_n rows are the M operand (16 per tile),
//     the tokens the N operand, D the K dimension;
//   * e4m3fn: mma.sync m16n8k32 e4m3 with f32 accumulators; e4m3fnuz has no tensor
//     core format, so its codes are decoded exactly to f16 (every fnuz value is an f16)
//     and fed to mma.sync m16n8k16 f16 with f32 accumulators;
//   * relu with fmaxf (NaN dots become 0, as in DeepGEMM), weighted head sum in f32,
//     times the token scale; chunked stores: a value for t in V(r), -inf for masked
//     positions inside a written chunk, nothing past the last chunk or max_model_len;
//   * 64-bit addressing (block_id * stride, row * row_stride).
// The D dimension is permuted identically for both operands (thread t of a quad owns
// D/4 contiguous bytes) so each thread loads contiguous memory; a dot product does
// not depend on the order of its terms.
// Planted bugs (BUG_*) are one-line edits of this code, selected by defines; the two
// property bugs (BUG_NONDETERMINISTIC, BUG_BATCH_VARIANT) change only the order of the
// head-sum butterfly, so every value stays within its bound.

#ifndef NN
#define NN 1
#endif
#ifndef HH
#define HH 64
#endif
#ifndef DD
#define DD 128
#endif
#ifndef FNUZ
#define FNUZ 0
#endif
#define CHUNK 256
#define WARPS 4
#define TOK_PER_WARP (CHUNK / WARPS)
#define NT 4
#define GROUP (NT * 8)
#define QROW (DD + 16)
#define WPT (DD / 16)
#define USE_F16 (FNUZ && !defined_BUG_FNUZ_AS_FN)
#ifdef BUG_FNUZ_AS_FN
#define defined_BUG_FNUZ_AS_FN 1
#else
#define defined_BUG_FNUZ_AS_FN 0
#endif

#ifdef BUG_NONDETERMINISTIC
// Launches of this module so far, counted by the last CTA of each launch: the planted
// bug orders its head-sum reduction by it (see the end of tiled_logits).
__device__ unsigned int bug_launches;
__device__ unsigned int bug_ctas_done;
#endif

// Row length V(r) as this kernel believes it.
__device__ __forceinline__ int believed_len(const Params& p, int r) {
    int b = r / NN, i = r % NN;
#ifdef BUG_CTX2D_IGNORED
    if (p.lens_2d) {  // context_lens[b] of the flattened [B, N] array
        int flat = p.lens[b];
        int l = flat - NN + i + 1;
        return l > 0 ? l : 0;
    }
#endif
    int len = p.lens_2d ? p.lens[(i64)b * NN + i] : p.lens[b] - NN + i + 1;
    len = len > 0 ? len : 0;
#ifdef BUG_MASK_OFF_BY_ONE
    if (NN > 1 && len > 0) len -= 1;
#endif
    return len;
}

__device__ __forceinline__ int believed_seq_tokens(const Params& p, int b) {
#ifdef BUG_CTX2D_IGNORED
    if (p.lens_2d) {
        int m = 0;
        for (int i = 0; i < NN; i++) { int l = believed_len(p, b * NN + i); m = l > m ? l : m; }
        return m;
    }
#endif
    return seq_tokens(p, b);
}

__device__ __forceinline__ int chunks_of(const Params& p, int b) {
    int tokens = believed_seq_tokens(p, b);
#ifdef BUG_SHORT_ROW_SKIPPED
    if (tokens < NN) return 0;
#endif
#ifdef BUG_TAIL_UNWRITTEN
    return tokens / CHUNK;
#else
    return (tokens + CHUNK - 1) / CHUNK;
#endif
}

// prefix[b] = chunks of sequences 0..b-1; prefix[B] = total. One CTA.
extern "C" __global__ void tiled_schedule(const Params p, int* prefix) {
    __shared__ int sums[1024];
    const int B = p.batch, T = blockDim.x;
    const int per = (B + T - 1) / T;
    const int lo = min(B, (int)threadIdx.x * per), hi = min(B, lo + per);
    int s = 0;
    for (int b = lo; b < hi; b++) s += chunks_of(p, b);
    sums[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int k = 0; k < T; k++) { int v = sums[k]; sums[k] = run; run += v; }
        prefix[B] = run;
    }
    __syncthreads();
    int run = sums[threadIdx.x];
    for (int b = lo; b < hi; b++) { prefix[b] = run; run += chunks_of(p, b); }
}

__device__ __forceinline__ u64 block_offset(int id, u64 stride) {
#ifdef BUG_OFFSET32_KV
    return (u64)((u32)id * (u32)stride);
#else
    return (u64)((i64)id * (i64)stride);
#endif
}

__device__ __forceinline__ bool wants_key(const Params& p, int b, int tok, int stok) {
    if (b >= p.batch) return false;
#ifdef BUG_TABLE_PADDING_READ
    // Loads every table entry the chunk can address, padding included (masked later).
    if (tok / p.block_size < p.max_blocks) return true;
#endif
    return tok < stok;
}

__device__ __forceinline__ void mma_fp8(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 f16_pair(const unsigned short* tab, u32 word, int lo_byte) {
    u32 x = tab[(word >> (8 * lo_byte)) & 0xFF];
    u32 y = tab[(word >> (8 * (lo_byte + 1))) & 0xFF];
    return x | (y << 16);
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) tiled_logits(const Params p, const int* prefix) {
    extern __shared__ __align__(16) u8 smem[];
    u8* qs = smem;                                        // NN*HH rows of QROW bytes
    float* ws = (float*)(smem + NN * HH * QROW);          // NN*HH weights
    unsigned short* f16tab = (unsigned short*)(ws + NN * HH);  // 256 fnuz -> f16
    const int B = p.batch;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
#if USE_F16
    for (int k = threadIdx.x; k < 256; k += blockDim.x) f16tab[k] = f32_to_f16_bits(p.decode[256 + k]);
#endif
    const int total = prefix[B];
    // The order of the head-sum butterfly below (lane masks m0, m1, m2): 4, 8, 16.
#if defined(BUG_NONDETERMINISTIC)
    // Another order every other launch, as partials arriving through atomics in another
    // order would: two runs of one case differ in the last bits, within every bound.
    const int red = (int)((*(volatile unsigned int*)&bug_launches) & 1u);
#elif defined(BUG_BATCH_VARIANT)
    // The order picked from the whole batch's work (a schedule tuned to the batch): a
    // sequence's bits change with its neighbours' lengths, within every bound.
    const int red = total % 3;
#else
    const int red = 0;
#endif
    const int m0 = red == 1 ? 16 : (red == 2 ? 8 : 4);
    const int m1 = red == 2 ? 16 : 8;
    const int m2 = red == 0 ? 16 : 4;
    const int per = (total + p.num_workers - 1) / p.num_workers;
    int start = blockIdx.x * per;
    int end = min(total, start + per);
    bool sentinel = false;
#ifdef BUG_ZERO_BATCH
    // The scheduler's search runs off the end of an empty batch: worker 0 gets the
    // sentinel item (sequence B, chunk 0) and stores into rows B*N.. (DeepGEMM #353).
    if (total == 0 && B % 32 == 0 && blockIdx.x == 0) { sentinel = true; start = 0; end = 1; }
#endif
    const bool aligned16 = (p.kv_stride % 16 == 0) && (((u64)p.kv & 15) == 0);
    int cur_b = -1;
    for (int k = start; k < end; k++) {
        int b, c;
        if (sentinel) {
            b = B; c = 0;
        } else {
            int lo = 0, hi = B;  // largest b with prefix[b] <= k
            while (hi - lo > 1) { int mid = (lo + hi) >> 1; if (prefix[mid] <= k) lo = mid; else hi = mid; }
            b = lo;
            c = k - prefix[b];
        }
#ifdef BUG_SPLIT_BOUNDARY_DROP
        if (k == start && blockIdx.x > 0 && c > 0) continue;  // a range starting mid-sequence skips its first chunk
#endif
        if (b != cur_b) {
            __syncthreads();
            if (b < B) {
                const u8* src = p.q + (u64)b * NN * HH * DD;
                for (int e = threadIdx.x; e < NN * HH * (DD / 16); e += blockDim.x) {
                    int row = e / (DD / 16), piece = e % (DD / 16);
                    *(uint4*)(qs + row * QROW + piece * 16) = *(const uint4*)(src + (u64)row * DD + piece * 16);
                }
                for (int e = threadIdx.x; e < NN * HH; e += blockDim.x) ws[e] = p.weights[(u64)b * NN * HH + e];
            }
            __syncthreads();
            cur_b = b;
        }
        int lens[NN];
        int stok = 0;
#pragma unroll
        for (int i = 0; i < NN; i++) lens[i] = b < B ? believed_len(p, b * NN + i) : 0;
        if (b < B) stok = believed_seq_tokens(p, b);

        for (int pass = 0; pass < TOK_PER_WARP / GROUP; pass++) {
            const int base = c * CHUNK + warp * TOK_PER_WARP + pass * GROUP;
            // ---- keys: this thread's D/4 bytes of token (base + nt*8 + g), and the
            //      scales of tokens (base + nt*8 + 2*t4 + j) whose logits it will hold.
            u32 kw[NT][WPT];
            float ksc[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int tok = base + nt * 8 + g;
                if (wants_key(p, b, tok, stok)) {
                    const int id = p.table[(i64)b * p.table_stride + tok / p.block_size];
                    const int slot = tok % p.block_size;
                    const u8* blk = p.kv + block_offset(id, p.kv_stride);
                    if (aligned16) {
#pragma unroll
                        for (int j = 0; j < WPT / 4; j++) {
                            uint4 v = *(const uint4*)(blk + value_offset(p.layout, DD, slot, t4 * (DD / 4) + 16 * j));
                            kw[nt][4 * j] = v.x; kw[nt][4 * j + 1] = v.y; kw[nt][4 * j + 2] = v.z; kw[nt][4 * j + 3] = v.w;
                        }
                    } else {
#pragma unroll
                        for (int j = 0; j < WPT; j++)
                            kw[nt][j] = *(const u32*)(blk + value_offset(p.layout, DD, slot, t4 * (DD / 4) + 4 * j));
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < WPT; j++) kw[nt][j] = 0;
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tk = base + nt * 8 + 2 * t4 + j;
                    ksc[nt][j] = 0.0f;
                    if (wants_key(p, b, tk, stok)) {
                        const int id = p.table[(i64)b * p.table_stride + tk / p.block_size];
                        const u8* blk = p.kv + block_offset(id, p.kv_stride);
                        ksc[nt][j] = *(const float*)(blk + (u64)p.block_size * DD + 4 * (u64)(tk % p.block_size));
                    }
                }
            }
            float part[NN][NT][2];
#pragma unroll
            for (int i = 0; i < NN; i++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) { part[i][nt][0] = 0.0f; part[i][nt][1] = 0.0f; }

#pragma unroll
            for (int i = 0; i < NN; i++) {
#pragma unroll 1
                for (int mt = 0; mt < HH / 16; mt++) {
                    const u8* qa = qs + (i * HH + mt * 16 + g) * QROW + t4 * (DD / 4);
                    const u8* qb = qa + 8 * QROW;
                    u32 alo[WPT], ahi[WPT];
#pragma unroll
                    for (int j = 0; j < WPT / 4; j++) {
                        uint4 x = *(const uint4*)(qa + 16 * j), y = *(const uint4*)(qb + 16 * j);
                        alo[4 * j] = x.x; alo[4 * j + 1] = x.y; alo[4 * j + 2] = x.z; alo[4 * j + 3] = x.w;
                        ahi[4 * j] = y.x; ahi[4 * j + 1] = y.y; ahi[4 * j + 2] = y.z; ahi[4 * j + 3] = y.w;
                    }
                    float acc[NT][4];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) { acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f; }
#if USE_F16
#pragma unroll
                    for (int s = 0; s < DD / 16; s++) {
                        const u32 a0 = f16_pair(f16tab, alo[s], 0), a1 = f16_pair(f16tab, ahi[s], 0);
                        const u32 a2 = f16_pair(f16tab, alo[s], 2), a3 = f16_pair(f16tab, ahi[s], 2);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            mma_f16(acc[nt], a0, a1, a2, a3, f16_pair(f16tab, kw[nt][s], 0), f16_pair(f16tab, kw[nt][s], 2));
                    }
#else
#pragma unroll
                    for (int s = 0; s < DD / 32; s++) {
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
                            mma_fp8(acc[nt], alo[2 * s], ahi[2 * s], alo[2 * s + 1], ahi[2 * s + 1], kw[nt][2 * s], kw[nt][2 * s + 1]);
                    }
#endif
                    const float w0 = ws[i * HH + mt * 16 + g], w1 = ws[i * HH + mt * 16 + g + 8];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
#ifdef BUG_SCALE_BEFORE_RELU
                        part[i][nt][0] += w0 * fmaxf(acc[nt][0] * ksc[nt][0], 0.0f) + w1 * fmaxf(acc[nt][2] * ksc[nt][0], 0.0f);
                        part[i][nt][1] += w0 * fmaxf(acc[nt][1] * ksc[nt][1], 0.0f) + w1 * fmaxf(acc[nt][3] * ksc[nt][1], 0.0f);
#else
                        part[i][nt][0] += w0 * fmaxf(acc[nt][0], 0.0f) + w1 * fmaxf(acc[nt][2], 0.0f);
                        part[i][nt][1] += w0 * fmaxf(acc[nt][1], 0.0f) + w1 * fmaxf(acc[nt][3], 0.0f);
#endif
                    }
                }
            }
            // Head sum across the 8 lanes of a column (lane bits 2..4).
#pragma unroll
            for (int i = 0; i < NN; i++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float v = part[i][nt][j];
                        v += __shfl_xor_sync(0xffffffffu, v, m0);
                        v += __shfl_xor_sync(0xffffffffu, v, m1);
                        v += __shfl_xor_sync(0xffffffffu, v, m2);
                        part[i][nt][j] = v;
                    }
            if (g == 0) {
#pragma unroll
                for (int i = 0; i < NN; i++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const int tok = base + nt * 8 + 2 * t4 + j;
#ifdef BUG_STORE_PAST_END
                            if (tok > p.max_model_len) continue;
#else
                            if (tok >= p.max_model_len) continue;
#endif
#ifdef BUG_SCALE_BEFORE_RELU
                            const float logit = part[i][nt][j];
#else
                            const float logit = part[i][nt][j] * ksc[nt][j];
#endif
                            const float v = tok < lens[i] ? logit : -__int_as_float(0x7f800000);
                            const i64 elem = ((i64)b * NN + i) * p.out_stride + tok;
#ifdef BUG_OFFSET32_OUT
                            float* dst = (float*)((u8*)p.out + (int)(elem * 4));
#else
                            float* dst = p.out + elem;
#endif
                            *dst = v;
                        }
            }
        }
    }
#ifdef BUG_NONDETERMINISTIC
    // The last CTA to finish counts the launch: every CTA read the count at its start,
    // before any CTA's increment below, so a launch uses one order throughout.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&bug_ctas_done, 1u) == gridDim.x - 1) {
            bug_ctas_done = 0;
            atomicAdd(&bug_launches, 1u);
        }
    }
#endif
}
