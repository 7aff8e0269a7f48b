"""The gate's worker: `python -m tilesmith.gate.worker RESULT_FD`. Runs wrapper code, never decides.

Requests arrive as JSON lines on stdin; each reply is one JSON line on the private pipe RESULT_FD.
Bulk results (outputs, inputs after the call) go to torch.save files the deciding process reads with
weights_only=True. Timing replies carry raw nanosecond totals only. The clock and the device
synchronisation are bound here, at import, before any wrapper code can run.
"""

from __future__ import annotations

import json
import os
import sys
import time

_perf_ns = time.perf_counter_ns  # bound before candidate code exists in this process
_T0_NS = _perf_ns()
_STARTUP_S = 0.0  # seconds from this module's first line to the first request it can take

import torch  # noqa: E402

from tilesmith.capture.tensors import span_numel  # noqa: E402

_CUDA = torch.cuda.is_available()
_device_sync = torch._C._cuda_synchronize if _CUDA else (lambda: None)


class State:
    def __init__(self):
        self.data = None  # loading.GraphData
        self.fns = {}  # role -> call
        # role -> a thunk loading the role's module again, a fresh instance for timing. The candidate only:
        # the baseline is never loaded after candidate code has run here, and its correctness calls ran
        # in the reference worker, so its instance here is fresh.
        self.loaders = {}
        self.device = "cpu"
        self.timed = {}  # role -> list of (call thunk) over rotating buffers
        self.keep = []  # CUDA graphs, their inputs and their outputs stay alive while timing


def _to_device(x, device):
    if not isinstance(x, torch.Tensor):
        return x
    n = span_numel(x)
    if n == 0:
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=device)
    flat = x.as_strided((n,), (1,), x.storage_offset()).to(device, copy=True)
    return flat.as_strided(x.size(), x.stride(), 0)


def _to_cpu(x):
    return _to_device(x.detach(), "cpu") if isinstance(x, torch.Tensor) else x


def _refill(dst, src):
    """Copy src's storage span into dst's in place (same layout): new values in the same buffers."""
    if isinstance(dst, torch.Tensor) and span_numel(dst):
        n = span_numel(dst)
        dst.as_strided((n,), (1,), dst.storage_offset()).copy_(src.as_strided((n,), (1,), src.storage_offset()))


def _layout(o, args) -> dict:
    if not isinstance(o, torch.Tensor):
        return {"type": type(o).__name__}
    ptr = o.untyped_storage().data_ptr() if o.numel() else None
    alias = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and ptr is not None
             and a.untyped_storage().data_ptr() == ptr]
    return {"type": "Tensor" if type(o) is torch.Tensor else type(o).__name__, "shape": list(o.shape),
            "stride": list(o.stride()), "offset": int(o.storage_offset()), "dtype": str(o.dtype).removeprefix("torch."),
            "device": o.device.type, "alias_inputs": alias, "storage": ptr}


def _call(st: State, role: str, args: list, on_side_stream: bool):
    """One call on fresh-list args; on CUDA under a non-default current stream that alone is synchronised."""
    from tilesmith import loading

    loading.restore_rng(st.data.rng)
    with torch.no_grad():
        if on_side_stream and _CUDA:
            _device_sync()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                out = st.fns[role](list(args))
                left_on = torch.cuda.current_stream()
            if left_on != s:  # read on a stream the call chose, the outputs would wait for its work
                raise RuntimeError("the call switched the current CUDA stream and did not switch it back: "
                                   "its work is not on the caller's stream")
            s.synchronize()  # only this stream: work left on another stream is not waited for
            with torch.cuda.stream(s):
                res = [_to_cpu(o) for o in _as_list(out)]
            return out, res
        out = st.fns[role](list(args))
        return out, [_to_cpu(o) for o in _as_list(out)]


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _storage_ids(layouts: list) -> None:
    """Replace raw storage pointers by first-appearance numbers (output-output aliasing, comparable)."""
    ids = {}
    for lay in layouts:
        p = lay.pop("storage", None)
        if p is not None:
            lay["storage_id"] = ids.setdefault(p, len(ids))


def op_load(st: State, req: dict) -> dict:
    from tilesmith import loading

    t0 = _perf_ns()
    if st.data is None:  # a worker may load the (trusted) baseline first and the candidate in a later request
        st.data = loading.load_graph_data(req["graph_dir"])
    st.device = req.get("device") or "cpu"
    consts = lambda: {k: (_to_device(v, st.device) if isinstance(v, torch.Tensor) else v)  # noqa: E731
                      for k, v in st.data.constants.items()}
    if req.get("baseline_file"):  # the best source so far, timed as the baseline
        with open(req["baseline_file"]) as f:
            st.fns["baseline"] = loading.load_module(f.read(), consts()).call
    elif req.get("baseline"):
        st.fns["baseline"] = loading.load_wrapper(req["graph_dir"], consts()).call
    if req.get("candidate"):
        with open(req["candidate"]) as f:
            text = f.read()
        st.loaders["candidate"] = lambda: loading.load_module(text, consts()).call
        st.fns["candidate"] = st.loaders["candidate"]()
    return {"load_ns": _perf_ns() - t0}


