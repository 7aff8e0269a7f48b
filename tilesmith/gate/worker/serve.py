"""The gate's worker: `python -m tilesmith.gate.worker RESULT_FD` runs main() here. Runs wrapper code, never decides.

Requests arrive as JSON lines on stdin; each reply is one JSON line on the private pipe RESULT_FD.
Bulk results (outputs, inputs after the call) go to torch.save files the deciding process reads with
weights_only=True. Timing replies carry raw nanosecond totals only. The clock and the device
synchronisation are bound here, at import, before any wrapper code can run.
"""

from __future__ import annotations

import functools
import gc
import os
import select
import sys
import time

_perf_ns = time.perf_counter_ns  # bound before candidate code exists in this process
_urandom = os.urandom
_gc_enable = gc.enable
_T0_NS = _perf_ns()
_STARTUP_S = 0.0  # seconds from this module's first line to the first request it can take

import torch  # noqa: E402

from tilesmith.capture.tensors import span_numel  # noqa: E402
from tilesmith.gate import clock  # noqa: E402
from tilesmith.gate.worker import audit, guard, patches, seccomp  # noqa: E402
from tilesmith.gate.worker.fingerprint import _state_change, process_state  # noqa: E402
from tilesmith.gate.inputs import parameter_indices, trees_static, updated_indices  # noqa: E402
from tilesmith.gate.worker.outputs import _call, op_outputs, op_ref64  # noqa: E402
from tilesmith.gate.worker.state import State  # noqa: E402
from tilesmith.gate.worker.tensors import PRIMS, _as_list, _refill, _to_cpu, _to_device, outputs_digest, snapshot as _snapshot  # noqa: E402
from tilesmith.gate.worker.warm import warm_device, warm_inductor  # noqa: E402

_CUDA = torch.cuda.is_available()
_spin = clock.spin  # bound before any candidate code runs, as the sync is
_clock_ns = clock._perf_ns
_write = os.write
_MARK_FD = -1  # the socket timed windows are marked on (main sets it before the worker guard records this module)
_MARK_ID = None  # that socket's identity, (st_dev, st_ino): a descriptor redirected to anything else is seen
_TENSOR = torch.Tensor
_device_sync = torch._C._cuda_synchronize if _CUDA else (lambda: None)
_grad_enabled, _set_grad = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_DISPATCH = None  # guard.dispatch_state(): main sets it before the worker guard records this module
_fn_depth, _dispatch_depth = torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack


def _mode_depths() -> tuple:
    return _fn_depth(), _dispatch_depth()
WARM_WAIT_NS = 50_000_000  # after a warm-up, how long the worker waits for the sample's request awake (spinning)


def op_load(st: State, req: dict) -> dict:
    from tilesmith.capture import loading

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
    if req.get("best_file"):  # the best source so far (trusted: accepted earlier), timed as the baseline
        with open(req["best_file"]) as f:
            st.fns["best"] = loading.load_module(f.read(), consts()).call
    if req.get("candidate"):
        with open(req["candidate"]) as f:
            text = f.read()
        if st.state0 is None:  # the last moment before candidate code runs in this process
            st.state0 = process_state()
            st.watched = _wrapper_globals(st)
            st.patch0 = patches.snapshot(st.watched)
        # A thunk loading the module again: the timed calls run on a fresh instance (op_time_setup).
        st.loaders["candidate"] = lambda: loading.load_module(text, consts()).call
        st.fns["candidate"] = st.loaders["candidate"]()
        # From here on no signal handler can be installed, nor a timer armed, by anything in this process: the
        # kernel refuses (gate/worker/seccomp.py). One the load itself left behind, the checks after this request find.
        if st.seccomp is None:
            st.seccomp = seccomp.install()
        return {"load_ns": _perf_ns() - t0, "seccomp": st.seccomp}
    return {"load_ns": _perf_ns() - t0}


