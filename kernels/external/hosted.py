"""Device-hosted serving: mqa-fuzz's own worker loop, loaded into this process.

An adapter whose library runs on a CUDA device can hand the whole worker protocol to
``libmqa_fuzz.so`` (built beside the ``mqa-fuzz`` binary): it then lays each case out
on the device itself (keys drawn there, the cache and the output poisoned once and kept
between cases, inputs checked, the output judged on the device), and calls back into
this process only to launch the library's kernel, with the case's device pointers
wrapped as torch tensors (no copy: one process, one primary context, the default
stream). The harness sees an ordinary worker that draws values and judges on its
device (PROTOCOL.md, "Hosted workers").

``MQA_FUZZ_HOSTED``: ``auto`` (default: hosted when the library loads and the device is
a CUDA GPU, else the plain protocol, with the reason on stderr), ``on`` (hosted or an
environment error), ``off``. ``MQA_FUZZ_HOSTED_LIB``: the library's path (mqa-fuzz sets
it for its workers when ``libmqa_fuzz.so`` lies beside its binary). ``MQA_FUZZ_WARM_UP=off``:
a life does not make the launch's torch operations once before its hello (:func:`warm_up`).
"""

import ctypes
import json
import os
import sys
import traceback

import protocol_common as pc

# Must equal mqa_fuzz_hosted_abi() of the library: the layout below.
ABI = 1

OK, SKIPPED, ENVIRONMENT, RAISED = 0, 1, 2, 3


