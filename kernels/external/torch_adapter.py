#!/usr/bin/env python3
"""The paged MQA logits reference as serving engines write it in torch, as an mqa-fuzz
worker: the shape of vLLM's ``fp8_paged_mqa_logits_torch`` fallback (itself taken from
DeepGEMM's test reference) — logits pre-filled with -inf, a Python loop over sequences
and blocks, each K block dequantized as ``fp8.float() * scale`` (so the scale sits inside
the relu), ``relu(q.k) * w`` summed over heads, causal mask per query token. Runs on the
GPU when torch sees one, else on the CPU.

    mqa-fuzz replay corpus/*.json --kernel torch
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_common as pc  # noqa: E402


def fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len, lens_2d):
    # kv_cache's fp8 flavour is q's (e4m3fn or e4m3fnuz).
    """q fp8 [B,N,H,D]; kv_cache uint8 [num_blocks, bs, 1, D+4] (block-flat: bs*D codes,
    then bs f32 scales); weights [B*N,H]; context_lens [B] or [B,N]; block_tables [B,M]."""
    import torch
    batch_size, next_n, _, dim = q.size()
    num_blocks, block_size = kv_cache.size(0), kv_cache.size(1)
    flat = kv_cache.as_strided((num_blocks, block_size * (dim + 4)), (kv_cache.stride(0), 1))
    logits = torch.full([batch_size * next_n, max_model_len], float("-inf"), device=q.device, dtype=torch.float32)
    fp8 = q.dtype
    q = q.float()
    lens = context_lens.tolist()
    for i in range(batch_size):
        if lens_2d:
            row_lens = torch.tensor(lens[i], device=q.device)
        else:
            row_lens = torch.arange(lens[i] - next_n + 1, lens[i] + 1, device=q.device)
        seq_tokens = max(0, int(row_lens.max()))
        weight_slice = weights[i * next_n:(i + 1) * next_n, :].transpose(0, 1).contiguous()  # [H, N]
        for block_rk in range((seq_tokens + block_size - 1) // block_size):
            block_idx = int(block_tables[i][block_rk])
            blk = flat[block_idx]
            kx = blk[:block_size * dim].view(fp8).float().view(block_size, dim)
            scale = blk[block_size * dim:].contiguous().view(torch.float32)
            kx = kx * scale[:, None]
            k_offsets = torch.arange(block_rk * block_size, (block_rk + 1) * block_size, device=q.device)
            mask = k_offsets[None, :] < row_lens[:, None]  # [N, bs]
            s = torch.einsum("nhd,td->hnt", q[i], kx)  # [H, N, bs]
            s = torch.where(mask[None], s, float("-inf"))
            s = torch.relu(s) * weight_slice[..., None]
            s = s.sum(dim=0)  # [N, bs]
            lo, hi = block_rk * block_size, min((block_rk + 1) * block_size, max_model_len)
            logits[i * next_n:(i + 1) * next_n, lo:hi] = torch.where(mask, s, float("-inf"))[:, :hi - lo]
    return logits


def store_into(kv):
    """The planted bug of ``--plant-store-into-cache``: one byte of the cache changed."""
    kv[(0,) * kv.dim()] += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    ap.add_argument("--plant-store-into-cache", action="store_true",
                    help="testing mqa-fuzz: add 1 to the KV cache's first byte before each launch, "
                         "as a library that writes into its inputs would (mqa-fuzz must report input_mutated)")
    pc.add_common_args(ap)
    args = ap.parse_args()
    out = pc.protocol_stdout()
    try:
        import torch
        import torch_common as tc
    except Exception as e:  # noqa: BLE001
        pc.refuse("environment", f"cannot import torch: {type(e).__name__}: {e}", out)

    def setup():
        """Device checks, the hello and the kernel: run in each worker life, after
        the fork server forked it (no device is touched before)."""
        dev = torch.device("cpu") if args.cpu else tc.device()
        limit = torch.cuda.mem_get_info(dev)[0] * 0.6 if dev.type == "cuda" else 2 << 30
        hello = {
            "name": "torch:fp8_paged_mqa_logits_torch",
            "library": "torch",
            "version": torch.__version__,
            "device": tc.device_name(dev),
            "capabilities": pc.capabilities(
                layouts=["normal"],
                scale_placement="inside_relu",
                outside="neg_inf",
                max_kv_bytes=int(limit),
                nan_behaviour="torch.relu keeps NaN; -inf masks are applied before the relu",
            ),
        }

        def run(case):
            tc.reset_peak(dev)
            q, w, lens, table = tc.inputs(case, dev)
            flat, kv = tc.kv_cache(case, dev)
            before = tc.checksum(q, w, lens, table, flat)
            if args.plant_store_into_cache:
                store_into(kv)
            logits, us = tc.timed(dev, lambda: fp8_paged_mqa_logits_torch(q, kv, w, lens, table, case.max_model_len, case.lens_2d))
            after = tc.checksum(q, w, lens, table, flat)
            case.interior()[:, :case.max_model_len] = logits.cpu().numpy()
            if before != after:
                tc.forget_cache()  # the kernel wrote into its inputs: poison all again
            return {"kernel_time_us": us, "inputs_intact": before == after, "device_bytes": tc.device_bytes(dev)}
        def launch(c):
            """Hosted (hosted.py): the case is on the device already, checked and judged
            there by mqa-fuzz."""
            q = c.q(tc.fp8_dtype(c.format))
            if args.plant_store_into_cache:
                store_into(c.kv_cache())
            logits, us = tc.timed(dev, lambda: fp8_paged_mqa_logits_torch(
                q, c.kv_cache(), c.weights(), c.lens(), c.table(), c.max_model_len, c.lens_2d))
            c.out().copy_(logits)
            return us
        return hello, run, (dev, launch)

    pc.serve_forking(setup, args.fault, out)


if __name__ == "__main__":
    main()