def _wrapper_globals(st: State) -> dict:
    """The module globals of the wrappers loaded here before the candidate (the baseline timed beside it)."""
    out = {}
    for role, fn in st.fns.items():
        g = getattr(getattr(fn, "__func__", fn), "__globals__", None)
        if isinstance(g, dict):
            out[f"{role} wrapper"] = g
        runner = getattr(getattr(fn, "__self__", None), "__dict__", None)  # call = Runner(...).call
        if isinstance(runner, dict):
            out[f"{role} runner"] = runner
    return out


def op_time_setup(st: State, req: dict) -> dict:
    """`buffers` rotating device buffers for each role, filled from the first input contents of the
    sets file (the pool later samples are refilled from); in graph mode a CUDA graph per buffer set.

    The candidate is timed on a fresh instance of its module, as a program's first calls would run it:
    state its calls keep (a CUDA-graph replay learning which outputs the caller holds) comes from these
    calls, not from the correctness calls before. Parameters (graph.json) stay in one buffer across the
    buffer sets, as a program's weights stay at one address (their content is the same in every timing
    set: gate.original.timing_contents); the other inputs rotate."""
    contents = torch.load(req["sets_file"], weights_only=True)["inputs"]
    st.trees_fallback = {}  # this request's roles only (a kept worker times later decisions too)
    n = max(1, int(req.get("buffers") or len(contents)))
    st.shared = parameter_indices(st.data.meta) if st.data else set()
    updated = _updated(st)
    for role in req["roles"]:
        st.timed.pop(role, None)  # a second setup (more buffer sets): the old graphs go before new ones are made
        st.trees_roles.discard(role)
    # The trees' manager keeps every function it was given until it is reset, and a reset frees them all:
    # reset when no role outside this request runs through them (the baseline beside the candidate may),
    # whatever this request sets up (after a fallback to graph mode, their memory comes back).
    if st.trees_live and not st.trees_roles:
        from tilesmith.gate.worker.trees import reset_trees

        reset_trees()
        st.trees_live = False
    for role in req["roles"]:
        st.keep[role] = []
        st.pool[role] = [[_to_device(x, st.device) for x in inputs] for inputs in contents]
        bufs = st.bufs[role] = []
        for b in range(n):
            bufs.append([bufs[0][i] if b and i in st.shared else _to_device(x, st.device)
                         for i, x in enumerate(contents[b % len(contents)])])
        fn = st.loaders[role]() if role in st.loaders else st.fns[role]
        if req["mode"] == "trees":
            st.timed[role] = _trees(st, role, fn)
        elif req["mode"] == "graph":
            st.timed[role] = [_capture_graph(st, role, fn, b) for b in st.bufs[role]]
        else:
            st.timed[role] = [(lambda fn=fn, b=b: fn(list(b))) for b in st.bufs[role]]
        if updated:  # each call's outputs, then the inputs it updates in place as that call left them
            st.timed[role] = [functools.partial(_with_updated, t, tuple(b[i] for i in updated))
                              for t, b in zip(st.timed[role], st.bufs[role])]
        with torch.no_grad():
            for _ in range(2):  # warm-up: first calls autotune and allocate, a replay records its graphs
                for thunk in st.timed[role]:
                    thunk()
    _device_sync()
    return {"trees_fallback": dict(st.trees_fallback)} if st.trees_fallback else {}


def _updated(st: State) -> list[int]:
    """The inputs the graph updates in place (graph.json's mutated_inputs)."""
    return sorted(updated_indices(st.data.meta)) if st.data else []


def _with_updated(thunk, updated: tuple, seqs=(list, tuple), type_=type) -> list:
    """A timed call of a graph that updates inputs in place: its outputs, then those inputs (a parameter's one
    buffer, another input's in this call's set). The reservoir's snapshot of a kept call, and the last call's, then
    hold the values that call left, checked against the original's like any output (op_original_checks): skipping
    an update, or making it on some calls only, is wrong values in timing."""
    out = thunk()
    return [*out, *updated] if type_(out) in seqs else [out, *updated]