class Params(ctypes.Structure):
    """``struct Params`` of kernels/common.cuh (src/kernel/cuda/memory.rs)."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "weights", "kv", "table", "lens", "out", "decode", "kv_bytes", "kv_stride")] + [
        ("out_stride", ctypes.c_int64)] + [(n, ctypes.c_int32) for n in (
            "batch", "next_n", "heads", "head_dim", "block_size", "layout", "lens_2d", "fnuz",
            "max_blocks", "table_stride", "max_model_len", "num_workers")]


class HostedCall(ctypes.Structure):
    """``HostedCall`` of src/kernel/cuda/hosted.rs."""
    _fields_ = [("params", Params), ("num_blocks", ctypes.c_uint64), ("rows", ctypes.c_uint64),
                ("kernel_us", ctypes.c_double), ("message", ctypes.c_char * 2048)]


LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(HostedCall))


def mode():
    m = os.environ.get("MQA_FUZZ_HOSTED", "auto").strip().lower() or "auto"
    if m not in ("auto", "on", "off"):
        raise pc.Environment(f"MQA_FUZZ_HOSTED={m!r}: use auto, on or off")
    return m


def library():
    """``(lib, None)`` or ``(None, why not)``."""
    if mode() == "off":
        return None, "MQA_FUZZ_HOSTED=off"
    path = os.environ.get("MQA_FUZZ_HOSTED_LIB")
    if not path:
        return None, "MQA_FUZZ_HOSTED_LIB is not set (libmqa_fuzz.so was not found beside mqa-fuzz)"
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return None, f"cannot load {path}: {e}"
    try:
        lib.mqa_fuzz_hosted_abi.restype = ctypes.c_uint32
        abi = lib.mqa_fuzz_hosted_abi()
    except AttributeError:
        return None, f"{path} has no mqa_fuzz_hosted_abi (not an mqa-fuzz library)"
    if abi != ABI:
        return None, f"{path} speaks hosted ABI {abi}, this adapter {ABI}: use the adapters of the same mqa-fuzz"
    lib.mqa_fuzz_hosted_serve.restype = ctypes.c_int
    lib.mqa_fuzz_hosted_serve.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, LAUNCH]
    return lib, None


class _Span:
    """Device memory as ``__cuda_array_interface__`` (what ``torch.as_tensor`` wraps)."""

    def __init__(self, ptr, shape, strides, typestr):
        self.__cuda_array_interface__ = {"data": (int(ptr), False), "shape": tuple(shape),
                                         "strides": tuple(strides), "typestr": typestr, "version": 2}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManaged))
_DLManaged._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_KEEP = []  # DLPack structs of recent calls: torch may drop its tensors after the call
_NO_DELETE = _DELETER(lambda _: None)
_DL_CODES = {"u": 1, "i": 0, "f": 2}


def _dlpack(torch, ptr, shape, strides, typestr):
    """The same span through a DLPack capsule (no pointer query: for memory that
    ``__cuda_array_interface__`` wrapping refuses)."""
    n, item = len(shape), int(typestr[2:])
    sh, st = (ctypes.c_int64 * max(n, 1))(*shape), (ctypes.c_int64 * max(n, 1))(*(s // item for s in strides))
    m = _DLManaged()
    m.dl_tensor = _DLTensor(ctypes.c_void_p(int(ptr)), _DLDevice(2, torch.cuda.current_device()), n,
                            _DLDataType(_DL_CODES[typestr[1]], 8 * item, 1), sh, st, 0)
    m.deleter = _NO_DELETE
    _KEEP.append((m, sh, st))
    del _KEEP[:-64]
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return torch.utils.dlpack.from_dlpack(new(ctypes.addressof(m), b"dltensor", None))


_WRAP = {"cai": True}


class Call:
    """One launch: the case mqa-fuzz laid out on the device, as torch tensors over its
    memory. Write the kernel's result into :meth:`out`."""

    def __init__(self, raw, torch):
        self.raw, self.torch = raw, torch
        p = raw.params
        self.p = p
        self.batch, self.next_n, self.heads, self.head_dim = p.batch, p.next_n, p.heads, p.head_dim
        self.block_size, self.kv_block_stride, self.max_model_len = p.block_size, p.kv_stride, p.max_model_len
        self.rows, self.num_blocks, self.max_blocks = raw.rows, raw.num_blocks, p.max_blocks
        self.lens_2d = bool(p.lens_2d)
        self.format = "e4m3fnuz" if p.fnuz else "e4m3fn"
        self.layout = "shuffle16" if p.layout else "normal"

    def _t(self, ptr, shape, strides, typestr):
        if _WRAP["cai"]:
            try:
                return self.torch.as_tensor(_Span(ptr, shape, strides, typestr), device="cuda")
            except Exception as e:  # noqa: BLE001
                _WRAP["cai"] = False
                print(f"note: __cuda_array_interface__ refused mqa-fuzz's device memory ({e}); using DLPack",
                      file=sys.stderr, flush=True)
        return _dlpack(self.torch, ptr, shape, strides, typestr)

    def q(self, dtype):
        """[B, N, H, D] fp8 codes as ``dtype``."""
        b, n, h, d = self.batch, self.next_n, self.heads, self.head_dim
        return self._t(self.p.q, (b, n, h, d), (n * h * d, h * d, d, 1), "|u1").view(dtype)

    def weights(self):
        """[B*N, H] float32."""
        return self._t(self.p.weights, (self.rows, self.heads), (self.heads * 4, 4), "<f4")

    def lens(self):
        """int32 lengths as given: [B] or [B, N]."""
        if self.lens_2d:
            return self._t(self.p.lens, (self.batch, self.next_n), (self.next_n * 4, 4), "<i4")
        return self._t(self.p.lens, (self.batch,), (4,), "<i4")

    def lens_per_token(self):
        """[B, N] int32: 1-D lengths expanded as an engine passes them (row i of a
        sequence sees ctx - N + i + 1, at least 0); 2-D lengths as given."""
        torch = self.torch
        lens = self.lens()
        if self.lens_2d:
            return lens
        n = self.next_n
        step = torch.arange(n, device=lens.device, dtype=torch.int64)[None, :]
        return torch.clamp(lens.to(torch.int64)[:, None] - n + step + 1, min=0).to(torch.int32).contiguous()

    def table(self):
        """[B, max_blocks] int32 view with the case's row stride."""
        return self._t(self.p.table, (self.batch, self.max_blocks), (self.p.table_stride * 4, 4), "<i4")

    def kv_cache(self):
        """The cache as the libraries take it: [num_blocks, bs, 1, D+4] uint8 with
        ``stride(0) = kv_block_stride`` (each block: bs*D codes, then bs f32 scales)."""
        d4 = self.head_dim + 4
        return self._t(self.p.kv, (self.num_blocks, self.block_size, 1, d4), (self.kv_block_stride, d4, d4, 1), "|u1")

    def out(self):
        """[rows, max_model_len] float32 view of the poisoned output (its row stride is
        the case's; the guards around it are checked)."""
        return self._t(self.p.out, (self.rows, self.max_model_len), (self.p.out_stride * 4, 4), "<f4")


def warm_up_wanted():
    """``MQA_FUZZ_WARM_UP``: on unless ``off``/``0`` (mqa-fuzz refuses other values)."""
    return os.environ.get("MQA_FUZZ_WARM_UP", "").strip().lower() not in ("off", "0")