def op_outputs(st: State, req: dict) -> dict:
    """Run `role` on every set (fresh device copies), then the same-buffers pair; save everything raw."""
    sets = torch.load(req["sets_file"], weights_only=True)
    role, side = req["role"], bool(req.get("side_stream", True))
    results = []
    for inputs in sets["inputs"]:
        args = [_to_device(x, st.device) for x in inputs]
        _poison(st.device)
        out, res = _call(st, role, args, side)
        lays = [_layout(o, args) for o in _as_list(out)]
        _storage_ids(lays)
        results.append({"outputs": res, "layouts": lays, "inputs_after": [_to_cpu(a) for a in args]})
        del out
    pair = {}
    if req.get("pair"):
        i, j = req["pair"]
        bufs = [_to_device(x, st.device) for x in sets["inputs"][i]]
        out1, _ = _call(st, role, bufs, side)
        for b, x in zip(bufs, sets["inputs"][j]):
            _refill(b, _to_device(x, st.device))
        out2, second = _call(st, role, bufs, side)
        _device_sync()
        pair = {"first": [_to_cpu(o) for o in _as_list(out1)], "second": second}
    torch.save({"sets": results, "pair": pair}, req["out_file"])
    return {}


def _poison(device: str) -> None:
    """Fill freshly freed memory with NaN so outputs that are never written read as NaN, not stale data."""
    if not device.startswith("cuda"):
        return
    # The allocator's free bytes are split over cached blocks: one tensor of the total would not fit
    # in any of them and would grow the pool instead (each call doubling it, until out of memory).
    # So poison in halving chunks, and give back any chunk that needed new memory.
    held, chunk = [], min(torch.cuda.memory_reserved() - torch.cuda.memory_allocated(), 8 << 30)
    while chunk >= 1 << 20:
        reserved = torch.cuda.memory_reserved()
        t = torch.empty(chunk // 4, dtype=torch.float32, device=device)
        if torch.cuda.memory_reserved() > reserved:
            del t
            torch.cuda.empty_cache()
            chunk = min(chunk // 2, torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
            continue
        t.fill_(float("nan"))
        held.append(t)
        chunk = min(chunk, torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    del held  # freed: the NaN-filled blocks are what the next allocations get


def op_ref64(st: State, req: dict) -> dict:
    """Run the FX program of the header in float64 on every set; unavailable is an answer, not an error."""
    from tilesmith.gate.reference import run_fx_float64

    sets = torch.load(req["sets_file"], weights_only=True)
    try:
        outs = [run_fx_float64(req["wrapper_text"], st.data.constants, inputs) for inputs in sets["inputs"]]
    except Exception as e:  # an FX program we cannot re-run in float64: compare against the original only
        return {"available": False, "why": f"{type(e).__name__}: {e}"[:300]}
    torch.save({"outputs": outs}, req["out_file"])
    return {"available": True}


def op_time_setup(st: State, req: dict) -> dict:
    """Rotating device buffers for each role; in graph mode a CUDA graph per buffer set and role.

    The candidate is timed on a fresh instance of its module, as a program's first calls would run it:
    state its calls keep (a CUDA-graph replay learning which outputs the caller holds) comes from these
    calls, not from the correctness calls before. Parameters (graph.json) stay in one buffer across the sets,
    as a program's weights stay at one address; the other inputs rotate. `modes` may time a role in
    another mode than `mode` (a candidate with its own replay against Inductor's, in graph mode)."""
    sets = torch.load(req["sets_file"], weights_only=True)["inputs"]
    shared = {i for i, d in enumerate(st.data.meta.get("inputs") or []) if d.get("parameter")}
    for role in req["roles"]:
        first = [_to_device(x, st.device) for x in sets[0]]
        bufs = [first] + [[first[i] if i in shared else _to_device(x, st.device) for i, x in enumerate(inputs)]
                          for inputs in sets[1:]]
        fn = st.loaders[role]() if role in st.loaders else st.fns[role]
        if (req.get("modes") or {}).get(role, req["mode"]) == "graph":
            st.timed[role] = [_capture_graph(st, fn, b) for b in bufs]
        else:
            st.timed[role] = [(lambda fn=fn, b=b: fn(list(b))) for b in bufs]
        with torch.no_grad():
            for _ in range(2):  # warm-up: first calls autotune and allocate, a replay records its graphs
                for thunk in st.timed[role]:
                    thunk()
    _device_sync()
    return {}


def _capture_graph(st: State, fn, bufs):
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn(list(bufs))
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(list(bufs))
    # The graph reads and writes these addresses on every replay: its inputs must outlive it like its
    # outputs. (Dropping `bufs` here let later allocations, or empty_cache at the next capture, take that
    # memory: replays then read freed memory, and on the H200 hit an illegal address now and then.)
    st.keep.append((g, out, bufs))
    return g.replay


def op_time(st: State, req: dict) -> dict:
    """`rounds` paired samples of `reps` calls each; order alternates; device-wide sync around each sample."""
    reps, first = int(req["reps"]), int(req.get("round0", 0))
    roles = req["roles"]
    ns = {r: [] for r in roles}
    k = 0
    with torch.no_grad():
        for r in range(first, first + int(req["rounds"])):
            order = roles if r % 2 == 0 else roles[::-1]
            for role in order:
                thunks = st.timed[role]
                _device_sync()
                t0 = _perf_ns()
                for i in range(reps):
                    thunks[(k + i) % len(thunks)]()
                _device_sync()
                ns[role].append(_perf_ns() - t0)
            k += reps
    return {"ns": ns}


def op_ready(st: State, req: dict) -> dict:
    """Answered once the imports (and the CUDA context) are up: the parent waits on it to know the worker is idle."""
    return {"pid": os.getpid(), "startup_s": _STARTUP_S}


OPS = {"ready": op_ready, "load": op_load, "outputs": op_outputs, "ref64": op_ref64, "time_setup": op_time_setup, "time": op_time}


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the deciding process dies, so no candidate code outlives it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() == 1:
        os._exit(1)


# What Inductor's wrapper headers import (CPU and Triton); trusted torch modules, imported before any
# wrapper so a worker started early does not pay for them when its candidate arrives. Names missing in
# one torch version are skipped.
_WRAPPER_IMPORTS = ("torch._inductor.async_compile", "torch._inductor.codegen.memory_planning", "torch._inductor.hooks",
                    "torch._inductor.select_algorithm", "torch._inductor.utils", "torch._inductor.codegen.multi_kernel")
_TRITON_IMPORTS = ("triton", "triton.language", "torch._inductor.runtime.triton_heuristics",
                   "torch._inductor.runtime.triton_helpers", "torch._inductor.runtime.hints")


def _warm_inductor(device: str) -> None:
    """Import what a wrapper will import and, on CPU, run Inductor's vector-ISA probe (about a second of
    test compiles, cached for the process): still no wrapper code in this process."""
    import importlib

    names = _WRAPPER_IMPORTS + (_TRITON_IMPORTS if device.startswith("cuda") else ())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # absent in this torch version: the wrapper that needs it says so when loaded
            pass
    if not device.startswith("cuda"):
        try:
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
        except Exception:
            pass


def _warm_device(device: str) -> None:
    """Create the CUDA context now (a second or so), so a worker started early has it before its candidate
    arrives; still a fresh context: no wrapper code has run in this process."""
    if _CUDA and device.startswith("cuda"):
        try:
            torch.empty(1, device=device)
            torch.cuda.synchronize(device)
        except Exception:  # the first real request reports any CUDA problem with its reason
            pass


def main(fd: int) -> None:
    out = os.fdopen(fd, "w", buffering=1)
    st = State()
    # Import what loading a wrapper needs before the first request, so a worker spawned early is ready
    # when its candidate arrives (no wrapper code has run yet: the process is still fresh).
    _die_with_parent()
    import importlib

    import torch._inductor.codecache as codecache

    importlib.import_module("tilesmith.loading")  # the torch pieces the first load needs

    header_dir = os.environ.get("TILESMITH_GATE_HEADER_DIR")
    if header_dir and hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = header_dir
        codecache._HEADER_LOCK_DIR = os.path.join(header_dir, "locks")
    device = os.environ.get("TILESMITH_GATE_DEVICE", "cpu")
    _warm_inductor(device)
    _warm_device(device)
    global _STARTUP_S
    _STARTUP_S = (_perf_ns() - _T0_NS) / 1e9
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("op") == "exit":
            break
        try:
            reply = {"ok": True, **OPS[req["op"]](st, req)}
        except Exception as e:  # the candidate raised (or could not load): the parent decides what it means
            from tilesmith.errors import TilesmithError

            code = e.code if isinstance(e, TilesmithError) else "raised"
            if isinstance(e, torch.cuda.OutOfMemoryError):
                code = "out-of-memory"
            reply = {"ok": False, "code": code, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]))