def _trees(st: State, role: str, fn) -> list:
    """Trees mode (gate/worker/trees.py), or graph mode where this torch's trees cannot be set up or their
    first calls fail: the reason goes back per role with time_setup's reply (the parent rejects a candidate
    whose own calls fail through the trees, and times every role as a bare replay where the original's do).
    The candidate runs through the trees only where each call reads its own buffer set (Inductor's static
    marks known): with every input static, every call would read the same inputs."""
    from tilesmith.gate.worker.trees import tree_thunks

    try:
        meta = st.data.meta if st.data else {}
        static = trees_static(meta)
        if role == "candidate" and static is None:
            raise ValueError("Inductor's static marks are unknown: the candidate is not run with every input static")
        st.trees_live = True  # from here on the trees' manager may hold this role's function
        thunks, alive = tree_thunks(fn, st.bufs[role], st.device, meta.get("mutated_inputs") or [], static, reset=False)
    except Exception as e:  # noqa: BLE001 - the trees' own failure: time it as before
        st.trees_fallback[role] = f"{type(e).__name__}: {e}"[:300]
        return [_capture_graph(st, role, fn, b) for b in st.bufs[role]]
    st.keep[role].append((alive, st.bufs[role][0]))  # outputs live in the trees' pool: snapshots copy them
    st.trees_roles.add(role)
    return thunks


def _capture_graph(st: State, role: str, fn, bufs):
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
    st.keep[role].append((g, out, bufs))
    replay = g.replay
    return lambda: (replay(), out)[1]


def _same_file(fstat, fd: int, ident) -> bool:
    """Whether descriptor `fd` still is the file `ident` (st_dev, st_ino) names."""
    try:
        st_ = fstat(fd)
    except OSError:
        return False
    return (st_.st_dev, st_.st_ino) == ident


def _timed_window(window: list, gap: int, graph: bool, ours: bool, marks, tools: tuple) -> tuple:
    """op_time's timed window: (ns, kept outputs, kept call, last outputs). Written out here rather than through
    clock.timed: everything it uses is an argument, bound by op_time before the request's first candidate call,
    a local of this frame, which code run by a call cannot rebind without writing the interpreter's memory.
    `marks`: (send a mark, the mark socket still ours?)."""
    perf, spin, sync, urandom, snapshot, prims, tensor, type_, isinstance_, from_bytes, seqs, calls, error, moved = tools
    tuple_, map_, ddump, dtable, dnames, dtables, dstate = moved
    kept, kept_i, last, odd, redirected = None, -1, None, "", False
    sync()
    if marks is not None:
        # Candidate code shares this process and could point the descriptor elsewhere (os.dup2) and send marks of
        # its own: checked right before the opening mark and right after the closing one.
        redirected = not marks[1]()
        marks[0]()
    t0 = perf()
    for i in calls:
        if gap:  # the program's own host time before each call (gate.timed.program_gap_ns): the GPU runs on
            spin(gap, perf)
        last = window[i]()
        # No profile or trace function can run here (the reservoir's snapshot of a kept call would call it, and it
        # could compute only the outputs that are read): the audit hook refuses to set one (gate/worker/audit.py).
        # Plain tensors only: a subclass can return at once and do the work only when a value is read, after the
        # clock stopped (a red-team cheat was accepted at 27x that way: the two kept calls were forced, right, by
        # the digest; no other call ever ran).
        # ... in an exact tuple or list (or alone): a subclass of either is iterated by snapshot's list(out), its
        # __iter__ candidate code that knew which calls were kept (a red-team cheat computed only those, at 2.9x).
        if not odd:
            if type_(last) in seqs:
                for o in last:
                    if isinstance_(o, tensor) and type_(o) is not tensor:
                        odd = type_(o).__name__
                        break
            elif type_(last) is not tensor:
                odd = type_(last).__name__
        # Reservoir sampling, drawn after the call returned: every call of the sample equally likely to be kept.
        # Only the candidate's kept outputs are checked: the baseline's copy (a clone in graph and trees modes,
        # inside its timed sample) would be a cost only the baseline pays.
        if from_bytes(urandom(2), "little") * (i + 1) < 65536:  # probability 1/(i+1)
            kept, kept_i = (snapshot(last, graph, prims) if ours else None), i
    sync()
    t1 = perf()
    if marks is not None:
        marks[0]()
        redirected = redirected or not marks[1]()
    # Before the snapshot and digest dispatch anything: a kernel the candidate registered is in place now.
    if tuple_(map_(ddump, dnames)) + tuple_(map_(dtable, dtables)) != dstate:
        raise error("the candidate changes process state: it registers a kernel for an op the gate worker runs on "
                    "its outputs", code="process-state")
    if redirected:
        raise error("the socket the timed window is marked on was pointed elsewhere during the request: the window "
                    "the parent measures could be forged", code="timing-forged")
    if odd:
        raise error(f"a timed call returned a {odd[:60]}, not a plain torch.Tensor in a plain tuple or list: its values "
                    "could be worked out after the clock stopped", code="output-type")
    return t1 - t0, kept, kept_i, last


