"""The worker loop of the mqa-fuzz worker protocol (PROTOCOL.md), for Python adapters.

Needs numpy only. Protocol 2 (chosen when mqa-fuzz offers it in ``MQA_FUZZ_PROTOCOLS``)
maps mqa-fuzz's shared-memory region once and reads every tensor as a view of it; the
output is written in place. Protocol 1 reads safetensors files through numpy memmaps (a
multi-GiB output never needs a second copy) and writes the output with ``ndarray.tofile``.

An adapter provides a ``hello`` dict and a ``run(case) -> dict`` function and calls
:func:`serve`; or, better, a ``setup() -> (hello, run)`` function and calls
:func:`serve_forking`, which imports nothing twice: when mqa-fuzz asks for a fork server
the process forks a fresh worker per worker life, and ``setup`` (device initialisation)
runs in each child, so a restart after a device fault costs a fork, not an interpreter
start and a library import.

``run`` fills ``case.logits`` (the whole guarded 1-D buffer, see :meth:`Case.interior`)
and returns the optional result fields (``kernel_time_us``, ``inputs_intact``,
``device_bytes``). It reports failures by raising :class:`Crash`, :class:`Skipped` or
:class:`Environment`; any other exception is a crash with its traceback on stderr.
"""

import json
import os
import sys
import time
import traceback

import numpy as np

PROTOCOLS = (1, 2)
POISON_BITS = 0x7FC0FFEE
CHUNK_K = 256
# Messages after which a CUDA/HIP context is unusable.
DEVICE_FAULTS = ("illegal memory access", "CUDA error", "HIP error", "hipError", "unspecified launch failure",
                 "misaligned address", "device-side assert")

_DTYPES = {"U8": np.uint8, "I32": np.dtype("<i4"), "I64": np.dtype("<i8"), "F32": np.dtype("<f4")}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


class Crash(Exception):
    """The kernel failed on this case (a finding)."""


class Skipped(Exception):
    """The kernel cannot take this case (not a finding)."""


class Environment(Exception):
    """The machine cannot run the kernel (stops the campaign)."""


# ---- safetensors through numpy ------------------------------------------------------

def read_safetensors(path):
    """name -> read-only numpy array (memory-mapped)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        if end == begin:
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + n + begin, shape=shape)
    return out


def write_safetensors(path, tensors):
    """Writes name -> numpy array (U8, I32, I64 or F32), little-endian, in order."""
    header, offset, arrays = {}, 0, []
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = _NAMES[a.dtype.newbyteorder("<").str if a.dtype.byteorder == ">" else a.dtype.str]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays.append(a)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (len(text) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in arrays:
            a.tofile(f)


# ---- protocol 2: the shared region ---------------------------------------------------

# path -> mapping: mqa-fuzz rotates a few regions (one per case in flight), each
# mapped once and again only when it grew.
_REGIONS = {}
_REGIONS_KEPT = 16


def chosen_protocol():
    """The newest version both sides speak (1 when mqa-fuzz offers none: an old one)."""
    offered = os.environ.get("MQA_FUZZ_PROTOCOLS", "")
    both = [int(p) for p in offered.split(",") if p.strip().isdigit() and int(p) in PROTOCOLS]
    return max(both, default=1)


def shm_tensors(shm):
    """name -> numpy view of the request's shared region (each region mapped once;
    mapped again only when it grew past the mapping)."""
    path, need = shm["path"], int(shm["bytes"])
    m = _REGIONS.get(path)
    if m is None or m.size < need:
        _REGIONS.pop(path, None)
        if len(_REGIONS) >= _REGIONS_KEPT:
            _REGIONS.pop(next(iter(_REGIONS)))
        m = np.memmap(path, dtype=np.uint8, mode="r+", shape=(need,))
        _REGIONS[path] = m
    out = {}
    for name, info in shm["tensors"].items():
        dtype = np.dtype(_DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        begin = int(info["offset"])
        if begin < 0 or begin + n > need:
            raise Crash(f"tensor {name}: {n} bytes at offset {begin} lie past the {need}-byte region")
        out[name] = m[begin:begin + n].view(dtype).reshape(shape)
    return out


# ---- fp8 ------------------------------------------------------------------------------

def fp8_table(fmt):
    """The 256-entry float32 decode table of e4m3fn or e4m3fnuz (NaN codes decode to NaN)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 7
    bias = 7 if fmt == "e4m3fn" else 8
    val = np.where(exp == 0, man / 8.0 * 2.0 ** (1 - bias), (1 + man / 8.0) * 2.0 ** (exp - bias))
    val = sign * val
    if fmt == "e4m3fn":
        val[(codes & 0x7F) == 0x7F] = np.nan
    else:
        val[0x80] = np.nan
    return val.astype(np.float32)


