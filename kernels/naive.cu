// cuda:naive — the obviously-correct kernel: one thread per (row, position in V(r)),
// fp8 decoded through the same 256-entry tables as the CPU, exact products, f32
// sums, 64-bit addressing everywhere, writes exactly V(r) and nothing else.

extern "C" __global__ void naive_logits(const Params p) {
    __shared__ float tab[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) tab[k] = p.decode[(p.fnuz ? 256 : 0) + k];
    __syncthreads();
    const int rows = p.batch * p.next_n;
    const int D = p.head_dim, H = p.heads;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const int len = valid_len(p, r);
        const int b = r / p.next_n;
        const u8* q = p.q + (u64)r * H * D;
        const float* w = p.weights + (u64)r * H;
        for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < len; t += (i64)gridDim.x * blockDim.x) {
            const int id = p.table[(i64)b * p.table_stride + t / p.block_size];
            const int slot = (int)(t % p.block_size);
            const u8* blk = p.kv + (u64)id * p.kv_stride;
            const float scale = *(const float*)(blk + (u64)p.block_size * D + 4 * (u64)slot);
            float acc = 0.0f;
            for (int h = 0; h < H; h++) {
                float dot = 0.0f;
                for (int d = 0; d < D; d++)
                    dot = __fadd_rn(dot, __fmul_rn(tab[q[(u64)h * D + d]], tab[blk[value_offset(p.layout, D, slot, d)]]));
                acc = __fadd_rn(acc, __fmul_rn(w[h], relu_keep_nan(dot)));
            }
            p.out[(i64)r * p.out_stride + t] = __fmul_rn(acc, scale);
        }
    }
}