def op_warm(st: State, req: dict) -> dict:
    """The untimed calls before a timed sample, in a request of their own, sent before the sample's: the
    pending sample's outputs kept (`keep`) or dropped, then half a sample's worth of calls of `role` from
    `start`. Candidate code runs here, before the sample's input values (`fill`, `perturb`) reach this
    process: inside one request, these calls read them from the request's frame and computed every timed
    call's outputs off the clock (a red-team cheat, accepted at 25x; tests/redteam.py). What could still run
    candidate code between the sample's request and its window (a profile hook, a finalizer, a mode, a signal
    handler) is kept out of that span: the audit hook, the collector off, the check before the refill and the
    seccomp filter (gate/windows.py)."""
    role, reps, k = req["role"], int(req["reps"]), int(req.get("start", 0))
    # The parent's word on the last candidate sample comes with the next warm-up of this worker, whatever
    # its role: its kept outputs go to disk or are dropped before anything else runs here (held in memory
    # while the baseline ran beside, they made its calls allocate afresh: 1.7x slower on CPU).
    if req.get("keep"):
        _keep_pending(st)
    st.pending = None
    thunks = st.timed[role]
    n = len(thunks)
    with torch.no_grad():
        # Half a sample's worth: the process or role that ran last (the other worker, or the other role in this
        # one) leaves caches, TLB and sleeping threads behind, and without these a sample timed right after
        # another paid for it (the baseline beside the candidate came out 2 % slower than the candidate itself,
        # with both running the same code; RESULTS.md). They read the values the buffers still hold, from the
        # last sample: the timed calls' values are new to them.
        for i in range(max(1, reps // 2)):
            thunks[(k + i) % n]()
    # Their device work done before the reply: left queued, it ran in the sample's request, before its window, and
    # the parent's span from that request to the window (gate/windows.py) then held however much of
    # the warm-up the GPU had not caught up with, which differs between an honest candidate and the original (on
    # the H200 a real win's windows opened 887 us after their requests, rejected as work done off the clock).
    _device_sync()
    return {}


def op_time(st: State, req: dict) -> dict:
    """One timed sample: `reps` calls of `role` over the rotating buffers from index `start`, device-wide
    sync around it, right after its warm-up (op_warm, a request of its own). Before it, the buffers are
    refilled with the contents `fill` names (new values, same addresses): no candidate code runs from this
    request's arrival to its window. After each call, a fresh random draw decides whether this call replaces
    the one kept so far (reservoir sampling: every call of the sample equally likely): drawn after the call
    returns, so no call can know whether it will be checked. The kept call and the last call stay pending;
    the next warm-up says whether the parent wants them (`keep`)."""
    # Everything this request uses once candidate code has run, bound first as locals (here, then the window's
    # arguments): a global read later could hold a replacement that puts the original back before the guard looks
    # (a red-team cheat did that to the clock), and a closure's cell can be rewritten from Python (another
    # blinded the type check).
    from tilesmith.errors import TilesmithError

    role, reps, k = req["role"], int(req["reps"]), int(req.get("start", 0))
    snapshot, digest, prims, timed_window, gc_on = _snapshot, outputs_digest, PRIMS, _timed_window, _gc_enable
    # The dispatcher's kernels for the ops the snapshot and digest run on the outputs (guard.dispatch_state),
    # compared inline after the window's calls by C functions and builtins bound now (no Python function whose code
    # could be swapped and put back). Before the refill, main's check after the warm-up request found them as recorded.
    moved = (tuple, map) + (_DISPATCH or (None, None, (), (), ()))
    tools = (_clock_ns, _spin, _device_sync, _urandom, snapshot, prims, _TENSOR, type, isinstance, int.from_bytes,
             (list, tuple), range(reps), TilesmithError, moved)
    # The parent's own measure of the window: a datagram the kernel timestamps as it is sent (proc._mark_socket),
    # and a check that the descriptor still is that socket (none where op_time runs without a parent, in a test).
    marks = ((functools.partial(_write, _MARK_FD, clock.WINDOW_MARK), functools.partial(_same_file, os.fstat, _MARK_FD,
                                                                                       _MARK_ID))
             if _MARK_FD >= 0 else None)
    # The program's own host time before each call (gate.timed.program_gap_ns), read from this request before
    # any candidate code runs in it; the parent rejects a sample shorter than its calls' share of it.
    gap = max(0, min(clock.MAX_GAP_NS, int(req.get("gap_ns") or 0)))
    ours = role == "candidate"  # the outputs kept for checks are the candidate's (the baseline may run here too)
    # The pending outputs are the warm-up's to keep or drop: dropped here, a finalizer of theirs would run candidate
    # code after this request's values arrived (a sample asked for without its warm-up replaces them after the window).
    thunks = st.timed[role]
    n, graph = len(thunks), bool(st.keep.get(role))
    # A torch function or dispatch mode left entered by the warm-up would see every op of the refill below, after this
    # sample's values arrived, and could leave before the window: the parent no longer compares that span, so none may
    # be there (C queries bound at import; honest wrappers leave none).
    if _mode_depths() != (0, 0):
        raise TilesmithError("the candidate changes process state: a torch function or dispatch mode was left entered "
                             "between its warm-up and its timed sample", code="process-state")
    # The refill runs with the process's thread count: changing it here would make the first timed call
    # start a new thread team.
    for b, c in enumerate(req.get("fill") or []):
        _set_content(st, st.bufs[role][b], st.pool[role][c], req.get("perturb"), b)
    window = [thunks[(k + i) % n] for i in range(reps)]
    # From the window's end to the digest of its kept outputs nothing runs that candidate code can redirect: grad
    # mode through C functions bound at import (`torch.no_grad()`'s exit looks `torch.set_grad_enabled` up as it
    # runs: a replacement that put the original back filled the kept and last outputs there, accepted at 15x), no
    # attribute of `st` (its class's `__setattr__` can be replaced: 13x), the collector still off (finalizers).
    grad_was = _grad_enabled()
    _set_grad(False)
    try:
        ns, kept, kept_i, last = timed_window(window, gap, graph, ours, marks, tools)
    finally:
        _set_grad(grad_was)
    if ours:
        outputs = [kept, snapshot(last, graph, prims)]
        # The kept outputs go to a file in the candidate's own folder and reach the parent later
        # (gate.timed._timing_checks compares them with this).
        crc = digest(outputs, prims)
    gc_on()  # off since the last reply (main)
    if not ours:
        return {"ns": ns}
    st.pending = {"start": k, "calls": [kept_i, reps - 1], "outputs": outputs}
    return {"ns": ns, "digest": crc}


def _set_content(st: State, bufs: list, content: list, seed, b: int) -> None:
    """Refill one buffer set with a pool content; with a seed, every non-parameter input then gets values
    no call has seen before, drawn on the device from (seed, b), so no cache keyed on content can answer
    from memory: floats are scaled by 1 + 1e-2 * uniform(-1, 1) elementwise (signs and zeros kept),
    integers and bools drawn afresh inside their recorded [min, max] as the correctness sets draw them
    (the pool's few contents came back every few samples: a cache keyed on token ids answered from
    memory, right on every checked call; tests/redteam.py)."""
    inputs = (st.data.meta.get("inputs") if st.data else None) or [{}] * len(bufs)
    updated = _updated(st)
    for i, (dst, src) in enumerate(zip(bufs, content)):
        if i in st.shared:  # one buffer for every set, and the same content in each: nothing to refill ...
            if b == 0 and i in updated:  # ... but where the graph updates it: each sample starts from its content
                _refill(dst, src)
            continue
        _refill(dst, src)
        info = inputs[i] if i < len(inputs) else {}
        if seed is None or not isinstance(dst, torch.Tensor) or not span_numel(dst) or dst.dtype.is_complex:
            continue
        n = span_numel(dst)
        g = torch.Generator(device=dst.device).manual_seed((int(seed) * 1009 + b * 101 + i) % (1 << 62))
        flat = dst.as_strided((n,), (1,), dst.storage_offset())
        if dst.dtype.is_floating_point:
            u = torch.rand(n, generator=g, device=dst.device, dtype=torch.float32)
            flat.mul_((1.0 + 1e-2 * (2.0 * u - 1.0)).to(dst.dtype))
            continue
        r = info.get("range") or {}
        if "min" in r and "max" in r and int(r["max"]) > int(r["min"]):
            flat.copy_(torch.randint(int(r["min"]), int(r["max"]) + 1, (n,), generator=g, device=dst.device))


def op_original_checks(st: State, req: dict) -> dict:
    """The original (role baseline) on exactly the inputs of the candidate's kept timed calls: for each
    sample (fill, perturb seed, start) and each kept call, the buffer that call read, rebuilt."""
    role, n = req["bufs_role"], len(st.bufs[req["bufs_role"]])
    updated = _updated(st)
    results = []
    for sample in req["samples"]:
        if set(updated) & st.shared:
            results.append(_sample_replayed(st, role, n, sample, updated, bool(req.get("late"))))
            continue
        outs = []
        for call in sample["calls"]:
            b = (sample["start"] + call) % n
            bufs = st.bufs[role][b]
            _set_content(st, bufs, st.pool[role][sample["fill"][b]], sample["perturb"], b)
            _, res = _call(st, "baseline", bufs, False)
            outs.append(res + [_to_cpu(bufs[i]) for i in updated])
        results.append(outs)
    torch.save(results, req["out_file"])
    return {}


def _sample_replayed(st: State, role: str, n: int, sample: dict, updated: list, late: bool) -> list:
    """The original's outputs at a sample's kept calls where a parameter it updates in place (one buffer for every
    set: a program's running statistics or optimizer state stay at one address) carries state from each call to the
    next: every buffer set refilled as before the sample, then the sample's calls in order up to its last kept one.
    late: read as the candidate's worker read them in launch timing, where a kept call's outputs are held, not
    copied, until the sample ends (a copy inside the window would cost the candidate alone: an A/A read 0.66-0.74x
    on the H100): what such a call returns or updates that a later call of the sample updated again is read as the
    last call left it, here as there."""
    for b, c in enumerate(sample["fill"]):
        _set_content(st, st.bufs[role][b], st.pool[role][c], sample["perturb"], b)
    want, got = set(sample["calls"]), {}
    for i in range(max(want) + 1):
        bufs = st.bufs[role][(sample["start"] + i) % n]
        out, res = _call(st, "baseline", bufs, False)
        if i in want:
            got[i] = (_as_list(out) + [bufs[j] for j in updated]) if late else res + [_to_cpu(bufs[j]) for j in updated]
        del out
    if late:
        got = {i: [_to_cpu(o) for o in outs] for i, outs in got.items()}
    return [got[c] for c in sample["calls"]]


def _keep_pending(st: State) -> None:
    """Keep the pending sample's outputs for the checks, on disk, not in memory: kept outputs held in this
    process would keep allocator memory the next timed calls then must get afresh (page faults on CPU),
    a cost the baseline's worker, which keeps nothing, never pays (a 3x faster candidate measured 0.27x)."""
    p, st.pending = st.pending, None
    if p is not None:
        p["outputs"] = [[_to_cpu(o) for o in outs] for outs in p["outputs"]]
        f = os.path.join(os.getcwd(), f"kept-{len(st.checks):03d}.pt")
        torch.save(p, f)
        st.checks.append(f)
        del p


def op_checks(st: State, req: dict) -> dict:
    """The kept outputs of timed calls (the pending sample's too when `keep`), saved raw for the parent."""
    if req.get("keep"):
        _keep_pending(st)
    checks = [torch.load(f, weights_only=True) for f in st.checks]
    torch.save(checks, req["out_file"])
    for f in st.checks:
        os.remove(f)
    n, st.checks = len(checks), []
    return {"n": n}


def _patched(st: State) -> str:
    if st.patch0 is None:
        return ""
    names = patches.replaced(st.patch0, st.watched)
    return ("it replaces " + ", ".join(names) + " (code that runs after it in this process would call the "
            "replacement)") if names else ""


def op_pin(st: State, req: dict) -> dict:
    """Run on exactly these CPUs from now on: the parent gives the baseline's worker and the candidate's
    the same ones, so their paired samples share a core's load and caches (on a machine shared with
    other work, two processes left to the scheduler settle on differently loaded cores)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(int(c) for c in req["cpus"]))
        if st.state0 is not None:  # the parent's own change of the process's state
            st.state0["affinity"] = sorted(os.sched_getaffinity(0))
    return {}


def op_ready(st: State, req: dict) -> dict:
    """Answered once the imports (and the CUDA context) are up: the parent waits on it to know the worker is idle."""
    return {"pid": os.getpid(), "startup_s": _STARTUP_S}


OPS = {"ready": op_ready, "load": op_load, "outputs": op_outputs, "ref64": op_ref64, "time_setup": op_time_setup, "warm": op_warm, "time": op_time,
       "checks": op_checks, "original_checks": op_original_checks,
       "pin": op_pin}


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


def main(fd: int, mark_fd: int = -1) -> None:
    st = State()
    # Import what loading a wrapper needs before the first request, so a worker spawned early is ready
    # when its candidate arrives (no wrapper code has run yet: the process is still fresh).
    _die_with_parent()
    import importlib

    import torch._inductor.codecache as codecache

    importlib.import_module("tilesmith.capture.loading")  # the torch pieces the first load needs

    header_dir = os.environ.get("TILESMITH_GATE_HEADER_DIR")
    if header_dir and hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = header_dir
        codecache._HEADER_LOCK_DIR = os.path.join(header_dir, "locks")
    device = os.environ.get("TILESMITH_GATE_DEVICE", "cpu")
    warm_inductor(device)
    warm_device(device)
    global _STARTUP_S, _MARK_FD, _MARK_ID, _DISPATCH
    _STARTUP_S = (_perf_ns() - _T0_NS) / 1e9
    if mark_fd >= 0:
        st_ = os.fstat(mark_fd)
        _MARK_FD, _MARK_ID = mark_fd, (st_.st_dev, st_.st_ino)
    # Before any candidate code: the worker's own code and state, and what checks and sends (guard.py),
    # held in this frame. Each reply goes out only if nothing of it moved; else a failure made beforehand.
    _DISPATCH = guard.dispatch_state()
    g = guard.build([OPS])
    all_, map_, getattr_, is_, getitem, len_, tuple_ = g.bound
    objs, names, vals, dicts, keys, dvals, tables, sizes = g.objs, g.names, g.vals, g.dicts, g.keys, g.dvals, g.tables, g.sizes
    decode, write, failed, chunks, join_ = g.decode, g.write, g.failed, g.chunks, "".join
    ddump, dtable, dnames, dtables, dstate = g.dispatch
    # A profile or trace function runs Python at every call the worker makes, the reading of the next request
    # included (a red-team cheat's, set in a warm-up call, computed a sample's outputs as its request was decoded):
    # the audit hook refuses to set one, and none may be left set when a request ends (one set before the hook, or
    # through the C API, is still seen). The cyclic collector is off from each reply until the next
    # request is under way, and for a timed one until its window closed: a finalizer it ran there would be
    # candidate code (and its pauses would blur the span before the window: gate/windows.py).
    gettrace, getprofile, gc_off, gc_on = sys.gettrace, sys.getprofile, gc.disable, gc.enable
    readable, stdin_fd, perf = select.select, sys.stdin.fileno(), _perf_ns
    hooks0 = (gettrace(), getprofile())
    # From here on, for good: no code of the worker's own functions replaced in place (its modules', and every
    # function the guard records), no heap walk, no profile or trace function, no other audit hook; each refusal
    # also reported to the parent on the mark socket (gate/worker/audit.py).
    own = [m for n, m in list(sys.modules.items()) if n == "__main__" or n.startswith("tilesmith.")]
    audit.install(_MARK_FD, audit.own_functions(own, vals + dvals))
    del g, own
    for line in sys.stdin:
        req = decode(line)
        if req.get("op") == "exit":
            break
        if req.get("op") != "time":
            gc_on()
        # After a warm-up only the cheap checks: the heavy ones (the process's settings, the patches, the dispatcher's
        # tables: ~1.5 ms on the VM) would run between the warm-up calls and the window and leave the caches they
        # warmed cold (a 1-call sample on the VM came out 60 us slower and a real 1.35x win read as 1.04x). What the
        # warm-up changed they still find: after the sample's request, before its reply, comparing with the state
        # before any candidate code ran.
        full, data = req.get("op") != "warm", None
        try:
            reply = {"ok": True, **OPS[req["op"]](st, req)}
            # The reply's bytes before the checks below run Python that candidate code could reach (a class attribute
            # replaced and put back by then): what the op measured cannot be rewritten after this line.
            data = (join_(chunks(reply, 0)) + "\n").encode()
            changed = full and (_state_change(st) or _patched(st))
            if changed:  # checked after every request that ran candidate code, before any answer
                reply = {"ok": False, "code": "process-state", "error": "the candidate changes process state: " + changed}
                data = None
        except Exception as e:  # the candidate raised (or could not load): the parent decides what it means
            data = None
            from tilesmith.errors import TilesmithError

            code = e.code if isinstance(e, TilesmithError) else "raised"
            if isinstance(e, torch.cuda.OutOfMemoryError):
                code = "out-of-memory"
            reply = {"ok": False, "code": code, "error": f"{type(e).__name__}: {e}"}
        try:  # a recorded global deleted, a closure cell emptied: moved, as a replaced one is
            intact = (all_(map_(is_, map_(getattr_, objs, names), vals))
                      and all_(map_(is_, map_(getitem, dicts, keys), dvals)) and tuple_(map_(len_, tables)) == sizes
                      and (not full or tuple_(map_(ddump, dnames)) + tuple_(map_(dtable, dtables)) == dstate)
                      and (gettrace(), getprofile()) == hooks0)
        except Exception:  # noqa: BLE001
            intact = False
        if data is None:
            data = (join_(chunks(reply, 0)) + "\n").encode()
        data = data if intact else failed
        gc_off()
        while data:
            data = data[write(fd, data):]
        if not full:  # the sample's request follows at once: wait for it awake, as the warm-up left the core
            until = perf() + WARM_WAIT_NS
            while not readable([stdin_fd], (), (), 0)[0] and perf() < until:
                pass
