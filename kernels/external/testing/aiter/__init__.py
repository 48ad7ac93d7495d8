"""A fake ``aiter`` with the API of ``aiter.ops.triton.pa_mqa_logits`` (see that module)."""
__version__ = "0.0.0+fake"
