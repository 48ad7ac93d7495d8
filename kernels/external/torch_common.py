"""Torch helpers shared by the library adapters (DeepGEMM, AITER, vLLM, torch): the
poisoned device cache as the libraries take it, inputs on the device, checksums for
``inputs_intact``, and kernel timing."""

import numpy as np
import torch

import protocol_common as pc


def device():
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def no_device(what):
    """The environment refusal for a machine where torch sees no usable GPU, with
    torch's own reason where it gives one: a GPU lost to a fault ("busy or
    unavailable") is not the same as a machine without one."""
    try:
        torch.cuda.init()
        why = ""
    except Exception as e:  # noqa: BLE001
        why = f": {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    return pc.Environment(f"no {what} usable by torch{why}")


def device_name(dev):
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        arch = getattr(p, "gcnArchName", None) or f"sm{p.major}{p.minor}"
        return f"{p.name} ({arch})"
    return "cpu"


def fp8_dtype(fmt):
    return torch.float8_e4m3fn if fmt == "e4m3fn" else torch.float8_e4m3fnuz


def poison_f32():
    return np.array([pc.POISON_BITS], np.uint32).view(np.float32)[0]


# The device cache kept from case to case (a persistent, poisoned allocation): a
# multi-GiB cache costs its allocation and full poisoning once per size class and slot
# pattern, not once per case; after a case only the slots it stored are poisoned again.
_CACHE = {"flat": None, "pattern": None, "stored": None}


def kv_cache(case, dev):
    """The poisoned device cache: a flat uint8 allocation of at least ``num_blocks *
    kv_block_stride`` bytes, stored blocks at ``id * stride``, poison elsewhere (past
    ``num_blocks`` too, so a read past the end reads NaN), and the
    ``[num_blocks, bs, 1, D+4]`` uint8 view with ``stride(0) = kv_block_stride`` that the
    libraries take. The allocation is reused while it is between 1 and 2 times the size
    needed. Out of memory is :class:`Skipped`."""
    n, s = case.num_blocks, case.kv_block_stride
    need = n * s
    flat = _CACHE["flat"]
    if flat is None or flat.device != dev or not need <= flat.numel() <= 2 * need + (64 << 20):
        _CACHE.update(flat=None, pattern=None, stored=None)
        del flat
        try:
            flat = torch.empty(need, dtype=torch.uint8, device=dev)
        except (torch.cuda.OutOfMemoryError, RuntimeError, MemoryError) as e:
            raise pc.Skipped(f"cannot allocate the {need}-byte KV cache on {dev}: {e}")
        _CACHE["flat"] = flat
    cap_slots = flat.numel() // s
    rows = flat[:cap_slots * s].view(cap_slots, s)
    pattern = (s, case.block_size, case.head_dim, case.format)
    poison = torch.from_numpy(case.slot_poison()).to(dev)
    if _CACHE["pattern"] != pattern:
        rows.copy_(poison.expand(cap_slots, s))
        flat[cap_slots * s:] = poison[:flat.numel() - cap_slots * s]
        _CACHE["pattern"] = pattern
    elif _CACHE["stored"] is not None and _CACHE["stored"].numel():
        old = _CACHE["stored"]
        rows[old] = poison.expand(old.numel(), s)
    ids = torch.from_numpy(case.kv_ids.astype(np.int64)).to(dev)
    if len(case.kv_ids):
        rows[ids, :case.block_bytes] = torch.from_numpy(np.ascontiguousarray(case.kv_blocks)).to(dev)
    _CACHE["stored"] = ids
    view = flat.as_strided((n, case.block_size, 1, case.head_dim + 4), (s, case.head_dim + 4, case.head_dim + 4, 1))
    return CacheInputs(flat[:need], rows, ids), view


class CacheInputs:
    """What :func:`checksum` compares of the cache before and after a run."""

    def __init__(self, flat, rows, ids):
        self.flat, self.rows, self.ids = flat, rows, ids


def forget_cache():
    """After a run that changed the cache: poison it all again next time."""
    _CACHE["pattern"] = None


def inputs(case, dev):
    """q (fp8 [B,N,H,D]), weights (f32 [B*N,H]), lengths (int32 as given), block table
    (int32 [B, max_blocks] view with the case's row stride)."""
    q = torch.from_numpy(np.ascontiguousarray(case.q)).to(dev).view(fp8_dtype(case.format))
    w = torch.from_numpy(np.ascontiguousarray(case.weights)).to(dev)
    lens = torch.from_numpy(np.ascontiguousarray(case.context_lens)).to(dev)
    table_full = torch.from_numpy(np.ascontiguousarray(case.block_table)).to(dev)
    table = table_full[:, :case.max_blocks]
    return q, w, lens, table


def lens_2d(case):
    """Per-token lengths [B, N] (1-D lengths expanded: row i sees ctx - N + i + 1)."""
    if case.lens_2d:
        return np.ascontiguousarray(case.context_lens, dtype=np.int32)
    n = case.next_n
    c = case.context_lens.astype(np.int64)[:, None]
    return np.maximum(0, c - n + np.arange(n)[None, :] + 1).astype(np.int32)


def checksum(*ts):
    """An order-sensitive checksum of tensors' bytes, computed on their device. The KV
    cache (:class:`CacheInputs`) counts in full up to 256 MiB; above that, its stored
    blocks in full plus every 997th word of the whole allocation, so that an
    engine-sized cache (tens of GiB) costs a gather, not two full reads per case."""
    out = []
    for t in ts:
        if isinstance(t, CacheInputs):
            if t.flat.numel() < (1 << 28):
                t = t.flat
            else:
                words = t.flat[:t.flat.numel() - t.flat.numel() % 4].view(torch.int32)
                out.extend(checksum(t.rows[t.ids]) if t.ids.numel() else [0, 0])
                out.append(int(words[::997].to(torch.int64).sum()))
                continue
        b = t.reshape(-1).view(torch.uint8) if t.is_contiguous() else t.contiguous().reshape(-1).view(torch.uint8)
        n = b.numel() - b.numel() % 4
        words = b[:n].view(torch.int32)
        if words.numel() < (1 << 26):
            pos = torch.arange(words.numel(), device=t.device, dtype=torch.int32) % 65521 + 1
            out.append(int((words.to(torch.int64) * pos).sum()))
        else:
            step = 1 << 28
            total = sum(int(words[i:i + step].sum(dtype=torch.int64)) for i in range(0, words.numel(), step))
            out.append(total ^ int(words[::997].to(torch.int64).sum()))
        out.append(int(b[n:].to(torch.int64).sum()))
    return out


def timed(dev, fn):
    """Runs fn(); returns (result, microseconds), with device events on GPUs."""
    if dev.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        r = fn()
        b.record()
        torch.cuda.synchronize()
        return r, a.elapsed_time(b) * 1000.0
    import time
    t0 = time.perf_counter()
    r = fn()
    return r, (time.perf_counter() - t0) * 1e6


def guarded_output(case, dev):
    """The whole guarded logits buffer on the device (poisoned as received), and the
    ``[rows, max_model_len]`` view with row stride ``out_row_stride`` inside it."""
    buf = torch.from_numpy(case.logits).to(dev)
    g = case.guard_elems
    view = buf[g:g + case.rows * case.out_row_stride].view(case.rows, case.out_row_stride)[:, :case.max_model_len]
    return buf, view


def device_bytes(dev):
    if dev.type == "cuda":
        return int(torch.cuda.max_memory_allocated(dev))
    return None


def reset_peak(dev):
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