def warm_up(torch, device="cuda", make_call=None):
    """Makes, once, the torch operations a hosted launch makes on mqa-fuzz's memory —
    device pointers wrapped as tensors, the per-token lengths a 1-D case expands to, a
    float32 fill, a strided float32 copy into the output, timing events — on a few bytes
    of torch's own memory, so that a worker life's first case does not pay their first
    use (torch loads each CUDA kernel's code when first launched: 50-150 ms in all for a
    DeepGEMM launch on an H200). The library itself is not called: a warm-up must not
    be able to fault. Returns the seconds it took."""
    import time
    t0 = time.perf_counter()
    dev = torch.device(device)
    b, n, h, d, bs, mml = 1, 2, 8, 16, 64, 64
    sizes = {"q": b * n * h * d, "weights": b * n * h * 4, "kv": bs * (d + 4), "table": 4, "lens": 4,
             "out": b * n * mml * 4}
    mem = {k: torch.zeros(v, dtype=torch.uint8, device=dev) for k, v in sizes.items()}
    mem["lens"].view(torch.int32).fill_(mml)
    raw = HostedCall()
    p = raw.params
    for k, t in mem.items():
        setattr(p, k, t.data_ptr())
    p.kv_bytes, p.kv_stride, p.out_stride = sizes["kv"], sizes["kv"], mml
    p.batch, p.next_n, p.heads, p.head_dim, p.block_size = b, n, h, d, bs
    p.max_blocks, p.table_stride, p.max_model_len, p.lens_2d = 1, 1, mml, 0
    raw.num_blocks, raw.rows = 1, b * n
    c = (make_call or Call)(raw, torch)
    c.q(torch.float8_e4m3fn), c.weights(), c.kv_cache(), c.table()
    per_token = c.lens_per_token()
    filled = torch.full((c.rows, 256), 0.5, dtype=torch.float32, device=dev)
    if dev.type == "cuda":
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        c.out().copy_(filled[:, :c.max_model_len])
        e.record()
        torch.cuda.synchronize()
        a.elapsed_time(e)
    else:
        c.out().copy_(filled[:, :c.max_model_len])
    expected = [[mml - n + i + 1 for i in range(n)]] * b
    if per_token.tolist() != expected or float(c.out().sum()) != 0.5 * c.rows * mml:
        raise RuntimeError(f"the warm-up's own results are wrong: lengths {per_token.tolist()}, expected {expected}")
    return time.perf_counter() - t0


def serve(lib, hello, launch, in_fd, out_fd, fault_spec=None):
    """Serves until the requests end; returns the worker's exit status.
    ``launch(call: Call) -> kernel microseconds (or None)``; raising :class:`pc.Skipped`
    declines the case, :class:`pc.Environment` says the library cannot run, anything else
    is this case's crash."""
    import torch

    def callback(raw_ptr):
        raw = raw_ptr.contents
        try:
            us = launch(Call(raw, torch))
            raw.kernel_us = -1.0 if us is None else float(us)
            return OK
        except pc.Skipped as e:
            code, msg = SKIPPED, str(e)
        except pc.Environment as e:
            code, msg = ENVIRONMENT, str(e)
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into the library
            if type(e).__name__ == "OutOfMemoryError":
                code, msg = SKIPPED, f"out of device memory: {str(e)[:300]}"
            else:
                traceback.print_exc(file=sys.stderr)
                code, msg = RAISED, f"{type(e).__name__}: {e}"
        raw.message = msg.encode("utf-8", "replace")[:2047]
        return code

    cb = LAUNCH(callback)  # kept alive for the whole call below
    hello = dict(hello)
    if warm_up_wanted():
        try:
            hello["warm_up_secs"] = warm_up(torch)
        except Exception as e:  # noqa: BLE001 - a warm-up that fails costs only speed
            print(f"note: warm-up skipped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    text = json.dumps(hello, allow_nan=False).encode()
    fault = fault_spec.encode() if fault_spec else None
    return lib.mqa_fuzz_hosted_serve(in_fd, out_fd, text, fault, cb)


def wanted(dev, fault_spec):
    """``(lib, None)`` when this life should serve hosted, else ``(None, why not)``;
    ``MQA_FUZZ_HOSTED=on`` turns a why-not into an environment error."""
    lib, why = library()
    if lib is not None and dev.type != "cuda":
        lib, why = None, f"the device is {dev.type}, not a CUDA GPU"
    if lib is not None and fault_spec and fault_spec.split("=")[0] not in ("crash-at", "hang-at", "garbage-at", "skew"):
        lib, why = None, f"--fault {fault_spec} is a plain-protocol fault"
    if lib is None and mode() == "on":
        raise pc.Environment(f"MQA_FUZZ_HOSTED=on but the hosted path is unusable: {why}")
    return lib, why
