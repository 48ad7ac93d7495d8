"""Where DeepGEMM's time goes call by call, in one process (scripts/gpu-check.sh speed
runs it before timing campaigns, so their JIT is warm).

DeepGEMM 2.8.2 JIT-compiles its paged MQA logits kernel per (next_n, heads, head_dim,
block size, ...) and `get_paged_mqa_logits_metadata`'s scheduler kernel per batch size
rounded up to 32, with nvcc, into its disk cache. For batch sizes 1, 33, ..., 481 (H 64,
D 128, next_n 2, block 64, random fp8 data) this prints the first and a second call of
each, the output poison and copy an adapter does, in ms. Run it twice: the second process
shows what a fresh worker pays with the disk cache warm.

    PYTHONPATH=<deep_gemm site> python3 scripts/gpu/deepgemm_jit.py [label]
"""
import sys
import time

import deep_gemm
import torch

DEV = torch.device("cuda")
H, D, BS, N = 64, 128, 64, 2


def sync():
    torch.cuda.synchronize()
    return time.perf_counter()


def case(b, ctx_lo=4000, ctx_hi=16000, max_model_len=131072):
    ctx = torch.randint(ctx_lo, ctx_hi, (b,), dtype=torch.int32)
    per_seq = int((ctx.max() + BS - 1) // BS)
    blocks = b * per_seq + 8
    kv = torch.randint(0, 100, (blocks, BS, 1, D + 4), dtype=torch.uint8, device=DEV)
    kv.view(blocks, BS * (D + 4))[:, BS * D:].view(torch.float32).fill_(0.01)
    table = torch.randperm(blocks - 8, dtype=torch.int32, device=DEV)[: b * per_seq].view(b, per_seq)
    lens = torch.stack([torch.clamp(ctx - N + i + 1, min=0) for i in range(N)], 1).to(DEV).contiguous()
    q = torch.randint(0, 100, (b, N, H, D), dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    w = torch.rand(b * N, H, device=DEV)
    return q, kv, w, lens, table, max_model_len


def main():
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    num_sms = deep_gemm.get_num_sms()
    torch.manual_seed(0)
    start = time.perf_counter()
    for b in [1, 33, 65, 97, 129, 161, 193, 225, 257, 289, 321, 353, 385, 417, 449, 481, 40, 100, 200]:
        q, kv, w, lens, table, mml = case(b)
        rows = b * N
        t0 = sync()
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BS, num_sms)
        t1 = sync()
        meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BS, num_sms)
        t2 = sync()
        aligned = -(-mml // 256) * 256
        pre = torch.full((rows * aligned,), float("nan"), dtype=torch.float32, device=DEV)
        del pre
        t3 = sync()
        logits = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), kv, w, lens, table, meta, mml)
        t4 = sync()
        logits = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), kv, w, lens, table, meta, mml)
        t5 = sync()
        out = torch.empty(rows, mml, device=DEV)
        t6 = sync()
        out.copy_(logits[:, :mml])
        t7 = sync()

        def ms(a, c):
            return f"{(c - a) * 1e3:8.2f}"

        print(f"[{label}] B={b:4d} meta first {ms(t0, t1)} again {ms(t1, t2)} | poison {ms(t2, t3)} | "
              f"main first {ms(t3, t4)} again {ms(t4, t5)} | out alloc {ms(t5, t6)} copy {ms(t6, t7)} ms", flush=True)
    print(f"[{label}] total {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