# ---- the case -------------------------------------------------------------------------

class Case:
    """A request and its tensors. ``kv_ids``/``kv_blocks`` are the sparse cache."""

    def __init__(self, req):
        self.req = req
        for k in ("id", "batch", "next_n", "heads", "head_dim", "block_size", "layout", "format",
                  "num_blocks", "kv_block_stride", "kv_cache_bytes", "max_model_len", "out_row_stride",
                  "rows", "max_blocks", "block_table_stride", "guard_elems"):
            setattr(self, k, req[k])
        if "shm" in req:
            t = shm_tensors(req["shm"])
        else:
            t = read_safetensors(req["case"])
        self.q = np.asarray(t["q"])
        self.weights = np.asarray(t["weights"])
        self.context_lens = np.asarray(t["context_lens"])
        self.block_table = np.asarray(t["block_table"])
        self.kv_ids = np.asarray(t["kv_block_ids"])
        self.kv_blocks = np.asarray(t["kv_blocks"])
        if "shm" in req:
            self.logits = t["logits"]  # the region itself: written in place
        else:
            self.logits = np.array(t["logits"])  # writable copy, guards included
        self.shm_logits = t["logits"] if "shm" in req else None
        self.lens_2d = self.context_lens.ndim == 2
        self.block_bytes = self.block_size * (self.head_dim + 4)
        # Every element of logits holds the poison (mqa-fuzz says so in the request).
        self.logits_poisoned = bool(req.get("logits_poisoned", False))
        # Seconds per phase of the call, reported as ``phases_us`` (see :meth:`phase`).
        self.phases = {}

    def phase(self, name):
        """``with case.phase("upload"): ...`` adds the block's wall time to ``name`` in
        the result's ``phases_us`` (where the call's time went, in the report)."""
        return _Phase(self.phases, name)

    def interior(self):
        """``[rows, out_row_stride]`` view of the output inside the guards."""
        g = self.guard_elems
        return self.logits[g:g + self.rows * self.out_row_stride].reshape(self.rows, self.out_row_stride)

    def valid_len(self, r):
        n = self.next_n
        b, i = divmod(r, n)
        if self.lens_2d:
            return max(0, int(self.context_lens[b, i]))
        return max(0, int(self.context_lens[b]) - n + i + 1)

    def seq_tokens(self, b):
        if self.lens_2d:
            return max(0, int(self.context_lens[b].max()))
        return max(0, int(self.context_lens[b]))

    def value_offsets(self):
        """``[block_size, head_dim]`` byte offsets of each value inside a block."""
        bs, d = self.block_size, self.head_dim
        p = np.arange(bs)[:, None]
        dd = np.arange(d)[None, :]
        if self.layout == "shuffle16":
            return (p // 16) * 16 * d + (dd // 16) * 256 + (p % 16) * 16 + dd % 16
        return p * d + dd

    def slot_poison(self):
        """Poison bytes of one ``kv_block_stride`` slot (``kernel::cpu::poison_byte``)."""
        values = self.block_size * self.head_dim
        slot = np.full(self.kv_block_stride, 0x7F if self.format == "e4m3fn" else 0x80, np.uint8)
        scales = np.tile(np.array([0x00, 0x00, 0xC0, 0x7F], np.uint8), self.block_size)
        slot[values:values + 4 * self.block_size] = scales
        return slot

    def full_cache(self):
        """The whole poisoned device cache as one flat uint8 array (only for caches that fit)."""
        cache = np.tile(self.slot_poison(), self.num_blocks)
        s = self.kv_block_stride
        for k, bid in enumerate(self.kv_ids):
            cache[int(bid) * s:int(bid) * s + self.block_bytes] = self.kv_blocks[k]
        return cache


class _Phase:
    def __init__(self, phases, name):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0
        return False


class SparseDeviceView:
    """The poisoned device cache without allocating it (``kernel::cpu::DeviceView``):
    a read at any byte address returns stored block bytes or poison; outside the
    allocation it raises :class:`Crash` (an illegal address).

    Vectorised: :meth:`gather` reads the bytes at an array of addresses (slot =
    address // stride, offset = address % stride; a stored slot's bytes, else the slot's
    poison byte), :meth:`stored` reads inside blocks known to be stored at their true
    address, by their index in ``kv_blocks``, without address arithmetic."""

    def __init__(self, case):
        self.case = case
        self.len = case.num_blocks * case.kv_block_stride
        self.stride = case.kv_block_stride
        self.block_bytes = case.block_bytes
        self.poison = case.slot_poison()
        self.flat = np.asarray(case.kv_blocks).reshape(-1)
        # id -> index into kv_blocks through the sorted ids (the last of repeated ids
        # wins, as a dict built in order would have it).
        ids = np.asarray(case.kv_ids, np.int64).reshape(-1)
        rev = ids[::-1]
        self.ids, first = np.unique(rev, return_index=True)
        self.kidx = (len(ids) - 1 - first).astype(np.int64)

    def index_of(self, slots):
        """Index into ``kv_blocks`` of each slot id of ``slots``, -1 where not stored."""
        slots = np.asarray(slots, np.int64)
        if self.ids.size == 0:
            return np.full(slots.shape, -1, np.int64)
        pos = np.minimum(np.searchsorted(self.ids, slots), self.ids.size - 1)
        return np.where(self.ids[pos] == slots, self.kidx[pos], -1)

    def stored(self, k, within):
        """Bytes at offsets ``within`` of the stored blocks ``k`` (broadcast; each
        offset below ``block_bytes``)."""
        return self.flat[k * self.block_bytes + within]

    def gather(self, addr, what="read"):
        """The bytes at byte addresses ``addr`` (any shape)."""
        addr = np.asarray(addr, np.int64)
        if addr.size and (addr.min() < 0 or addr.max() >= self.len):
            bad = int(addr.reshape(-1)[np.argmax(((addr < 0) | (addr >= self.len)).reshape(-1))])
            raise Crash(f"illegal address: {what} at byte offset {bad} of a {self.len}-byte cache")
        slot, within = np.divmod(addr, self.stride)
        k = self.index_of(slot)
        hit = (k >= 0) & (within < self.block_bytes)
        out = self.poison[within]
        out[hit] = self.flat[k[hit] * self.block_bytes + within[hit]]
        return out

    def read(self, addr, n, what="read"):
        if addr < 0 or addr + n > self.len:
            raise Crash(f"illegal address: {what} of {n} bytes at byte offset {addr} of a {self.len}-byte cache")
        return self.gather(addr + np.arange(n, dtype=np.int64))


# ---- the loop -------------------------------------------------------------------------

def capabilities(**over):
    """Capabilities of a kernel that accepts everything the case model expresses."""
    caps = {
        "formats": ["e4m3fn", "e4m3fnuz"],
        "layouts": ["normal", "shuffle16"],
        "block_sizes": "any",
        "next_n": [1, 8],
        "heads": None,
        "head_dims": None,
        "lens_1d": True,
        "lens_2d": True,
        "scale_placement": "after_relu_sum",
        "accumulation": {"kind": "f32"},
        "outside": "any",
        "max_kv_bytes": None,
        "hostile_values": True,
        "nan_behaviour": "propagates NaN",
    }
    caps.update(over)
    return caps


class Faults:
    """Misbehaviour on purpose (``--fault``), counted in requests served by this process:
    ``crash-at=N`` (abort), ``kill-at=N`` (SIGKILL mid-case, as the kernel of the OOM
    killer would), ``hang-at=N``, ``garbage-at=N``, ``crash-if-ctx-over=T``
    (abort on any case with a context length above T: deterministic, so shrinkable),
    ``skew`` (announce protocol 2)."""

    def __init__(self, spec):
        self.kind, self.n = None, None
        if spec:
            if spec == "skew":
                self.kind = "skew"
            else:
                kind, _, n = spec.partition("=")
                if kind not in ("crash-at", "kill-at", "hang-at", "garbage-at", "crash-if-ctx-over") or not n.isdigit():
                    raise SystemExit(f"--fault {spec!r}: expected crash-at=N, kill-at=N, hang-at=N, garbage-at=N, crash-if-ctx-over=T or skew")
                self.kind, self.n = kind, int(n)

    def before(self, served, req, proto_out):
        if self.kind == "crash-at" and served == self.n or (
                self.kind == "crash-if-ctx-over" and _max_len(req["context_lens"]) > self.n):
            print(f"fault injection: aborting on request {served} (id {req['id']})", file=sys.stderr, flush=True)
            os.abort()
        if self.kind == "kill-at" and served == self.n:
            print(f"fault injection: SIGKILL on request {served} (id {req['id']})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), 9)
        if self.kind == "hang-at" and served == self.n:
            print(f"fault injection: hanging on request {served}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        if self.kind == "garbage-at" and served == self.n:
            print(f"fault injection: garbage on request {served}", file=sys.stderr, flush=True)
            proto_out.write("Traceback (most recent call last): not a protocol line\n")
            proto_out.flush()
            return True
        return False


def _max_len(lens):
    flat = [x for row in lens for x in row] if lens and isinstance(lens[0], list) else list(lens)
    return max(flat, default=0)


def add_common_args(parser):
    parser.add_argument("--fault", help="misbehave on purpose (tests): crash-at=N, kill-at=N, hang-at=N, garbage-at=N, crash-if-ctx-over=T, skew")


def protocol_stdout():
    """The protocol stream; ``sys.stdout`` is pointed at stderr so stray prints from
    libraries cannot corrupt it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def send(out, msg):
    out.write(json.dumps(msg, allow_nan=False) + "\n")
    out.flush()


def refuse(kind, message, out=None):
    """Sends the start-up error line (library missing, no device) and exits 3."""
    out = out or protocol_stdout()
    send(out, {"type": "error", "id": None, "kind": kind, "message": message})
    sys.exit(3)


def serve(hello, run, fault_spec=None, out=None, inp=None):
    """Sends ``hello`` (name, library, version, device, capabilities), then answers
    requests until stdin closes."""
    out = out or protocol_stdout()
    inp = inp or sys.stdin
    faults = Faults(fault_spec)
    version = chosen_protocol()
    msg = {"type": "hello", "protocol": 3 if faults.kind == "skew" else version}
    msg.update(hello)
    send(out, msg)
    served = 0
    for line in inp:
        if not line.strip():
            continue
        served += 1
        try:
            req = json.loads(line)
        except ValueError as e:
            send(out, {"type": "error", "id": None, "kind": "crash", "message": f"bad request: {e}"})
            continue
        if faults.before(served, req, out):
            continue
        rid = req.get("id")
        try:
            t0 = time.perf_counter()
            case = Case(req)
            t1 = time.perf_counter()
            info = run(case) or {}
            t2 = time.perf_counter()
            res = {"type": "result", "id": rid}
            if case.shm_logits is not None:
                if case.logits is not case.shm_logits:
                    case.shm_logits[...] = case.logits  # an adapter that replaced the array
            else:
                write_safetensors(req["output"], {"logits": case.logits})
                res["output"] = req["output"]
            res.update({k: v for k, v in info.items() if k in ("kernel_time_us", "inputs_intact", "device_bytes")})
            phases = dict(case.phases)
            phases["worker: read case"] = t1 - t0
            phases["worker: run (rest)"] = max(0.0, t2 - t1 - sum(case.phases.values()))
            phases["worker: write output"] = time.perf_counter() - t2
            res["phases_us"] = {k: v * 1e6 for k, v in phases.items()}
            send(out, res)
        except Crash as e:
            send(out, {"type": "error", "id": rid, "kind": "crash", "message": str(e)})
        except Skipped as e:
            send(out, {"type": "error", "id": rid, "kind": "skipped", "message": str(e)})
        except Environment as e:
            send(out, {"type": "error", "id": rid, "kind": "environment", "message": str(e)})
        except MemoryError as e:
            send(out, {"type": "error", "id": rid, "kind": "skipped", "message": f"out of host memory: {e}"})
        except Exception as e:  # noqa: BLE001 - any library failure is this case's crash
            if type(e).__name__ == "OutOfMemoryError":
                # A device allocation that failed (torch.cuda.OutOfMemoryError) is the
                # machine's limit, not a finding.
                send(out, {"type": "error", "id": rid, "kind": "skipped",
                           "message": f"out of device memory: {str(e)[:300]}"})
                continue
            traceback.print_exc(file=sys.stderr)
            send(out, {"type": "error", "id": rid, "kind": "crash", "message": f"{type(e).__name__}: {e}"})
            if any(m in str(e) for m in DEVICE_FAULTS):
                # The device context is gone after a fault: let mqa-fuzz start a fresh worker.
                print("device fault: exiting so the next case gets a fresh context", file=sys.stderr, flush=True)
                sys.exit(1)


# ---- the fork server (PROTOCOL.md section 4) -----------------------------------------

def serve_forking(setup, fault_spec=None, out=None):
    """Serves as a fork server when mqa-fuzz offers it (``MQA_FUZZ_FORK_SERVER=1``),
    otherwise as a plain worker. ``setup() -> (hello, run)`` runs in each worker life,
    after the fork: initialise the device there, never before (a CUDA/HIP context does
    not survive a fork). Whatever the adapter imported before calling this is shared by
    every life."""
    proto = out or protocol_stdout()
    if os.environ.get("MQA_FUZZ_FORK_SERVER") != "1":
        served = _setup_or_refuse(setup, proto)
        code = _serve_set_up(served, fault_spec, proto, sys.stdin)
        if code:
            sys.stderr.flush()
            os._exit(code)  # a device fault: no teardown of a lost context
        return None
    import select
    send(proto, {"type": "fork_server", "protocol": chosen_protocol(), "pid": os.getpid()})
    lives, pending = {}, b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.01)  # a life's exit reported within ~10 ms
        _reap(lives, proto)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break  # mqa-fuzz closed our stdin: stop every life and exit
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError as e:
                send(proto, {"type": "error", "life": None, "message": f"bad fork request: {e}"})
                continue
            if msg.get("type") != "fork":
                send(proto, {"type": "error", "life": msg.get("life"), "message": f"unknown request {msg.get('type')!r}"})
                continue
            pid = os.fork()
            if pid == 0:
                _life(msg, proto, setup, fault_spec)  # never returns
            lives[pid] = msg["life"]
            send(proto, {"type": "forked", "life": msg["life"], "pid": pid})
    for pid in list(lives):
        try:
            os.killpg(pid, 9)
        except OSError:
            pass
    sys.exit(0)


def _reap(lives, proto):
    """Reports every life that ended."""
    while lives:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        life = lives.pop(pid, None)
        if life is None:
            continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            names = {6: " (SIGABRT)", 9: " (SIGKILL)", 11: " (SIGSEGV)", 7: " (SIGBUS)"}
            text = f"killed by signal {sig}{names.get(sig, '')}"
        else:
            text = f"exit status {os.WEXITSTATUS(status)}"
        send(proto, {"type": "exited", "life": life, "pid": pid, "status": text})


def _life(msg, server_proto, setup, fault_spec):
    """A forked worker life: its own process group and pipes, then the protocol."""
    code = 1
    try:
        os.setpgid(0, 0)
        server_proto.close()  # the server's protocol stream is not ours
        fd_in = os.open(msg["stdin"], os.O_RDONLY)
        fd_out = os.open(msg["stdout"], os.O_WRONLY)
        os.dup2(fd_in, 0)
        os.close(fd_in)
        out = os.fdopen(fd_out, "w", buffering=1)
        inp = os.fdopen(0, "r", closefd=False)
        served = _setup_or_refuse(setup, out)
        code = _serve_set_up(served, fault_spec, out, inp)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a life never returns into the server loop
        traceback.print_exc(file=sys.stderr)
    finally:
        sys.stderr.flush()
        os._exit(code)


def _serve_set_up(served, fault_spec, out, inp):
    """Serves what ``setup`` returned: ``(hello, run)``, or ``(hello, run, (device,
    launch))`` from an adapter that can also be served hosted (``hosted.py``): mqa-fuzz's
    own worker loop then lays cases out and judges on the device, and ``launch`` only
    runs the kernel. Returns the exit status."""
    hello, run = served[0], served[1]
    if len(served) > 2 and served[2] is not None:
        import hosted
        dev, launch = served[2]
        try:
            lib, why = hosted.wanted(dev, fault_spec)
        except Environment as e:
            refuse("environment", str(e), out)
        if lib is not None:
            out.flush()
            return hosted.serve(lib, hello, launch, inp.fileno(), out.fileno(), fault_spec)
        print(f"note: {hello.get('name')}: served over the plain protocol, not hosted: {why}",
              file=sys.stderr, flush=True)
    serve(hello, run, fault_spec, out=out, inp=inp)
    return 0


def _setup_or_refuse(setup, out=None):
    try:
        return setup()
    except Environment as e:
        refuse("environment", str(e), out)
