// Device-side memory preparation and integrity checks: the KV cache is several GiB,
// so poisoning and hashing it from the host would cost seconds of PCIe per case.

// Poisons every byte of the cache exactly as kernel::cpu::poison_byte: fp8 NaN codes
// in values and stride padding, NaN (0x7FC00000) in the scale slots. One CTA row per
// block slot; the stride is a multiple of 4, so whole words are written.
extern "C" __global__ void poison_kv(u8* kv, u64 num_blocks, u64 stride, u64 values_end, u64 scales_end, u32 nan_word) {
    u64 words = stride / 4;
    for (u64 blk = blockIdx.x; blk < num_blocks; blk += gridDim.x) {
        u32* base = (u32*)(kv + blk * stride);
        for (u64 w = threadIdx.x; w < words; w += blockDim.x) {
            u64 off = w * 4;
            base[w] = (off >= values_end && off < scales_end) ? 0x7FC00000u : nan_word;
        }
    }
}

// Copies the referenced blocks (packed back to back on the device) to their slots.
extern "C" __global__ void scatter_blocks(u8* kv, const u8* packed, const u64* ids, u64 n_ids, u64 stride, u64 block_bytes) {
    u64 words = block_bytes / 4;
    for (u64 k = blockIdx.x; k < n_ids; k += gridDim.x) {
        u32* dst = (u32*)(kv + ids[k] * stride);
        const u32* src = (const u32*)(packed + k * block_bytes);
        for (u64 w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
    }
}

// Order-independent 64-bit hash of a word array: sum of a mix of (index, word). Any
// change of one word changes the sum (the mix is a bijection of the pair for a fixed
// index), so it detects writes to inputs without a host copy.
__device__ __forceinline__ u64 mix64(u64 x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}
extern "C" __global__ void hash_words(const u32* data, u64 n_words, u64* out) {
    u64 acc = 0;
    for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w < n_words; w += (u64)gridDim.x * blockDim.x)
        acc += mix64((w << 32) ^ data[w] ^ (w >> 32) * 0x9E3779B97F4A7C15ULL);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
