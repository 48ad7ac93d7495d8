// The device twin of the value generator (src/generate/philox.rs, whose module comment
// is the definition): Philox-4x32-10 words, bf16 Gaussians from the quantile table,
// pipeline quantisation, fp8 encoding. Only integer and exactly rounded operations, so
// these kernels give the bytes the CPU materialiser gives for the same seed.
//
// pipeline_rows:   one thread per (row, head): the head's weight word, then D query
//                  words, of stream `row`.
// pipeline_blocks: one thread per (block, token): D key words of stream BLOCK | block,
//                  starting at word token * D; codes at the layout's offsets, then the
//                  token's f32 scale after the block's values.
// pipeline_blocks_at: the same, each block straight into its slot of a device cache (a
//                  case's keys drawn where the kernel reads them).
// table_tail:      one thread per block-table entry: a column the harness sent, or the
//                  padding rule's entry of the entry's index (src/case/mod.rs,
//                  TailRule::entry), so an engine-sized table's padding never travels.

#define BLOCK_STREAM 0x8000000000000000ULL

__device__ __forceinline__ void philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned int hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
    }
}

__device__ __forceinline__ unsigned int gen_word(unsigned long long seed, unsigned long long s,
                                                 unsigned long long n) {
    unsigned long long q = n >> 2;
    unsigned int c[4] = {(unsigned int)q, (unsigned int)(q >> 32), (unsigned int)s,
                         (unsigned int)(s >> 32)};
    philox4x32_10(c, (unsigned int)seed, (unsigned int)(seed >> 32));
    return c[n & 3];
}

// The words n0, n0 + 1, ... of stream s in order, one Philox block per four words (each
// block gives words 4q .. 4q + 3; gen_word draws a whole block for one of them).
struct WordStream {
    unsigned long long seed, s, n;
    unsigned int c[4];
};

__device__ __forceinline__ WordStream word_stream(unsigned long long seed, unsigned long long s,
                                                  unsigned long long n0) {
    WordStream w;
    w.seed = seed;
    w.s = s;
    w.n = n0;
    return w;
}

__device__ __forceinline__ unsigned int next_word(WordStream& w, bool first) {
    unsigned int k = (unsigned int)(w.n & 3);
    if (first || k == 0) {
        unsigned long long q = w.n >> 2;
        w.c[0] = (unsigned int)q;
        w.c[1] = (unsigned int)(q >> 32);
        w.c[2] = (unsigned int)w.s;
        w.c[3] = (unsigned int)(w.s >> 32);
        philox4x32_10(w.c, (unsigned int)w.seed, (unsigned int)(w.seed >> 32));
    }
    w.n += 1;
    return k == 0 ? w.c[0] : k == 1 ? w.c[1] : k == 2 ? w.c[2] : w.c[3];
}

__device__ __forceinline__ float gauss_bf16(unsigned int w, const unsigned short* table) {
    unsigned int bits = (unsigned int)table[w & 4095u] | ((w >> 16) & 0x8000u);
    return __uint_as_float(bits << 16);
}

__device__ __forceinline__ double pow2_ceil(double x) {
    unsigned long long b = __double_as_longlong(x);
    if ((b & ((1ULL << 52) - 1)) == 0) return x;
    return __longlong_as_double((long long)((((b >> 52) & 0x7FF) + 1) << 52));
}

__device__ __forceinline__ double pow2i(int e) {
    return __longlong_as_double((long long)((unsigned long long)(1023 + e) << 52));
}

// Round-to-nearest-even fp8 with saturation (src/fp8.rs `encode`, saturate = true).
__device__ unsigned char fp8_encode(double x, int fnuz) {
    int bias = fnuz ? 8 : 7;
    int max_code = fnuz ? 0x7F : 0x7E;
    double maxv = fnuz ? 240.0 : 448.0;
    double top_ulp = fnuz ? 16.0 : 32.0;
    bool negative = signbit(x);
    double a = fabs(x);
    double tie_above = maxv + top_ulp / 2.0;
    int mag;
    if (a > tie_above || (a == tie_above && (max_code & 1))) {
        mag = max_code;
    } else if (a >= maxv) {
        mag = max_code;
    } else if (a < pow2i(1 - bias)) {
        mag = (int)rint(a * pow2i(bias + 2));
    } else {
        int e = (int)((__double_as_longlong(a) >> 52) & 0x7FF) - 1023;
        int q = (int)rint(a * pow2i(3 - e));
        mag = ((e + bias) << 3) + q - 8;
    }
    if (!negative) return (unsigned char)mag;
    if (fnuz && mag == 0) return 0;
    return (unsigned char)(mag | 0x80);
}

// The power-of-two scale of one token's D values (words n0 .. n0 + d - 1 of stream s).
__device__ double token_scale(unsigned long long seed, unsigned long long s, unsigned long long n0, int d,
                              int fnuz, const unsigned short* table) {
    float amax = 0.0f;
    WordStream w = word_stream(seed, s, n0);
    for (int j = 0; j < d; ++j) amax = fmaxf(amax, fabsf(gauss_bf16(next_word(w, j == 0), table)));
    double x = fmax((double)amax, 1e-4) / (fnuz ? 240.0 : 448.0);
    return pow2_ceil(x);
}

