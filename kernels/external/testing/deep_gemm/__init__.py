"""A fake ``deep_gemm`` (2.8.x API) for testing the adapter without a GPU.

It checks arguments the way DeepGEMM's host code does (DG_HOST_ASSERT in
csrc/apis/attention.hpp of 2.8.2), allocates its output like the library (row stride
aligned to 256 floats, ``torch.empty``), and writes exactly the valid range in f32.
``MQA_FUZZ_FAKE_BUG=nan-last`` writes NaN at each row's last valid position instead, so a
test can show the adapter reports what the library does.
"""

import os

import torch

MQA_FUZZ_FAKE = True
__version__ = "2.8.2+fake"


def get_num_sms():
    return 132


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    assert context_lens.dim() == 2 and context_lens.dtype == torch.int32 and context_lens.is_contiguous()
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, indices=None):
    q_fp, q_sf = q
    assert q_sf is None and q_fp.dtype == torch.float8_e4m3fn and q_fp.is_contiguous()
    b, n, h, d = q_fp.shape
    assert h in (32, 64) and d in (32, 64, 128)
    assert weights.shape == (b * n, h) and weights.stride(1) == 1 and weights.stride(0) * 4 % 16 == 0
    assert weights.dtype == torch.float32
    nb, bs, one, dsf = kv_cache.shape
    assert bs == 64 and one == 1 and dsf == d + 4 and kv_cache.stride(1) == dsf and kv_cache.stride(3) == 1
    assert kv_cache.dtype == torch.uint8 and kv_cache.stride(0) % 4 == 0
    assert block_table.shape[0] == b and block_table.stride(1) == 1 and block_table.dtype == torch.int32
    assert context_lens.shape == (b, n) and context_lens.is_contiguous()
    assert schedule_meta.shape == (get_num_sms() + 1, 2)
    aligned = -(-max_context_len // 256) * 256
    logits = torch.empty((b * n, aligned), dtype=torch.float32, device=q_fp.device)[:, :max_context_len]
    flat = kv_cache.as_strided((nb, bs * dsf), (kv_cache.stride(0), 1))
    qf = q_fp.float()
    bug = os.environ.get("MQA_FUZZ_FAKE_BUG")
    lens = context_lens.tolist()
    for s in range(b):
        for i in range(n):
            ln = lens[s][i]
            r = s * n + i
            for t0 in range(0, ln, bs):
                blk = flat[int(block_table[s, t0 // bs])]
                k = blk[:bs * d].view(torch.float8_e4m3fn).float().view(bs, d)
                sc = blk[bs * d:].contiguous().view(torch.float32)
                dots = torch.relu(qf[s, i] @ k.T)  # [H, bs]
                v = (dots * weights[r][:, None]).sum(0) * sc
                m = min(bs, ln - t0)
                logits[r, t0:t0 + m] = v[:m]
            if bug == "nan-last" and ln > 0:
                logits[r, ln - 1] = float("nan")
    return logits
