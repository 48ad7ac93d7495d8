#!/usr/bin/env python3
"""The FP8 paged MQA logits operation in numpy, on the CPU, as an mqa-fuzz worker.

It runs the production algorithm (ChunkK=256 chunks, a split-KV schedule over 8
workers, whole-chunk stores with -inf masks, f32 accumulation) against the poisoned
device cache, emulated sparsely so multi-GiB caches cost nothing. ``--plant BUG``
reproduces one planted bug of ``cpu:chunked`` (src/kernel/cpu/chunked.rs) through its
real mechanism, so CI tests the protocol end to end both ways: clean, and caught.
``--plant A,B`` plants several bugs at once (as ``cpu:bug-A+B``).

    mqa-fuzz replay corpus/*.json --kernel numpy
    mqa-fuzz replay corpus/*.json --kernel 'numpy --plant offset32-kv'
    mqa-fuzz run --kernel 'numpy --plant offset32-kv,scale-before-relu'
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import protocol_common as pc  # noqa: E402

SCHEDULE_SMS = 8
PLANTS = [
    "tail-unwritten", "offset32-kv", "offset32-out", "mask-off-by-one", "ctx2d-ignored",
    "table-padding-read", "zero-batch", "fnuz-as-fn", "scale-before-relu",
    "split-boundary-drop", "short-row-skipped", "store-past-end",
]


def plant_list(arg):
    """``A,B``: the planted bugs, each known and given once (argparse's type check)."""
    names = arg.split(",")
    for n in names:
        if n not in PLANTS:
            raise argparse.ArgumentTypeError(f"unknown planted bug {n!r} (choose from {', '.join(PLANTS)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a planted bug is named twice in {arg!r}")
    return names


class Kernel:
    def __init__(self, plants=()):
        self.plants = list(plants)

    def has(self, p):
        return p in self.plants

    # -- what the kernel believes -------------------------------------------------------
    def believed_len(self, c, r):
        n = c.next_n
        b, i = divmod(r, n)
        if self.has("ctx2d-ignored") and c.lens_2d:
            flat = int(c.context_lens.reshape(-1)[b])  # context_lens[b] of the flattened [B, N]
            return max(0, flat - n + i + 1)
        ln = c.valid_len(r)
        if self.has("mask-off-by-one") and n > 1:
            return max(0, ln - 1)
        return ln

    def believed_seq_tokens(self, c, b):
        n = c.next_n
        if self.has("ctx2d-ignored") and c.lens_2d:
            return max(self.believed_len(c, b * n + i) for i in range(n))
        return c.seq_tokens(b)

    def schedule(self, c):
        items = []
        for b in range(c.batch):
            tokens = self.believed_seq_tokens(c, b)
            if self.has("short-row-skipped") and tokens < c.next_n:
                continue
            chunks = tokens // pc.CHUNK_K if self.has("tail-unwritten") else -(-tokens // pc.CHUNK_K)
            items.extend((b, k) for k in range(chunks))
        if not items and self.has("zero-batch") and c.batch % 32 == 0:
            return [(c.batch, 0)]  # the scheduler's search runs off the end: sentinel item
        per_sm = max(1, -(-len(items) // SCHEDULE_SMS))
        out = []
        for k, (b, ch) in enumerate(items):
            if self.has("split-boundary-drop") and k // per_sm > 0 and k % per_sm == 0 and ch > 0:
                continue
            out.append((b, ch))
        return out

    # -- memory -------------------------------------------------------------------------
    def keys(self, c, view, table, offs, b, ts):
        """Decoded keys [len(ts), D] and scales [len(ts)] of tokens ``ts`` of sequence b."""
        bs, d = c.block_size, c.head_dim
        k = np.empty((len(ts), d), np.float32)
        s = np.empty(len(ts), np.float32)
        ts = np.asarray(ts)
        for j in np.unique(ts // bs):
            j = int(j)
            if j >= c.block_table_stride:
                raise pc.Crash(f"illegal address: block_table[{b}][{j}] is past the table")
            bid = int(c.block_table[b, j])
            stride = c.kv_block_stride
            if self.has("offset32-kv"):
                base = ((bid & 0xFFFFFFFF) * (stride & 0xFFFFFFFF)) & 0xFFFFFFFF
            else:
                base = bid * stride
            blk = view.read(base, c.block_bytes, f"block id {bid} (block_table[{b}][{j}])")
            sel = np.nonzero(ts // bs == j)[0]
            slots = ts[sel] % bs
            k[sel] = table[blk[offs[slots]]]
            s[sel] = blk[bs * d:].view("<f4")[slots]
        return k, s

    # -- the run --------------------------------------------------------------------------
    def run(self, c):
        t0 = time.perf_counter()
        n, h, d = c.next_n, c.heads, c.head_dim
        fmt = "e4m3fn" if self.has("fnuz-as-fn") else c.format
        table = pc.fp8_table(fmt)
        inside = self.has("scale-before-relu")
        view = pc.SparseDeviceView(c)
        offs = c.value_offsets()
        q_codes = c.q.reshape(c.rows, h, d)
        w = c.weights.reshape(c.rows, h)
        sched = self.schedule(c)
        tiles = []
        for b, ch in sched:
            tile = np.full((n, pc.CHUNK_K), -np.inf, np.float32)
            if b < c.batch:
                lens = [self.believed_len(c, b * n + i) for i in range(n)]
                seq_tokens = self.believed_seq_tokens(c, b)
                t_lo = ch * pc.CHUNK_K
                t = np.arange(t_lo, t_lo + pc.CHUNK_K)
                want = t < max(lens)
                if self.has("table-padding-read"):
                    # Loads every key of the chunk the table can address, padding included.
                    want |= (t >= seq_tokens) & (t // c.block_size < c.max_blocks)
                ts = t[want]
                if ts.size:
                    k, s = self.keys(c, view, table, offs, b, ts)
                    for i in range(n):
                        r = b * n + i
                        # Decoded per row: a 2 GiB-output case has ~10^6 rows, most empty.
                        dots = k @ table[q_codes[r]].T  # [T, H], f32 accumulation
                        if inside:
                            dots = dots * s[:, None]
                        relu = np.where((dots > 0) | np.isnan(dots), dots, np.float32(0))
                        acc = (relu * w[r].astype(np.float32)[None, :]).sum(axis=1, dtype=np.float32)
                        if not inside:
                            acc = acc * s
                        m = ts < lens[i]
                        tile[i, ts[m] - t_lo] = acc[m]
            tiles.append(tile)
        raw = c.logits
        g = c.guard_elems
        end = c.max_model_len + 1 if self.has("store-past-end") else c.max_model_len
        for (b, ch), tile in zip(sched, tiles):
            t_lo = ch * pc.CHUNK_K
            width = max(0, min(pc.CHUNK_K, end - t_lo))
            for i in range(n):
                r = b * n + i
                elem = r * c.out_row_stride + t_lo + np.arange(width, dtype=np.int64)
                if self.has("offset32-out"):
                    elem = ((elem * 4).astype(np.int32).astype(np.int64)) // 4  # int32 byte offset
                at = g + elem
                bad = (at < 0) | (at >= raw.size)
                if bad.any():
                    e = int(elem[np.argmax(bad)])
                    raise pc.Crash(f"illegal address: store of row {r} at element offset {e} "
                                   f"of a {c.rows * c.out_row_stride}-element output")
                raw[at] = tile[i, :width]
        return {"kernel_time_us": (time.perf_counter() - t0) * 1e6, "inputs_intact": True}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plant", type=plant_list, default=[], metavar="BUG[,BUG...]",
                    help="reproduce planted bugs (comma-separated): " + ", ".join(PLANTS))
    ap.add_argument("--compile-key", default="", metavar="FIELD[,FIELD...]",
                    help="declare a compile key (as a JIT-compiling library would), e.g. heads,head_dim,next_n")
    pc.add_common_args(ap)
    args = ap.parse_args()
    k = Kernel(args.plant)
    name = "numpy:chunked" + (f" --plant {','.join(args.plant)}" if args.plant else "")
    hello = {
        "name": name,
        "library": "numpy",
        "version": np.__version__,
        "device": "cpu",
        "capabilities": pc.capabilities(nan_behaviour="propagates NaN through dot and head sum"),
    }
    if args.compile_key:
        hello["compile_key"] = args.compile_key.split(",")
    pc.serve_forking(lambda: (hello, k.run), args.fault)


if __name__ == "__main__":
    main()
