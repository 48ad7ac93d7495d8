"""A fake vllm (see v1/attention/ops/rocm_aiter_mla_sparse.py)."""
__version__ = "0.0.0+fake"