// One token's D values from consecutive words; codes and the f32 scale.
__device__ float quantize_token(unsigned long long seed, unsigned long long s, unsigned long long n0,
                                int d, int fnuz, const unsigned short* table, unsigned char* codes) {
    double scale = token_scale(seed, s, n0, d, fnuz, table);
    WordStream w = word_stream(seed, s, n0);
    for (int j = 0; j < d; ++j) {
        float g = gauss_bf16(next_word(w, j == 0), table);
        codes[j] = fp8_encode((double)g / scale, fnuz);
    }
    return (float)scale;
}

// Token slot p of block `index` of the draw, into the block's bytes at `blk`: its D codes at
// the layout's offsets, then its f32 scale after the block's values. The codes go out 16
// at a time (one 16-byte store where the destination is aligned): in both layouts a run
// of 16 codes j = 16c .. 16c + 15 is 16 consecutive bytes.
__device__ void draw_token(unsigned long long seed, unsigned long long index, int p, int block_size, int d,
                           int fnuz, int shuffle16, const unsigned short* table, unsigned char* blk) {
    unsigned long long s = BLOCK_STREAM | index, n0 = (unsigned long long)p * d;
    double scale = token_scale(seed, s, n0, d, fnuz, table);
    WordStream w = word_stream(seed, s, n0);
    for (int j0 = 0; j0 < d; j0 += 16) {
        unsigned int packed[4] = {0u, 0u, 0u, 0u};
        int len = min(16, d - j0);
        for (int k = 0; k < len; ++k) {
            float g = gauss_bf16(next_word(w, j0 + k == 0), table);
            packed[k >> 2] |= (unsigned int)fp8_encode((double)g / scale, fnuz) << (8 * (k & 3));
        }
        long long off = shuffle16 ? (long long)(p / 16) * 16 * d + (j0 / 16) * 256 + (p % 16) * 16
                                  : (long long)p * d + j0;
        unsigned char* dst = blk + off;
        if (len == 16 && ((unsigned long long)dst & 15) == 0) {
            *(uint4*)dst = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        } else {
            for (int k = 0; k < len; ++k) dst[k] = (unsigned char)(packed[k >> 2] >> (8 * (k & 3)));
        }
    }
    unsigned int sb = __float_as_uint((float)scale);
    long long so = (long long)block_size * d + 4LL * p;
    blk[so] = sb & 0xFF;
    blk[so + 1] = (sb >> 8) & 0xFF;
    blk[so + 2] = (sb >> 16) & 0xFF;
    blk[so + 3] = (sb >> 24) & 0xFF;
}

extern "C" __global__ void pipeline_rows(unsigned long long seed, int rows, int heads, int d, int fnuz,
                                         float head_scale, const unsigned short* table,
                                         unsigned char* q, float* weights) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * heads) return;
    int r = (int)(i / heads), h = (int)(i % heads);
    unsigned long long n0 = (unsigned long long)h * (d + 1);
    float w_model = gauss_bf16(gen_word(seed, (unsigned long long)r, n0), table);
    float q_scale = quantize_token(seed, (unsigned long long)r, n0 + 1, d, fnuz, table,
                                   q + i * d);
    weights[i] = __fmul_rn(__fmul_rn(w_model, q_scale), head_scale);
}

extern "C" __global__ void pipeline_blocks(unsigned long long seed, int n_blocks, int block_size, int d,
                                           int fnuz, int shuffle16, const unsigned short* table,
                                           unsigned char* blocks, long long block_bytes) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_blocks * block_size) return;
    long long b = i / block_size;
    int p = (int)(i % block_size);
    draw_token(seed, (unsigned long long)b, p, block_size, d, fnuz, shuffle16, table, blocks + b * block_bytes);
}

// The keys of a drawn cache straight into their slots of the device cache: one thread
// per (stored block, token); block k has physical id ids[k] and draw index index[k]
// (stream BLOCK | index[k]), exactly the bytes pipeline_blocks gives block index[k].
// Stride padding keeps its poison.
extern "C" __global__ void pipeline_blocks_at(unsigned long long seed, long long n_blocks, int block_size,
                                              int d, int fnuz, int shuffle16, const unsigned short* table,
                                              unsigned char* kv, unsigned long long stride,
                                              const unsigned long long* ids,
                                              const unsigned long long* index) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks * block_size) return;
    long long k = i / block_size;
    int p = (int)(i % block_size);
    draw_token(seed, index[k], p, block_size, d, fnuz, shuffle16, table, kv + ids[k] * stride);
}

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
    unsigned long long z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Entry g = b * stride + j of a rows x stride table: held[starts[b] + j] for the row's
// first starts[b + 1] - starts[b] entries, else the rule's: `fill`, or
// min(lo + splitmix64(key ^ splitmix64(g)) % span, INT_MAX).
extern "C" __global__ void table_tail(int* table, const int* held, const unsigned long long* starts,
                                      long long rows, long long stride, int hashed, int fill,
                                      unsigned long long key, unsigned long long lo,
                                      unsigned long long span) {
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= rows * stride) return;
    long long b = g / stride, j = g - b * stride;
    unsigned long long start = starts[b], end = starts[b + 1];
    int v;
    if ((unsigned long long)j < end - start) {
        v = held[start + j];
    } else if (!hashed) {
        v = fill;
    } else {
        unsigned long long h = splitmix64(key ^ splitmix64((unsigned long long)g));
        unsigned long long x = lo + (span ? h % span : 0ULL);
        if (x < lo) x = ~0ULL;  // the host's saturating add
        v = x > 0x7FFFFFFFULL ? 0x7FFFFFFF : (int)x;
    }
    table[g] = v;
}
