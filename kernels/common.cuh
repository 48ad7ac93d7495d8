// Shared by every mqa-fuzz CUDA kernel. NVRTC compiles this text prepended to each
// kernel source (the Rust side concatenates them), so no include paths are needed
// for our own code. Types are spelled out: NVRTC has no <stdint.h> without headers.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Mirrors `Params` in src/kernel/cuda/sys.rs field for field (repr(C)).
struct Params {
    const u8* q;            // [B, N, H, D] fp8 codes
    const float* weights;   // [B*N, H]
    const u8* kv;           // num_blocks * kv_stride bytes
    const int* table;       // [B, table_stride] block ids
    const int* lens;        // [B] (1-D) or [B*N] (2-D)
    float* out;             // element (0, 0) of the output
    const float* decode;    // 512 floats: e4m3fn table, then e4m3fnuz table
    u64 kv_bytes;
    u64 kv_stride;
    i64 out_stride;         // elements
    int batch, next_n, heads, head_dim;
    int block_size, layout, lens_2d, fnuz;
    int max_blocks, table_stride, max_model_len, num_workers;
};

// Byte offset of token slot p, dim d inside a block's value area (DESIGN §1).
__device__ __forceinline__ u64 value_offset(int layout, int head_dim, int p, int d) {
    if (layout == 0) return (u64)p * head_dim + d;
    return (u64)(p / 16) * 16 * head_dim + (u64)(d / 16) * 256 + (u64)(p % 16) * 16 + (d % 16);
}

// ReLU that keeps NaN (the reference's convention).
__device__ __forceinline__ float relu_keep_nan(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }
__device__ __forceinline__ double relu_keep_nan_d(double x) { return (x > 0.0 || x != x) ? x : 0.0; }

// V(r) length of row r from the raw lengths (DESIGN §1).
__device__ __forceinline__ int valid_len(const Params& p, int r) {
    int b = r / p.next_n, i = r % p.next_n;
    int len = p.lens_2d ? p.lens[(i64)b * p.next_n + i] : p.lens[b] - p.next_n + i + 1;
    return len > 0 ? len : 0;
}

// Tokens of sequence b a kernel must read.
__device__ __forceinline__ int seq_tokens(const Params& p, int b) {
    if (!p.lens_2d) { int c = p.lens[b]; return c > 0 ? c : 0; }
    int m = 0;
    for (int i = 0; i < p.next_n; i++) { int c = p.lens[(i64)b * p.next_n + i]; m = c > m ? c : m; }
    return m;
}
