#!/usr/bin/env python3
"""numpy (BLAS f64) version of mqa-fuzz's exact reference, for `mqa-fuzz bench reference`.

Usage: numpy_reference.py CASE.safetensors OUT.safetensors MIN_SECONDS

Reads the case tensors written by the bench (q codes, weights, KV blocks by id, block
table, context lengths, the 256-entry fp8 decode table), computes every logit of V(r)
the way a numpy user would (decode through the table, one `Q @ K.T` dgemm per sequence,
relu keeping NaN, weights by a matrix-vector product, scale), times it (best of repeats
over at least MIN_SECONDS), writes the logits concatenated row by row to OUT and prints
one JSON line: seconds, repeats, BLAS info. The thread count comes from the usual
environment variables (OPENBLAS_NUM_THREADS, ...), set by the bench.
Only numpy is required; threadpoolctl, when present, names the BLAS kernel.
"""
import json
import struct
import sys
import time

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    dtypes = {"U8": np.uint8, "F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[base + a : base + b], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out, meta


def write_safetensors(path, name, array):
    raw = np.ascontiguousarray(array, dtype=np.float64).tobytes()
    header = json.dumps({name: {"dtype": "F64", "shape": [int(array.size)], "data_offsets": [0, len(raw)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + raw)


def valid_lens(ctx, next_n):
    if ctx.ndim == 1:
        return np.maximum(ctx[:, None] - next_n + np.arange(next_n)[None, :] + 1, 0)
    return np.maximum(ctx, 0)


def compute(t, meta):
    table = t["table"]  # 256-entry f64 decode table
    q = t["q"]  # [B, N, H, D] u8
    B, N, H, D = q.shape
    bs = int(meta["block_size"])
    shuffle = meta["layout"] == "shuffle16"
    after = meta["placement"] == "after_relu_sum"
    w = t["weights"].astype(np.float64).reshape(B, N, H)
    ids = t["kv_block_ids"]
    order = np.argsort(ids)
    blocks = t["kv_blocks"]
    lens = valid_lens(t["context_lens"], N)
    out = []
    for b in range(B):
        T = int(lens[b].max())
        if T == 0:
            continue
        nblk = -(-T // bs)
        pos = order[np.searchsorted(ids, t["block_table"][b, :nblk], sorter=order)]
        blk = blocks[pos]
        codes = blk[:, : bs * D]
        if shuffle:
            codes = codes.reshape(nblk, bs // 16, D // 16, 16, 16).transpose(0, 1, 3, 2, 4)
        codes = codes.reshape(nblk * bs, D)[:T]
        scale = np.ascontiguousarray(blk[:, bs * D :]).view(np.float32).reshape(-1)[:T].astype(np.float64)
        k = table[codes]  # [T, D] f64
        qd = table[q[b]].reshape(N * H, D)
        dots = (qd @ k.T).reshape(N, H, T)  # the dgemm
        for i in range(N):
            L = int(lens[b, i])
            d = dots[i, :, :L]
            if not after:
                d = d * scale[:L]
            r = np.where(d <= 0, 0.0, d)  # relu that keeps NaN
            v = w[b, i] @ r
            m = np.abs(w[b, i]) @ r
            if after:
                v = v * scale[:L]
                m = m * np.abs(scale[:L])
            out.append(v)
    return np.concatenate(out) if out else np.zeros(0)


def blas_info():
    try:
        from threadpoolctl import threadpool_info

        return [
            {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads", "threading_layer")}
            for p in threadpool_info()
            if p.get("user_api") == "blas"
        ]
    except ImportError:
        return "threadpoolctl not installed: BLAS kernel unknown"


def main():
    case_path, out_path, min_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    t, meta = read_safetensors(case_path)
    result = compute(t, meta)  # warm-up (and the values to compare)
    best, reps, total = float("inf"), 0, 0.0
    while reps < 3 or total < min_s:
        start = time.perf_counter()
        compute(t, meta)
        el = time.perf_counter() - start
        best, reps, total = min(best, el), reps + 1, total + el
    write_safetensors(out_path, "value", result)
    print(json.dumps({"seconds": best, "repeats": reps, "numpy": np.__version__, "blas": blas_info()}))


if __name__ == "__main__":
    main()
