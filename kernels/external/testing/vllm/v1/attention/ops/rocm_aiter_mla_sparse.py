"""A fake of vLLM's ``rocm_aiter_mla_sparse`` paged-MQA-logits entry points, for testing
the adapter without ROCm: the same signatures, the same choice of path (AITER when
``VLLM_ROCM_USE_AITER=1`` and ``aiter`` imports, else the torch fallback), and the same
workspace habit: one module-level buffer, grown with ``torch.empty``, never zeroed,
returned as a ``[B*N, max_model_len]`` view."""

import os

import torch

MQA_FUZZ_FAKE = True
_WS = {"buf": None}


def uses_aiter():
    if os.environ.get("VLLM_ROCM_USE_AITER", "1") != "1":
        return False
    try:
        import aiter.ops.triton.pa_mqa_logits  # noqa: F401
        return True
    except ImportError:
        return False


def _workspace(rows, cols, device):
    n = rows * cols
    if _WS["buf"] is None or _WS["buf"].numel() < n or _WS["buf"].device != device:
        _WS["buf"] = torch.empty(n, dtype=torch.float32, device=device)
    return _WS["buf"][:n].view(rows, cols)


def fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len):
    b, n, h, d = q.shape
    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.as_strided((nb, bs * (d + 4)), (kv_cache.stride(0), 1))
    logits = torch.full([b * n, max_model_len], float("-inf"), device=q.device, dtype=torch.float32)
    qf = q.float()
    for s, ctx in enumerate(context_lens.tolist()):
        for blk_i in range((ctx + bs - 1) // bs):
            blk = flat[int(block_tables[s][blk_i])]
            k = blk[:bs * d].view(q.dtype).float().view(bs, d) * blk[bs * d:].contiguous().view(torch.float32)[:, None]
            pos = torch.arange(blk_i * bs, (blk_i + 1) * bs, device=q.device)
            for i in range(n):
                r = s * n + i
                v = (torch.relu(qf[s, i] @ k.T) * weights[r][:, None]).sum(0)
                v = torch.where(pos <= ctx - n + i, v, float("-inf"))
                hi = min(bs, max_model_len - blk_i * bs)
                logits[r, blk_i * bs:blk_i * bs + hi] = v[:hi]
    return logits


def rocm_fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, context_lens, block_tables, schedule_metadata,
                              max_model_len, *, compress_ratio=1):
    b, n = q_fp8.shape[0], q_fp8.shape[1]
    if uses_aiter():
        from aiter.ops.triton.pa_mqa_logits import deepgemm_fp8_paged_mqa_logits
        out = _workspace(b * n, max_model_len, q_fp8.device)
        bs = kv_cache_fp8.shape[1]
        deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache_fp8, weights, out, context_lens, block_tables, max_model_len,
                                      ChunkK=256, Preshuffle=bs > 1, KVBlockSize=bs, WavePerEU=2)
        return out
    return fp8_paged_mqa_logits_torch(q_fp8, kv_cache_fp8, weights, context_lens, block_tables, max_model_len)
