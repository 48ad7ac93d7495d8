#!/usr/bin/env python3
"""DeepGEMM's FP8 paged MQA logits kernel as an mqa-fuzz worker (NVIDIA SM90).

Handles both API generations:
  * 2.8.x: ``fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens_2d,
    block_table, schedule_meta, max_context_len)`` — 2-D lengths only (1-D lengths are
    expanded to the per-token form an engine passes: row i sees ctx - N + i + 1);
  * 2.1.x: ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens_1d, block_table,
    schedule_meta, max_context_len, clean_logits)`` — ``--clean-logits`` declares the
    ``neg_inf`` contract outside V(r).
``schedule_meta = get_paged_mqa_logits_metadata(lens, 64, get_num_sms())``, recomputed
per case. DeepGEMM allocates its output (row stride aligned to 256 floats); the adapter
poisons that allocation first (a freed poisoned block of the same size is what the
caching allocator hands back), so unwritten positions stay detectable, then copies the
``[rows, max_model_len]`` result into the guarded buffer.

With ``libmqa_fuzz.so`` beside the ``mqa-fuzz`` binary (``MQA_FUZZ_HOSTED``, hosted.py) the
adapter is served hosted: mqa-fuzz lays the case out on the device in this process,
checks and judges it there, and the adapter only calls DeepGEMM and copies its result
into the poisoned output (device to device).

    mqa-fuzz replay corpus/*.json --kernel deepgemm
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol_common as pc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean-logits", action="store_true", help="2.1.x: pass clean_logits=True (declares -inf outside V(r))")
    ap.add_argument("--rel", type=float, default=2.0 ** -13,
                    help="declared relative accumulation error per dot (Hopper fp8 MMA: ~2^-13)")
    ap.add_argument("--api", choices=["auto", "fp8_fp4", "fp8"], default="auto", help="entry point generation")
    pc.add_common_args(ap)
    args = ap.parse_args()
    out = pc.protocol_stdout()
    try:
        import numpy as np
        import torch
        import torch_common as tc
        import deep_gemm
    except Exception as e:  # noqa: BLE001
        pc.refuse("environment", f"cannot import deep_gemm/torch: {type(e).__name__}: {e}", out)

    def setup():
        """Device checks, the hello and the kernel: run in each worker life, after
        the fork server forked it (no device is touched before)."""
        if not torch.cuda.is_available() and not getattr(deep_gemm, "MQA_FUZZ_FAKE", False):
            raise tc.no_device("CUDA device")
        dev = tc.device()
        if dev.type == "cuda":
            major = torch.cuda.get_device_capability(dev)[0]
            if major != 9:
                raise pc.Environment(f"only SM90 is supported by this adapter (found sm{major}x)")

        api = args.api
        if api == "auto":
            api = "fp8_fp4" if hasattr(deep_gemm, "fp8_fp4_paged_mqa_logits") else "fp8"
        if api == "fp8" and not hasattr(deep_gemm, "fp8_paged_mqa_logits"):
            raise pc.Environment("this deep_gemm has no fp8_paged_mqa_logits")
        if api == "fp8_fp4" and args.clean_logits:
            raise pc.Environment("--clean-logits needs the 2.1.x entry point fp8_paged_mqa_logits")
        version = getattr(deep_gemm, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as v
                version = next((v(d) for d in ("deep_gemm", "deepinfer_gemm", "deep-gemm") if _has_dist(d)), "unknown")
            except Exception:  # noqa: BLE001
                version = "unknown"
        free, total = torch.cuda.mem_get_info(dev) if dev.type == "cuda" else (8 << 30, 8 << 30)
        caps = pc.capabilities(
            formats=["e4m3fn"],
            layouts=["normal"],
            block_sizes={"list": [64]},
            next_n=[1, 2],
            heads=[32, 64],
            head_dims=[32, 64, 128],
            lens_1d=True,
            lens_2d=api == "fp8_fp4",
            scale_placement="after_relu_sum",
            accumulation={"kind": "reduced", "rel": args.rel},
            outside="neg_inf" if args.clean_logits else "any",
            max_kv_bytes=int(free * 0.6),
            kv_stride_align=16,  # its TMA descriptors (see library_call)
            hostile_values=True,
            nan_behaviour="fmaxf(NaN, 0) = 0 inside: NaN in q or k becomes 0",
        )
        entry = "fp8_fp4_paged_mqa_logits" if api == "fp8_fp4" else "fp8_paged_mqa_logits"
        note = " (1-D lengths expanded to 2-D)" if api == "fp8_fp4" else (" clean_logits=True" if args.clean_logits else "")
        hello = {"name": f"deepgemm:{entry}{note}", "library": "deep_gemm", "version": str(version),
                 "device": tc.device_name(dev), "capabilities": caps,
                 "compile_key": ["heads", "head_dim", "next_n", "batch_class"]}
        num_sms = deep_gemm.get_num_sms()

        def library_call(q, kv, w, lens, table, block_size, kv_block_stride, rows, max_model_len):
            """DeepGEMM on tensors already on the device: ``(logits, microseconds)``."""
            if w.stride(0) * 4 % 16:
                raise pc.Skipped("weights rows must be 16-byte aligned (H multiple of 4)")
            if kv_block_stride % 16:
                # DeepGEMM builds TMA descriptors over the cache and asserts
                # num_gmem_stride_1_bytes % 16 == 0 (a RuntimeError, not a fault): an input
                # it documents it cannot take, so a skip with the reason, not a finding.
                raise pc.Skipped("DeepGEMM's TMA descriptors need a 16-byte aligned KV block stride")
            # Poison the block DeepGEMM's torch.empty will receive.
            aligned = -(-max_model_len // 256) * 256
            pre = torch.full((rows * aligned,), float(tc.poison_f32()), dtype=torch.float32, device=dev)
            pre_ptr = pre.data_ptr()
            del pre

            def call():
                # The scheduler is timed with the kernel: DeepGEMM JIT-compiles it per
                # batch size rounded up to 32 (the compile key's batch_class), so a
                # class's first call shows as a compile, not as harness time.
                meta = deep_gemm.get_paged_mqa_logits_metadata(lens, block_size, num_sms)
                if api == "fp8_fp4":
                    return deep_gemm.fp8_fp4_paged_mqa_logits((q, None), kv, w, lens, table, meta, max_model_len)
                return deep_gemm.fp8_paged_mqa_logits(q, kv, w, lens, table, meta, max_model_len, args.clean_logits)
            logits, us = tc.timed(dev, call)
            if logits.data_ptr() != pre_ptr:
                print("note: DeepGEMM's output is not the pre-poisoned block: unwritten positions hold stale data",
                      file=sys.stderr, flush=True)
            return logits, us

        def launch(c):
            """Hosted (hosted.py): the case is on the device already, checked and judged
            there by mqa-fuzz; only DeepGEMM's call and the copy of its result are here."""
            lens = c.lens_per_token() if api == "fp8_fp4" else c.lens()
            logits, us = library_call(c.q(torch.float8_e4m3fn), c.kv_cache(), c.weights(), lens, c.table(),
                                      c.block_size, c.kv_block_stride, c.rows, c.max_model_len)
            c.out().copy_(logits[:, :c.max_model_len])
            return us

        def run(case):
            tc.reset_peak(dev)
            q, w, lens, table = tc.inputs(case, dev)
            if api == "fp8_fp4":
                lens = torch.from_numpy(tc.lens_2d(case)).to(dev)
            flat, kv = tc.kv_cache(case, dev)
            before = tc.checksum(q, w, lens, table, flat)
            logits, us = library_call(q, kv, w, lens, table, case.block_size, case.kv_block_stride,
                                      case.rows, case.max_model_len)
            after = tc.checksum(q, w, lens, table, flat)
            interior = case.interior()
            interior[:, :case.max_model_len] = logits.float().cpu().numpy()
            if before != after:
                tc.forget_cache()  # the kernel wrote into its inputs: poison all again
            return {"kernel_time_us": us, "inputs_intact": before == after, "device_bytes": tc.device_bytes(dev)}
        return hello, run, (dev, launch)

    pc.serve_forking(setup, args.fault, out)


def _has_dist(name):
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        distribution(name)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    main()
