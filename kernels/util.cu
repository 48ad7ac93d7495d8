// Device-side memory preparation and integrity checks: the KV cache is several GiB,
// so poisoning and hashing it from the host would cost seconds of PCIe per case.

// The poison of byte offset `off` (a multiple of 4) of a block: NaN scales in the scale
// slots, fp8 NaN codes everywhere else (values and stride padding).
__device__ __forceinline__ u32 poison_word(u64 off, u64 values_end, u64 scales_end, u32 nan_word) {
    return (off >= values_end && off < scales_end) ? 0x7FC00000u : nan_word;
}

// Poisons every byte of the cache exactly as kernel::cpu::poison_byte: fp8 NaN codes
// in values and stride padding, NaN (0x7FC00000) in the scale slots. One CTA row per
// block slot; the stride is a multiple of 4, so whole words are written.
extern "C" __global__ void poison_kv(u8* kv, u64 num_blocks, u64 stride, u64 values_end, u64 scales_end, u32 nan_word) {
    u64 words = stride / 4;
    bool wide = (stride & 15) == 0;  // every block 16-aligned: 16-byte stores
    for (u64 blk = blockIdx.x; blk < num_blocks; blk += gridDim.x) {
        u32* base = (u32*)(kv + blk * stride);
        u64 w0 = 0;
        if (wide) {
            uint4* b4 = (uint4*)base;
            u64 quads = words / 4;
            for (u64 q = threadIdx.x; q < quads; q += blockDim.x) {
                u64 off = q * 16;
                b4[q] = make_uint4(poison_word(off, values_end, scales_end, nan_word),
                                   poison_word(off + 4, values_end, scales_end, nan_word),
                                   poison_word(off + 8, values_end, scales_end, nan_word),
                                   poison_word(off + 12, values_end, scales_end, nan_word));
            }
            w0 = quads * 4;
        }
        for (u64 w = w0 + threadIdx.x; w < words; w += blockDim.x)
            base[w] = poison_word(w * 4, values_end, scales_end, nan_word);
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

// The cache's integrity in one read: every word of a block that holds no stored block
// must still be the poison poison_kv wrote (NaN codes, NaN scales), and the stored
// blocks' words are hashed (mixed with their global word index) into out[1]; words
// that are not the poison are counted into out[0]. With `stored_only`, only the stored
// blocks are read (the hash right after they were written: a few MB, not the pool).
// One warp per block: a pool of a million 132-byte blocks and one of fifty thousand
// 1.4 MB blocks both keep every SM busy.
extern "C" __global__ void verify_kv(const u8* kv, u64 num_blocks, u64 stride, u64 values_end, u64 scales_end,
                                     u32 nan_word, u64 block_bytes, const u32* stored, int stored_only,
                                     u64* out) {
    u64 words = stride / 4;
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u64 changed = 0, hash = 0;
    // 16-byte loads where every block starts 16-aligned (the cache itself is 256-aligned):
    // four words per lane per load, two loads in flight, so a warp keeps enough bytes
    // moving to read the pool at memory speed.
    bool wide = (stride & 15) == 0;
    for (u64 blk = warp; blk < num_blocks; blk += warps) {
        bool is_stored = (stored[blk >> 5] >> (blk & 31)) & 1u;
        if (stored_only && !is_stored) continue;
        const u32* base = (const u32*)(kv + blk * stride);
        u64 w = 0;
        if (wide) {
            const uint4* b4 = (const uint4*)base;
            u64 quads = words / 4;
            for (u64 q = lane; q < quads; q += 64) {
                uint4 x[2];
                x[0] = b4[q];
                bool two = q + 32 < quads;
                if (two) x[1] = b4[q + 32];
                for (int k = 0; k < (two ? 2 : 1); ++k) {
                    u64 w0 = (q + 32 * k) * 4;
                    u32 v[4] = {x[k].x, x[k].y, x[k].z, x[k].w};
                    for (int j = 0; j < 4; ++j) {
                        u64 ww = w0 + j, off = ww * 4;
                        if (is_stored && off < block_bytes)
                            hash += mix64(((blk * words + ww) << 32) ^ v[j] ^ (blk * words + ww) * 0x9E3779B97F4A7C15ULL);
                        else
                            changed += v[j] != poison_word(off, values_end, scales_end, nan_word);
                    }
                }
            }
            w = quads * 4;
        }
        for (u64 ww = w + lane; ww < words; ww += 32) {
            u64 off = ww * 4;
            u32 x = base[ww];
            if (is_stored && off < block_bytes)
                hash += mix64(((blk * words + ww) << 32) ^ x ^ (blk * words + ww) * 0x9E3779B97F4A7C15ULL);
            else
                changed += x != poison_word(off, values_end, scales_end, nan_word);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        changed += __shfl_xor_sync(0xffffffffu, changed, o);
        hash += __shfl_xor_sync(0xffffffffu, hash, o);
    }
    if (lane == 0) {
        if (changed) atomicAdd(&out[0], changed);
        if (hash) atomicAdd(&out[1], hash);
    }
}
