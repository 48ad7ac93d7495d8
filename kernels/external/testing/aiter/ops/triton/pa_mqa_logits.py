"""A fake ``aiter.ops.triton.pa_mqa_logits`` for testing adapters without an AMD GPU.

Same signatures as AITER's; checks what AITER checks (KVBlockSize == block size, ChunkK
divisibility, Preshuffle needs bs % 16 == 0), reads the cache as AITER does
(``view(-1, bs*(D+4))``: values then scales, 16x16 tiles when Preshuffle), computes
``sum_h w * relu(s * q.k)`` in f32, and writes like the Gluon kernel: values on the valid
range, -inf on ``(ctx - N + i, ctx)``, nothing else. ``MQA_FUZZ_FAKE_BUG`` plants a known
AITER bug: ``token0`` (#5591: Preshuffle=False with bs > 1 reads only token 0 of each
block) or ``nan-last`` (NaN at each row's last valid position).
"""

import os

import torch

MQA_FUZZ_FAKE = True
# AITER dispatches on this flag; the fake writes like the Gluon kernel.
enable_gluon_pa_mqa_logits = True


def deepgemm_fp8_paged_mqa_logits_schedule(batch_size, next_n, context_lens, max_model_len, ChunkK, TotalCuCount, WavePerEU):
    return torch.zeros((TotalCuCount * WavePerEU, 4), dtype=torch.int32, device=context_lens.device)


def deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len,
                                  Preshuffle=False, KVBlockSize=1, ChunkK=256, TotalCuCount=None, WavePerEU=2,
                                  VarCtxSchedule=None):
    b, n, h, d = q_fp8.shape
    nb, bs = kv_cache.shape[0], kv_cache.shape[1]
    assert KVBlockSize == bs, f"KVBlockSize {KVBlockSize} != block size {bs}"
    assert ChunkK % bs == 0 or bs % ChunkK == 0
    assert not Preshuffle or bs % 16 == 0
    assert context_lens.dim() == 1 and context_lens.shape[0] == b
    assert out_logits.shape[0] == b * n and out_logits.shape[1] >= max_model_len
    flat = kv_cache.view(-1, bs * (d + 4))
    qf = q_fp8.float()
    bug = os.environ.get("MQA_FUZZ_FAKE_BUG")
    p = torch.arange(bs, device=q_fp8.device)[:, None]
    dd = torch.arange(d, device=q_fp8.device)[None, :]
    offs = ((p // 16) * 16 * d + (dd // 16) * 256 + (p % 16) * 16 + dd % 16) if Preshuffle else (p * d + dd)
    if bug == "token0" and not Preshuffle and bs > 1:
        offs = offs[:1].expand(bs, d)
    lens = context_lens.tolist()
    for s in range(b):
        ctx = lens[s]
        for i in range(n):
            r = s * n + i
            valid = max(0, ctx - n + i + 1)
            for t0 in range(0, ctx, bs):
                blk = flat[int(kv_indices[s, t0 // bs])]
                k = blk[offs.reshape(-1)].view(q_fp8.dtype).float().view(bs, d)
                sc = blk[bs * d:].contiguous().view(torch.float32)
                dots = qf[s, i] @ k.T * sc[None, :]  # [H, bs]
                v = (torch.relu(dots) * weights[r][:, None]).sum(0)
                m = min(bs, ctx - t0, max_model_len - t0)
                pos = torch.arange(t0, t0 + m, device=q_fp8.device)
                out_logits[r, t0:t0 + m] = torch.where(pos < valid, v[:m], float("-inf"))
            if bug == "nan-last" and valid > 0:
                out_logits[r, valid - 1] = float("nan")
