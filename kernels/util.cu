// Device-side memory preparation and integrity checks: the KV cache is several GiB,
// so poisoning and hashing it from the host would cost seconds of PCIe per case.

// The poison of byte offset `off` (a multiple of 4) of a block: NaN scales in the scale
// slots, fp8 NaN codes everywhere else (values and stride padding).
__device__ __forceinline__ u32 poison_word(u64 off, u64 values_end, u64 scales_end, u32 nan_word) {
    return (off >= values_end && off < scales_end) ? 0x7FC00000u : nan_word;
}

// Writes the poison of one geometry (block `stride`, scale slots at [values_end,
// scales_end) of each block, `nan_word` elsewhere) over part of the cache: the bytes
// [start, end) from its base, and in each block only its bytes [lo, hi). With
// lo = 0, hi = stride every byte of the span is poisoned exactly as
// kernel::cpu::poison_byte; with lo, hi the scale slots only the slots are written (a
// pool that already holds another geometry's poison of the same format changes only
// there); with `only`, only the blocks whose bit is set (below only_bits) are written
// (the stored blocks of the case before). One warp per block: a pool of a million
// 132-byte blocks and one of fifty thousand 1.4 MB blocks both keep every SM busy.
extern "C" __global__ void poison_span(u8* base, u64 start, u64 end, u64 stride, u64 lo, u64 hi,
                                       u64 values_end, u64 scales_end, u32 nan_word, const u32* only,
                                       u64 only_bits) {
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u64 first = start / stride, last = (end + stride - 1) / stride;
    for (u64 blk = first + warp; blk < last; blk += warps) {
        if (only && (blk >= only_bits || !((only[blk >> 5] >> (blk & 31)) & 1u))) continue;
        u64 b0 = blk * stride;
        u64 from = b0 + lo > start ? b0 + lo : start;
        u64 to = b0 + hi < end ? b0 + hi : end;
        u32* words = (u32*)base;
        for (u64 a = from + 4 * (u64)lane; a < to; a += 128)
            words[a / 4] = poison_word(a - b0, values_end, scales_end, nan_word);
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

// One block of the cache, read by one warp: its words not in the stored block's
// `block_bytes` are compared with the poison (mismatches into `changed`), the stored
// block's words hashed (mixed with their global word index) into `hash`.
__device__ __forceinline__ void verify_block(const u8* kv, u64 blk, u64 end, u64 stride, u64 values_end,
                                             u64 scales_end, u32 nan_word, u64 block_bytes, bool is_stored,
                                             bool data_only, int lane, u64& changed, u64& hash) {
    u64 words = stride / 4;
    const u32* base = (const u32*)(kv + blk * stride);
    // The last block may be cut by the end of the mapped span: its words past the end
    // are not there to read. `data_only`: only the stored block's own bytes (its stride
    // padding is checked by the whole read after the run).
    u64 avail = end - blk * stride;
    if (data_only && avail > block_bytes) avail = block_bytes;
    if (avail < stride) {
        for (u64 ww = lane; ww * 4 < avail; ww += 32) {
            u32 x = base[ww];
            u64 off = ww * 4;
            if (is_stored && off < block_bytes)
                hash += mix64(((blk * words + ww) << 32) ^ x ^ (blk * words + ww) * 0x9E3779B97F4A7C15ULL);
            else
                changed += x != poison_word(off, values_end, scales_end, nan_word);
        }
        return;
    }
    u64 w = 0;
    // 16-byte loads where every block starts 16-aligned (the cache itself is 256-aligned):
    // four words per lane per load, two loads in flight, so a warp keeps enough bytes
    // moving to read the pool at memory speed.
    if ((stride & 15) == 0) {
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

// A warp's `changed` and `hash` summed into out[0] and out[1] (every lane calls it).
__device__ __forceinline__ void add_warp_counts(u64 changed, u64 hash, int lane, u64* out) {
    for (int o = 16; o > 0; o >>= 1) {
        changed += __shfl_xor_sync(0xffffffffu, changed, o);
        hash += __shfl_xor_sync(0xffffffffu, hash, o);
    }
    if (lane == 0) {
        if (changed) atomicAdd(&out[0], changed);
        if (hash) atomicAdd(&out[1], hash);
    }
}

// One 16-byte quad at byte `off` of block `blk` (blocks 16-aligned, so a quad never
// straddles two): verify_block's rule for each of its words.
__device__ __forceinline__ void verify_quad(uint4 x, u64 blk, u64 off, bool is_stored, u64 words,
                                            u64 values_end, u64 scales_end, u32 nan_word, u64 block_bytes,
                                            u64& changed, u64& hash) {
    u32 v[4] = {x.x, x.y, x.z, x.w};
    if (!(is_stored && off < block_bytes)) {
        // Not stored data: the poison. A quad inside one region compares with one word.
        if (off + 16 <= values_end || off >= scales_end) {
            changed += (v[0] != nan_word) + (v[1] != nan_word) + (v[2] != nan_word) + (v[3] != nan_word);
            return;
        }
        if (off >= values_end && off + 16 <= scales_end) {
            const u32 s = 0x7FC00000u;
            changed += (v[0] != s) + (v[1] != s) + (v[2] != s) + (v[3] != s);
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        u64 o = off + 4 * j, ww = o / 4;
        if (is_stored && o < block_bytes)
            hash += mix64(((blk * words + ww) << 32) ^ v[j] ^ (blk * words + ww) * 0x9E3779B97F4A7C15ULL);
        else
            changed += v[j] != poison_word(o, values_end, scales_end, nan_word);
    }
}

// verify_kv's whole read, streamed (block strides that are multiples of 16): each warp
// reads a contiguous `window` of the span and the next warp the next one, so the warps
// in flight together cover a few hundred MB of neighbouring pages. verify_kv gives each
// warp a whole block, and on an engine-sized pool (tens of GiB of 1 MB blocks) the warps
// in flight then touch thousands of pages at once: the address translation, not the
// memory, sets its pace. The same counts and the same hash as verify_kv.
extern "C" __global__ void verify_kv_stream(const u8* kv, u64 end, u64 stride, u64 values_end, u64 scales_end,
                                            u32 nan_word, u64 block_bytes, const u32* stored, u64 stored_bits,
                                            u64 window, u64* out) {
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u64 words = stride / 4;
    u64 changed = 0, hash = 0;
    u64 n_windows = (end + window - 1) / window;
    for (u64 wi = warp; wi < n_windows; wi += warps) {
        u64 a = wi * window + 16 * (u64)lane;
        u64 a_end = (wi + 1) * window < end ? (wi + 1) * window : end;
        if (a >= a_end) continue;
        u64 blk = a / stride, off = a - blk * stride;
        bool st = blk < stored_bits && ((stored[blk >> 5] >> (blk & 31)) & 1u);
        for (; a < a_end; a += 4 * 512) {
            uint4 x[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (a + 512 * k < a_end) x[k] = *(const uint4*)(kv + a + 512 * k);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                if (a + 512 * k < a_end)
                    verify_quad(x[k], blk, off, st, words, values_end, scales_end, nan_word, block_bytes, changed,
                                hash);
                off += 512;
                while (off >= stride) {
                    off -= stride;
                    ++blk;
                    st = blk < stored_bits && ((stored[blk >> 5] >> (blk & 31)) & 1u);
                }
            }
        }
    }
    add_warp_counts(changed, hash, lane, out);
}

// The cache's integrity in one read of its bytes [0, end) (the whole mapped span, past
// the pool's last block too): every word of a block that holds no stored block must
// still be the poison poison_span wrote (NaN codes, NaN scales), and the stored
// blocks' words are hashed into out[1]; words that are not the poison are counted into
// out[0]. One warp per block: a pool of a million 132-byte blocks and one of fifty
// thousand 1.4 MB blocks both keep every SM busy. With `stored_only`, only the stored
// blocks' own bytes are read (the hash right after they were written: a few MB, not
// the pool, nor the stride padding of an interleaved pool, up to a MB a block), found
// a bitmap word (32 blocks) at a time, so a small grid does it.
extern "C" __global__ void verify_kv(const u8* kv, u64 end, u64 stride, u64 values_end, u64 scales_end,
                                     u32 nan_word, u64 block_bytes, const u32* stored, u64 stored_bits,
                                     int stored_only, u64* out) {
    u64 num_blocks = (end + stride - 1) / stride;
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    u64 warp = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    u64 changed = 0, hash = 0;
    if (stored_only) {
        u64 nb = num_blocks < stored_bits ? num_blocks : stored_bits;
        for (u64 wi = warp; wi < (nb + 31) / 32; wi += warps) {
            for (u32 m = stored[wi]; m; m &= m - 1) {
                u64 blk = wi * 32 + (__ffs(m) - 1);
                if (blk < nb)
                    verify_block(kv, blk, end, stride, values_end, scales_end, nan_word, block_bytes, true, true,
                                 lane, changed, hash);
            }
        }
    } else {
        for (u64 blk = warp; blk < num_blocks; blk += warps) {
            bool is_stored = blk < stored_bits && ((stored[blk >> 5] >> (blk & 31)) & 1u);
            verify_block(kv, blk, end, stride, values_end, scales_end, nan_word, block_bytes, is_stored, false,
                         lane, changed, hash);
        }
    }
    add_warp_counts(changed, hash, lane, out);
}
