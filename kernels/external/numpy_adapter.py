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
# One BLAS thread: the products are many and small, and a threaded BLAS spins for the
# cores that mqa-fuzz (or anything else on the machine) is using; one core does this
# arithmetic faster than the CPU kernels do on all of them. Set it to override.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

import protocol_common as pc  # noqa: E402

SCHEDULE_SMS = 8
# Elements of the [tokens, N, H] products computed at once (bounds the temporaries).
GROUP_ELEMS = 1 << 21
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
    def believed(self, c):
        """V(r) lengths ``[B, N]`` as this kernel believes them, and the tokens the
        schedule covers per sequence ``[B]``."""
        n = c.next_n
        cl = np.asarray(c.context_lens, np.int64)
        i = np.arange(n, dtype=np.int64)[None, :]
        if c.lens_2d and self.has("ctx2d-ignored"):
            flat = cl.reshape(-1)[:c.batch]  # context_lens[b] of the flattened [B, N]
            lens = np.maximum(0, flat[:, None] - n + i + 1)
            return lens, lens.max(axis=1, initial=0)
        lens = np.maximum(0, cl) if c.lens_2d else np.maximum(0, cl[:, None] - n + i + 1)
        seq = np.maximum(0, cl.max(axis=1, initial=0) if c.lens_2d else cl)
        if self.has("mask-off-by-one") and n > 1:
            lens = np.maximum(0, lens - 1)
        return lens, seq

    def schedule(self, c, seq):
        """The kept work items ``(sequence, chunk)`` in schedule order, as two arrays;
        ``None`` for the zero-batch bug's sentinel item."""
        tokens = seq
        chunks = tokens // pc.CHUNK_K if self.has("tail-unwritten") else -(-tokens // pc.CHUNK_K)
        if self.has("short-row-skipped"):
            chunks = np.where(tokens < c.next_n, 0, chunks)
        total = int(chunks.sum())
        if total == 0 and self.has("zero-batch") and c.batch % 32 == 0:
            return None  # the scheduler's search runs off the end: sentinel item
        item_b = np.repeat(np.arange(c.batch, dtype=np.int64), chunks)
        item_ch = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(chunks) - chunks, chunks)
        if self.has("split-boundary-drop"):
            per_sm = max(1, -(-total // SCHEDULE_SMS))
            k = np.arange(total)
            keep = ~((k // per_sm > 0) & (k % per_sm == 0) & (item_ch > 0))
            item_b, item_ch = item_b[keep], item_ch[keep]
        return item_b, item_ch

    def needed(self, c, chs, maxlen, seq_tokens):
        """Tokens of chunks ``chs`` of one sequence that the kernel loads: their positions
        in the chunks' ``[len(chs)*CHUNK_K]`` tile and the tokens (ascending)."""
        t = (chs[:, None] * pc.CHUNK_K + np.arange(pc.CHUNK_K)).reshape(-1)
        want = t < maxlen
        if self.has("table-padding-read"):
            # Loads every key of the chunk the table can address, padding included.
            want |= (t >= seq_tokens) & (t < c.max_blocks * c.block_size)
        pos = np.flatnonzero(want)
        return pos, t[pos]

    # -- memory -------------------------------------------------------------------------
    def block_base(self, c, bid):
        """Byte address of blocks ``bid`` (int64) as this kernel computes it."""
        stride = c.kv_block_stride
        if self.has("offset32-kv"):
            m = np.uint64(0xFFFFFFFF)
            return (((bid & 0xFFFFFFFF).astype(np.uint64) * np.uint64(stride & 0xFFFFFFFF)) & m).astype(np.int64)
        return bid * stride

    def check_reads(self, c, view, b, ts):
        """Raises the crash of the first block (ascending) of tokens ``ts`` of sequence b
        that the kernel cannot read whole: past the table or outside the cache."""
        if not ts.size:
            return
        jj = ts // c.block_size
        js = jj[np.flatnonzero(np.r_[True, jj[1:] != jj[:-1]])]
        past = js >= c.block_table_stride
        bid = np.zeros(js.size, np.int64)
        bid[~past] = c.block_table[b, js[~past]]
        base = self.block_base(c, bid)
        bad = past | (base < 0) | (base > view.len - c.block_bytes)
        if bad.any():
            x = int(np.argmax(bad))
            j = int(js[x])
            if past[x]:
                raise pc.Crash(f"illegal address: block_table[{b}][{j}] is past the table")
            view.read(int(base[x]), c.block_bytes, f"block id {int(bid[x])} (block_table[{b}][{j}])")

    def keys(self, c, view, table, offs, b, ts):
        """Decoded keys [len(ts), D] and scales [len(ts)] of tokens ``ts`` of sequence b
        (blocks already checked by :meth:`check_reads`)."""
        bs, d = c.block_size, c.head_dim
        j, p = np.divmod(ts, bs)
        bid = c.block_table[b, j].astype(np.int64)
        base = self.block_base(c, bid)
        k = view.index_of(bid)
        # The common case: a stored block at its true address, read by its index. Anything
        # else (wrapped offsets, padding ids, unreferenced blocks) is read by address.
        fast = (k >= 0) & (base == bid * c.kv_block_stride)
        scale_at = bs * d + 4 * p[:, None] + np.arange(4)
        if fast.all():
            codes = self.stored_codes(c, view, offs, k, p)
            sbytes = view.stored(k[:, None], scale_at)
        else:
            codes = np.empty((ts.size, d), np.uint8)
            sbytes = np.empty((ts.size, 4), np.uint8)
            f, s = np.flatnonzero(fast), np.flatnonzero(~fast)
            codes[f] = self.stored_codes(c, view, offs, k[f], p[f])
            sbytes[f] = view.stored(k[f, None], scale_at[f])
            codes[s] = view.gather(base[s, None] + offs[p[s]])
            sbytes[s] = view.gather(base[s, None] + scale_at[s])
        return table[codes], sbytes.view("<f4").reshape(-1)

    @staticmethod
    def stored_codes(c, view, offs, k, p):
        """fp8 codes [len(k), D] of positions p of stored blocks k: rows of the blocks
        viewed in their layout (whole rows gathered), else byte by byte through offs."""
        bs, d = c.block_size, c.head_dim
        vals = np.asarray(c.kv_blocks)[:, :bs * d]
        if c.layout == "normal":
            return vals.reshape(-1, bs, d)[k, p]
        if c.layout == "shuffle16" and bs % 16 == 0 and d % 16 == 0:
            # [16-token group][D/16][16 tokens][16 values]
            v = vals.reshape(-1, bs // 16, d // 16, 16, 16)
            return v[k, p // 16, :, p % 16, :].reshape(k.size, d)
        return view.stored(k[:, None], offs[p])

    # -- the stores ---------------------------------------------------------------------
    def store_at(self, c, b, chs, end):
        """Element indices into ``logits`` of the whole-chunk stores of chunks ``chs`` of
        sequence b's rows, ``[len(chs), N, CHUNK_K]`` in store order, and which of them are
        stored (below ``end``); raises the crash of the first store outside the buffer."""
        n = c.next_n
        t = chs[:, None] * pc.CHUNK_K + np.arange(pc.CHUNK_K)
        rows = b * n + np.arange(n, dtype=np.int64)
        elem = rows[None, :, None] * c.out_row_stride + t[:, None, :]
        if self.has("offset32-out"):
            elem = ((elem * 4).astype(np.int32).astype(np.int64)) // 4  # int32 byte offset
        at = c.guard_elems + elem
        live = np.broadcast_to((t < end)[:, None, :], at.shape)
        bad = live & ((at < 0) | (at >= c.logits.size))
        if bad.any():
            x = int(np.argmax(bad))
            r = int(rows[np.unravel_index(x, at.shape)[1]])
            raise pc.Crash(f"illegal address: store of row {r} at element offset {int(elem.reshape(-1)[x])} "
                           f"of a {c.rows * c.out_row_stride}-element output")
        return at, live

    # -- the run --------------------------------------------------------------------------
    def run(self, c):
        t0 = time.perf_counter()
        with np.errstate(invalid="ignore", over="ignore"):
            self.compute(c)
        return {"kernel_time_us": (time.perf_counter() - t0) * 1e6, "inputs_intact": True}

    def compute(self, c):
        n, h, d = c.next_n, c.heads, c.head_dim
        fmt = "e4m3fn" if self.has("fnuz-as-fn") else c.format
        table = pc.fp8_table(fmt)
        inside = self.has("scale-before-relu")
        view = pc.SparseDeviceView(c)
        offs = c.value_offsets()
        raw = c.logits
        end = c.max_model_len + 1 if self.has("store-past-end") else c.max_model_len
        lens, seq = self.believed(c)
        sched = self.schedule(c, seq)
        if sched is None:
            # The sentinel item (batch, 0): masked everywhere, stored like any other.
            at, live = self.store_at(c, c.batch, np.zeros(1, np.int64), end)
            raw[at[live]] = -np.inf
            return
        item_b, item_ch = sched
        # Items run in schedule order: (sequence, chunk) ascending, so each sequence's
        # items are one run of it.
        starts = np.flatnonzero(np.r_[True, item_b[1:] != item_b[:-1]]) if item_b.size else np.zeros(0, int)
        seqs = [(int(item_b[s]), item_ch[s:e]) for s, e in zip(starts, np.r_[starts[1:], item_b.size])]
        # Every item is computed before any store: the first unreadable block (in
        # schedule order) is the crash, whatever the stores would do.
        for b, chs in seqs:
            self.check_reads(c, view, b, self.needed(c, chs, lens[b].max(), seq[b])[1])
        q_codes = c.q.reshape(c.rows, h, d)
        w = c.weights.reshape(c.rows, h).astype(np.float32)
        group = max(1, GROUP_ELEMS // (pc.CHUNK_K * n * h))  # chunks computed at once
        for b, all_chs in seqs:
            qb = table[q_codes[b * n:(b + 1) * n]]  # [N, H, D]
            wb = w[b * n:(b + 1) * n]
            lb = lens[b]
            for g0 in range(0, all_chs.size, group):
                chs = all_chs[g0:g0 + group]
                at, live = self.store_at(c, b, chs, end)  # in store order: first bad store
                tile = np.full((n, chs.size * pc.CHUNK_K), -np.inf, np.float32)
                pos, ts = self.needed(c, chs, lb.max(), seq[b])
                if ts.size:
                    k, s = self.keys(c, view, table, offs, b, ts)
                    dots = np.empty((ts.size, n, h), np.float32)
                    for i in range(n):
                        np.matmul(k, qb[i].T, out=dots[:, i])  # f32 accumulation
                    if inside:
                        dots *= s[:, None, None]
                    relu = np.maximum(dots, np.float32(0), out=dots)  # NaN propagates
                    relu += np.float32(0)  # -0.0 -> 0.0, as relu32 gives
                    relu *= wb[None]
                    acc = relu.sum(axis=2, dtype=np.float32)  # [T, N]
                    if not inside:
                        acc *= s[:, None]
                    for i in range(n):
                        m = int(np.searchsorted(ts, lb[i]))  # ts ascending: t < len is a prefix
                        tile[i, pos[:m]] = acc[:m, i]
                vals = tile.reshape(n, chs.size, pc.CHUNK_K).transpose(1, 0, 2)
                raw[at[live]] = vals[live]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plant", type=plant_list, default=[], metavar="BUG[,BUG...]",
                    help="reproduce planted bugs (comma-separated): " + ", ".join(PLANTS))
    ap.add_argument("--compile-key", default="", metavar="FIELD[,FIELD...]",
                    help="declare a compile key (as a JIT-compiling library would), e.g. heads,head_dim,next_n")
    ap.add_argument("--kv-stride-align", type=int, default=0, metavar="BYTES",
                    help="declare that the KV block stride must be a multiple of BYTES, and skip cases "
                         "whose stride is not, as DeepGEMM's TMA descriptors do (tests)")
    ap.add_argument("--setup-delay", type=float, default=0.0, metavar="SECONDS",
                    help="take this long to set up each worker life, as a device initialisation does (tests)")
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
    align = args.kv_stride_align
    if align > 1:
        hello["capabilities"]["kv_stride_align"] = align

    def run(case):
        if align > 1 and case.kv_block_stride % align:
            raise pc.Skipped(f"the KV block stride must be a multiple of {align} bytes")
        return k.run(case)

    if args.compile_key:
        hello["compile_key"] = args.compile_key.split(",")
    def setup():
        time.sleep(args.setup_delay)
        return hello, run

    pc.serve_forking(setup, args.fault)


if __name__ == "__main__":
    main()
