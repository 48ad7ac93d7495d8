#!/usr/bin/env python3
"""vLLM's paged MQA logits entry point as an mqa-fuzz worker, called as vLLM calls it.

``vllm.v1.attention.ops.rocm_aiter_mla_sparse.rocm_fp8_paged_mqa_logits(q_fp8,
kv_cache_fp8, weights, context_lens, block_tables, schedule_metadata, max_model_len)``:
on gfx942/gfx950 with AITER enabled it runs AITER's kernel (``Preshuffle = block_size >
1``, so block size 1 means the normal layout and larger blocks the 16x16 tiles) into a
workspace it reuses and never zeroes; otherwise the torch fallback
``fp8_paged_mqa_logits_torch`` (``--path torch`` calls that directly).

The workspace is what makes this path different from calling AITER: positions the kernel
does not write hold whatever the previous step left. To make that visible, the adapter
fills the workspace the last call returned with the poison NaN before each call (a
distinctive "previous step"), so unwritten positions are reported as ``unwritten``
instead of passing as plausible stale logits.

    mqa-fuzz replay corpus/*.json --kernel vllm
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_common as pc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", choices=["entry", "torch"], default="entry",
                    help="entry: rocm_fp8_paged_mqa_logits (AITER or its own fallback); torch: fp8_paged_mqa_logits_torch")
    ap.add_argument("--format", choices=["auto", "e4m3fn", "e4m3fnuz"], default="auto")
    ap.add_argument("--stale", choices=["poison", "keep"], default="poison",
                    help="what the reused workspace holds before a call: the poison NaN, or the previous case's logits")
    pc.add_common_args(ap)
    args = ap.parse_args()
    out = pc.protocol_stdout()
    try:
        import torch
        import torch_common as tc
        import vllm
        from vllm.v1.attention.ops import rocm_aiter_mla_sparse as ras
    except Exception as e:  # noqa: BLE001
        pc.refuse("environment", f"cannot import vllm.v1.attention.ops.rocm_aiter_mla_sparse: {type(e).__name__}: {e}", out)

    def setup():
        """Device checks, the hello and the kernel: run in each worker life, after
        the fork server forked it (no device is touched before)."""
        fake = getattr(ras, "MQA_FUZZ_FAKE", False)
        if not torch.cuda.is_available() and not fake:
            raise tc.no_device("GPU")
        dev = tc.device()
        arch = torch.cuda.get_device_properties(dev).gcnArchName if dev.type == "cuda" and torch.version.hip else ""
        fmt = args.format if args.format != "auto" else ("e4m3fnuz" if "gfx942" in arch else "e4m3fn")
        on_aiter = args.path == "entry" and getattr(ras, "uses_aiter", lambda: bool(arch))()
        limit = torch.cuda.mem_get_info(dev)[0] * 0.6 if dev.type == "cuda" else 2 << 30
        caps = pc.capabilities(
            formats=[fmt],
            layouts=["normal", "shuffle16"] if on_aiter else ["normal"],
            block_sizes={"list": [1, 16, 32, 64, 128, 256]},
            next_n=[1, 2],
            heads=[32, 64],
            head_dims=[64, 128],
            lens_2d=False,
            scale_placement="inside_relu",
            outside="any" if on_aiter else "neg_inf",
            max_kv_bytes=int(limit),
            nan_behaviour="reported per case",
        )
        what = "rocm_fp8_paged_mqa_logits (AITER)" if on_aiter else (
            "fp8_paged_mqa_logits_torch" if args.path == "torch" else "rocm_fp8_paged_mqa_logits (torch fallback)")
        hello = {"name": f"vllm:{what}", "library": "vllm", "version": getattr(vllm, "__version__", "unknown"),
                 "device": tc.device_name(dev), "capabilities": caps,
                 "compile_key": ["heads", "head_dim", "next_n", "block_size"]}
        workspace = {"last": None}

        def call(q, kv, w, lens, table, meta, mml):
            if args.path == "torch":
                return ras.fp8_paged_mqa_logits_torch(q, kv, w, lens, table, mml)
            return ras.rocm_fp8_paged_mqa_logits(q, kv, w, lens, table, meta, mml)

        def run(case):
            if on_aiter and (case.block_size > 1) != (case.layout == "shuffle16"):
                raise pc.Skipped("vLLM passes Preshuffle = block_size > 1: layout must be shuffle16 exactly when bs > 1")
            tc.reset_peak(dev)
            q, w, lens, table = tc.inputs(case, dev)
            flat, kv = tc.kv_cache(case, dev)
            meta = torch.zeros((1, 2), dtype=torch.int32, device=dev)  # unused on ROCm
            before = tc.checksum(q, w, lens, table, flat)
            if workspace["last"] is None:
                workspace["last"] = call(q, kv, w, lens, table, meta, case.max_model_len)  # the "previous step"
            if args.stale == "poison":
                st = workspace["last"].untyped_storage()
                torch.empty(0, dtype=torch.float32, device=dev).set_(st).fill_(float(tc.poison_f32()))
            logits, us = tc.timed(dev, lambda: call(q, kv, w, lens, table, meta, case.max_model_len))
            if args.stale == "poison" and logits.untyped_storage().data_ptr() != workspace["last"].untyped_storage().data_ptr():
                print("note: vLLM returned a new workspace; its unwritten positions hold stale data, not poison",
                      file=sys.stderr, flush=True)
            workspace["last"] = logits
            after = tc.checksum(q, w, lens, table, flat)
            case.interior()[:, :case.max_model_len] = logits.float().cpu().numpy()
            if before != after:
                tc.forget_cache()  # the kernel wrote into its inputs: poison all again
            return {"kernel_time_us": us, "inputs_intact": before == after, "device_bytes": tc.device_bytes(dev)}
        return hello, run

    pc.serve_forking(setup, args.fault, out)


if __name__ == "__main__":
    main()
