#!/usr/bin/env python3
"""AITER's FP8 paged MQA logits kernel as an mqa-fuzz worker (AMD ROCm; gfx942 uses
e4m3fnuz, gfx950 e4m3fn).

Calls ``aiter.ops.triton.pa_mqa_logits.deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache,
weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle, KVBlockSize,
ChunkK, TotalCuCount, WavePerEU, VarCtxSchedule)`` the way vLLM does. The caller owns
``out_logits``: here it is a ``[rows, max_model_len]`` view (row stride
``out_row_stride``) inside the whole poisoned, guarded buffer on the device, so
unwritten positions and out-of-bounds stores are both seen. ``shuffle16`` cases run with
``Preshuffle=True``; ``--varctx`` adds the variable-context schedule; ``--guard`` applies
the engines' ``nan_to_num_(-inf)`` afterwards (to show what the guard hides).

Capabilities follow AITER's dispatch, so that a precondition AITER asserts is a skip with
its reason, not a finding: ``Preshuffle=True`` runs only on the Gluon path
(``pa_mqa_logits.enable_gluon_pa_mqa_logits``; the plain Triton path asserts "Preshuffle
mode is only supported on gluon kernel."), and there only with ``KVBlockSize % 16 == 0``.

    mqa-fuzz replay corpus/*.json --kernel aiter
    mqa-fuzz replay corpus/*.json --kernel 'aiter --varctx --chunk-k 64'
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_common as pc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk-k", type=int, default=256, help="ChunkK (64 or 256)")
    ap.add_argument("--wave-per-eu", type=int, default=2)
    ap.add_argument("--varctx", action="store_true", help="pass VarCtxSchedule from deepgemm_fp8_paged_mqa_logits_schedule")
    ap.add_argument("--guard", action="store_true", help="apply out_logits.nan_to_num_(-inf) after the call, as engines did")
    ap.add_argument("--format", choices=["auto", "e4m3fn", "e4m3fnuz"], default="auto",
                    help="fp8 flavour (auto: e4m3fnuz on gfx942, e4m3fn otherwise)")
    ap.add_argument("--rel", type=float, default=None, help="declare Reduced{rel} accumulation instead of f32")
    ap.add_argument("--heads", default="32,64", help="accepted H (comma list)")
    ap.add_argument("--max-next-n", type=int, default=2)
    pc.add_common_args(ap)
    args = ap.parse_args()
    out = pc.protocol_stdout()
    try:
        import torch
        import torch_common as tc
        from aiter.ops.triton import pa_mqa_logits as pml
        import aiter
    except Exception as e:  # noqa: BLE001
        pc.refuse("environment", f"cannot import aiter.ops.triton.pa_mqa_logits/torch: {type(e).__name__}: {e}", out)

    def setup():
        """Device checks, the hello and the kernel: run in each worker life, after
        the fork server forked it (no device is touched before)."""
        fake = getattr(pml, "MQA_FUZZ_FAKE", False)
        if not torch.cuda.is_available() and not fake:
            raise tc.no_device("ROCm/CUDA device")
        dev = tc.device()
        arch = torch.cuda.get_device_properties(dev).gcnArchName if dev.type == "cuda" else "fake"
        fmt = args.format if args.format != "auto" else ("e4m3fnuz" if "gfx942" in arch else "e4m3fn")
        cu = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 80
        limit = torch.cuda.mem_get_info(dev)[0] * 0.6 if dev.type == "cuda" else 2 << 30
        ck = args.chunk_k
        sizes = [b for b in (1, 16, 32, 64, 128, 256, 512) if ck % b == 0 or b % ck == 0]
        gluon = bool(getattr(pml, "enable_gluon_pa_mqa_logits", False))
        caps = pc.capabilities(
            formats=[fmt],
            layouts=["normal", "shuffle16"] if gluon else ["normal"],
            block_sizes={"list": sizes},
            next_n=[1, args.max_next_n],
            heads=[int(h) for h in args.heads.split(",")],
            head_dims=[64, 128],
            lens_2d=False,
            scale_placement="inside_relu",
            accumulation={"kind": "reduced", "rel": args.rel} if args.rel else {"kind": "f32"},
            outside="any",
            max_kv_bytes=int(limit),
            nan_behaviour="reported per case" + ("; nan_to_num_(-inf) applied after the kernel" if args.guard else ""),
        )
        opts = f"ChunkK={ck} WavePerEU={args.wave_per_eu}" + ("" if gluon else " triton-path") + (" varctx" if args.varctx else "") + (" +guard" if args.guard else "")
        version = getattr(aiter, "__version__", None) or _dist_version("amd-aiter") or "unknown"
        hello = {"name": f"aiter:deepgemm_fp8_paged_mqa_logits {opts}", "library": "aiter", "version": str(version),
                 "device": tc.device_name(dev) if dev.type == "cuda" else "cpu (fake aiter)", "capabilities": caps,
                 "compile_key": ["heads", "head_dim", "next_n", "block_size", "layout", "format"]}

        def run(case):
            tc.reset_peak(dev)
            q, w, lens, table = tc.inputs(case, dev)
            flat, kv = tc.kv_cache(case, dev)
            buf, logits = tc.guarded_output(case, dev)
            before = tc.checksum(q, w, lens, table, flat)
            preshuffle = case.layout == "shuffle16"
            if preshuffle and not gluon:
                raise pc.Skipped("aiter: Preshuffle mode is only supported on gluon kernel (enable_gluon_pa_mqa_logits is off)")
            if preshuffle and case.block_size % 16:
                raise pc.Skipped(f"aiter: Preshuffle mode only supports KVBlockSize aligned to 16 (block size {case.block_size})")
            sched = None
            if args.varctx:
                sched = pml.deepgemm_fp8_paged_mqa_logits_schedule(case.batch, case.next_n, lens, case.max_model_len,
                                                                   ck, cu, args.wave_per_eu)

            def call():
                pml.deepgemm_fp8_paged_mqa_logits(q, kv, w, logits, lens, table, case.max_model_len,
                                                  Preshuffle=preshuffle, KVBlockSize=case.block_size, ChunkK=ck,
                                                  TotalCuCount=cu, WavePerEU=args.wave_per_eu, VarCtxSchedule=sched)
                if args.guard:
                    logits.nan_to_num_(float("-inf"))
            _, us = tc.timed(dev, call)
            after = tc.checksum(q, w, lens, table, flat)
            case.logits[:] = buf.cpu().numpy()
            if before != after:
                tc.forget_cache()  # the kernel wrote into its inputs: poison all again
            return {"kernel_time_us": us, "inputs_intact": before == after, "device_bytes": tc.device_bytes(dev)}
        return hello, run

    pc.serve_forking(setup, args.fault, out)


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
