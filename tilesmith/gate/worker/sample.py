"""The gate worker's timed sample (requests `warm` and `time`; serve.py runs them): the untimed warm-up calls in a
request of their own, then the sample: the buffers refilled with new values, the window marked on the parent's
socket, the reservoir's kept call and the last call snapshotted and digested. The clock and the device
synchronisation are bound at import, before any wrapper code can run; op_time binds the rest as locals before the
request's first candidate call. The mark socket and the dispatcher's record are module globals serve.main sets
before the worker guard records this module.
"""

from __future__ import annotations

import array
import functools
import gc
import os
from threading import get_native_id as _native_id

import torch

from tilesmith.capture.tensors import span_numel
from tilesmith.gate import clock
from tilesmith.gate.worker.setup import _device_sync, _updated, restart
from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import PRIMS, _refill, _to_cpu, outputs_digest, snapshot as _snapshot

_urandom = os.urandom  # bound before candidate code exists in this process
_gc_enable = gc.enable
_spin = clock.spin  # bound before any candidate code runs, as the sync is
_clock_ns = clock._perf_ns
_write = os.write
_read = os.read
_TB = torch._C.TensorBase
# The timed calls' outputs' layout for the parent's own read of them (freeze below): bound before candidate code
# exists here.
_LAYOUT = (_TB.data_ptr, _TB.size, _TB.stride, _TB.dtype.__get__, _TB.element_size, _TB.numel, tuple, repr, str,
           array.array, map, len, int.from_bytes)
_MARK_FD = -1  # the socket timed windows are marked on (main sets it before the worker guard records this module)
_MARK_ID = None  # that socket's identity, (st_dev, st_ino): a descriptor redirected to anything else is seen
_TENSOR = torch.Tensor
_grad_enabled, _set_grad = torch._C.is_grad_enabled, torch._C._set_grad_enabled
_DISPATCH = None  # guard.dispatch_state(): main sets it before the worker guard records this module
_fn_depth, _dispatch_depth = torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack


def _mode_depths() -> tuple:
    return _fn_depth(), _dispatch_depth()


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
    `marks`: (send a mark, the mark socket still ours?, stop for the parent's read or None)."""
    perf, spin, sync, urandom, snapshot, prims, tensor, type_, isinstance_, from_bytes, seqs, calls, error, moved = tools
    tuple_, map_, ddump, dtable, dnames, dtables, dstate = moved
    kept, kept_i, last, odd, redirected = None, -1, None, "", False
    # Where the parent stops this process after the window (gate/freeze.py), every call's outputs stay alive until
    # then and the parent itself chooses, with the process stopped, which call is checked: no draw made here, where
    # candidate code could rig it (a red-team cheat made os.urandom answer zeros, so the kept call was always the
    # last, and computed only that one: 1.6-1.9x), and no call knows before the stop which outputs will be read (the
    # earlier calls' could be filled in by a later one, inside the window, from the reservoir's choice so far). Both
    # roles hold them alike: the memory they keep, and its page faults, are the same on both sides.
    held = [] if marks is not None and marks[2] is not None else None
    hold = held.append if held is not None else None
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
        if hold is not None:
            hold(last)
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
        # Where the parent does not stop this process (a device's outputs: not in memory it can read), reservoir
        # sampling, drawn after the call returned: every call of the sample equally likely to be kept.
        # Only the candidate's kept outputs are checked: the baseline's copy (a clone in graph and trees modes,
        # inside its timed sample) would be a cost only the baseline pays.
        if hold is None and from_bytes(urandom(2), "little") * (i + 1) < 65536:  # probability 1/(i+1)
            kept, kept_i = (snapshot(last, graph, prims) if ours else None), i
    sync()
    t1 = perf()
    if marks is not None:
        marks[0]()
        if held is not None:  # the parent stops this process, chooses the checked call and reads it (gate/freeze.py)
            kept_i = marks[2](held, tensor, type_, seqs)
            kept = snapshot(held[kept_i], graph, prims) if ours else None
            held = hold = None
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
    restart(st, role)  # state carried from call to call goes no further than a sample takes it (setup.restart)
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
    request's arrival to its window. Which call is checked: where the parent stops this process after the window
    (the CPU: gate/freeze.py), the parent chooses, with the process stopped, among every call's outputs, all kept
    alive until then; elsewhere, after each call, a fresh random draw decides whether this call replaces the one
    kept so far (reservoir sampling: every call of the sample equally likely), drawn after the call returns. The
    kept call and the last call stay pending; the next warm-up says whether the parent wants them (`keep`)."""
    # Everything this request uses once candidate code has run, bound first as locals (here, then the window's
    # arguments): a global read later could hold a replacement that puts the original back before the guard looks
    # (a red-team cheat did that to the clock), and a closure's cell can be rewritten from Python (another
    # blinded the type check).
    from tilesmith.errors import TilesmithError

    role, reps, k = req["role"], int(req["reps"]), int(req.get("start", 0))
    snapshot, digest, prims, timed_window, gc_on = _snapshot, outputs_digest, PRIMS, _timed_window, _gc_enable
    filled = bool(req.get("filled"))
    tools, marks = _window_args(reps, snapshot, prims, TilesmithError, bool(req.get("freeze")), filled)
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
    # Nor a kernel in the dispatcher's table for an op the refill runs: registered in a warm-up call, it ran in the
    # refill, where the sample's values are, computed every timed call's outputs there and removed itself before the
    # window closed (a red-team cheat, accepted at 9.8x: tests/redteam.py precomputes_the_sample_in_the_refill). The
    # comparison after the warm-up request leaves the dispatcher out (it would cool what the warm-up warmed); here it
    # runs before the refill, which touches every input again. C functions and builtins bound before candidate code.
    # Where the parent wrote the sample's values into the buffers itself, with this process stopped, and started the
    # sample's clock as it let it run (gate/refill.py), there is no refill here, and nothing before the window is
    # off the clock.
    tuple_, map_, ddump, dtable, dnames, dtables, dstate = tools[-1]
    if not filled and tuple_(map_(ddump, dnames)) + tuple_(map_(dtable, dtables)) != dstate:
        raise TilesmithError("the candidate changes process state: it registers a kernel for an op the gate worker "
                             "runs between its warm-up and its timed sample", code="process-state")
    # The refill runs with the process's thread count: changing it here would make the first timed call
    # start a new thread team.
    for b, c in enumerate([] if filled else req.get("fill") or []):
        _set_content(st, st.bufs[role][b], st.pool[role][c], req.get("perturb"), b)
    window = [thunks[(k + i) % n] for i in range(reps)]
    # From the window's end to the digest of its kept outputs nothing runs that candidate code can redirect: grad
    # mode through C functions bound at import (`torch.no_grad()`'s exit looks `torch.set_grad_enabled` up as it
    # runs: a replacement that put the original back filled the kept and last outputs there, accepted at 15x), no
    # attribute of `st` (its class's `__setattr__` can be replaced: 13x), the collector still off (finalizers).
    grad_was = _grad_enabled()
    _set_grad(False)
    try:
        if filled and marks is not None:  # the parent writes the values into this process, stopped, and starts the clock
            marks[3]()
        ns, kept, kept_i, last = timed_window(window, gap, graph, ours, marks, tools)
    finally:
        _set_grad(grad_was)
    if ours:
        outputs = [kept, snapshot(last, graph, prims)]
        # The kept outputs go to a file in the candidate's own folder and reach the parent later
        # (gate.timed._timing_checks compares them with this, or with the parent's own digest where it stopped this
        # process to read them: gate/freeze.py).
        crc = digest(outputs, prims) if marks is None or marks[2] is None else None
    gc_on()  # off since the last reply (main)
    if not ours:
        return {"ns": ns}
    st.pending = {"start": k, "calls": [kept_i, reps - 1], "outputs": outputs}
    return {"ns": ns, "digest": crc}


def _window_args(reps: int, snapshot, prims, error, freeze: bool = False, filled: bool = False) -> tuple:
    """op_time's window arguments (tools, marks), bound by op_time before the refill and the request's first
    candidate call (see _timed_window). marks: (send the window's mark, is the socket still ours, stop for the
    parent's read of the outputs or None, wait for the parent's values or None)."""
    # The dispatcher's kernels for the ops the snapshot and digest run on the outputs (guard.dispatch_state),
    # compared inline before the refill and after the window's calls by C functions and builtins bound now (no Python
    # function whose code could be swapped and put back).
    moved = (tuple, map) + (_DISPATCH or (None, None, (), (), ()))
    tools = (_clock_ns, _spin, _device_sync, _urandom, snapshot, prims, _TENSOR, type, isinstance, int.from_bytes,
             (list, tuple), range(reps), error, moved)
    # The parent's own measure of the window: a datagram the kernel timestamps as it is sent (gate/marksock.py),
    # and a check that the descriptor still is that socket (none where op_time runs without a parent, in a test).
    marks = ((functools.partial(_write, _MARK_FD, clock.WINDOW_MARK), functools.partial(_same_file, os.fstat, _MARK_FD,
                                                                                       _MARK_ID),
              functools.partial(_stop_for_the_parent, _write, _read, _MARK_FD, _LAYOUT) if freeze else None,
              functools.partial(_await_values, _write, _read, _MARK_FD, _native_id()) if filled else None)
             if _MARK_FD >= 0 else None)
    return tools, marks


def _await_values(write, read, fd: int, tid: int) -> None:
    """Everything before the window done, the sample's values not written yet: say so on the mark socket, with the id
    of this thread (the one serving requests: on the CPU not the process's main thread, which is parked), and wait,
    doing nothing, for the parent's go. Meanwhile the parent stops this process and everything under it, writes the
    values into its buffers (gate/refill.py), queues the go and lets it run: the sample's clock starts there, and no
    harness work of this request (reading it, its checks) is inside it."""
    write(fd, clock.ARMED_MARK + tid.to_bytes(4, "little"))
    read(fd, 16)


def _stop_for_the_parent(write, read, fd: int, prims: tuple, held: list, tensor, type_, seqs) -> int:
    """Right after the window's closing mark: the layout of every timed call's outputs on the mark socket (the last
    call's in full: address, size, stride, dtype; then each call's addresses), then wait, doing nothing, for the
    parent's word. Meanwhile the parent stops this process and everything under it, chooses the call it checks, reads
    that call's and the last call's outputs out of its memory and digests them (gate/freeze.py): what they hold when
    the process stops is what is checked, and the stop ends the sample. Returns the call the parent chose."""
    data_ptr, size, stride, dtype_of, element_size, numel, tuple_, repr_, str_, array_, map_, len_, from_bytes = prims
    last = held[-1] if held else []
    entries = []
    for o in (last if type_(last) in seqs else [last]):
        if type_(o) is tensor:
            entries.append(("t", data_ptr(o) if numel(o) else 0, tuple_(size(o)), tuple_(stride(o)), str_(dtype_of(o)),
                            element_size(o)))
        else:
            entries.append(("o", repr_(o)))
    ptrs = array_("Q")
    for out in held:
        outs = out if type_(out) in seqs else [out]
        try:
            row = tuple_(map_(data_ptr, outs))
        except TypeError:  # a non-tensor among them: it has no address (the last call's repr stands for it)
            row = tuple_(data_ptr(o) if type_(o) is tensor else 0 for o in outs)
        ptrs.extend(row)
    data = repr_((tuple_(entries), len_(held))).encode() + b"\n" + ptrs.tobytes()
    part, last_part = clock.LAYOUT_PART, clock.LAYOUT_MARK
    while len_(data) > clock.LAYOUT_CHUNK:  # a datagram holds so much (a backward graph's outputs are hundreds)
        write(fd, part + data[:clock.LAYOUT_CHUNK])
        data = data[clock.LAYOUT_CHUNK:]
    write(fd, last_part + data)
    go = read(fd, 16)  # the parent's go, once it has read what it checks and let this process run again
    return from_bytes(go[1:5], "little")


def _set_content(st: State, bufs: list, content: list, seed, b: int) -> None:
    """Refill one buffer set with a pool content; with a seed, every non-parameter input then gets values
    no call has seen before, drawn on the device from (seed, b), so no cache keyed on content can answer
    from memory: floats are scaled by 1 + 1e-2 * uniform(-1, 1) elementwise (signs and zeros kept),
    integers and bools drawn afresh inside their recorded [min, max] as the correctness sets draw them
    (the pool's few contents came back every few samples: a cache keyed on token ids answered from
    memory, right on every checked call; tests/redteam.py). A parameter (one buffer for every set) the graph
    updates in place is refilled at set 0; there the parameters of st.rescaled (inputs.rescaled_parameters: the
    updated ones, and all where no other input can vary) get their floats scaled too, their integers kept."""
    inputs = (st.data.meta.get("inputs") if st.data else None) or [{}] * len(bufs)
    updated = _updated(st)
    for i, (dst, src) in enumerate(zip(bufs, content)):
        if i in st.shared:  # one buffer for every set, and the same content in each: nothing to refill ...
            if b == 0 and (i in updated or i in st.rescaled):  # ... but there: each sample starts from its content
                _refill(dst, src)
                if seed is not None and i in st.rescaled and isinstance(dst, torch.Tensor):
                    _perturb(dst, seed, b, i)  # floats only
            continue
        _refill(dst, src)
        info = inputs[i] if i < len(inputs) else {}
        if seed is None or not isinstance(dst, torch.Tensor) or not span_numel(dst) or dst.dtype.is_complex:
            continue
        flat, g = _perturb(dst, seed, b, i)
        if dst.dtype.is_floating_point:
            continue
        r = info.get("range") or {}
        if "min" in r and "max" in r and int(r["max"]) > int(r["min"]):
            flat.copy_(torch.randint(int(r["min"]), int(r["max"]) + 1, (flat.numel(),), generator=g, device=dst.device))


def _perturb(dst, seed, b: int, i: int) -> tuple:
    """Scale a float buffer's storage span by 1 + 1e-2 * uniform(-1, 1) elementwise, drawn on its device from
    (seed, set b, input i), in place (an integer one is left as it is); (the flat span, the generator, for an
    integer's fresh draw)."""
    n = span_numel(dst)
    g = torch.Generator(device=dst.device).manual_seed((int(seed) * 1009 + b * 101 + i) % (1 << 62))
    flat = dst.as_strided((n,), (1,), dst.storage_offset())
    if n and dst.dtype.is_floating_point:
        u = torch.rand(n, generator=g, device=dst.device, dtype=torch.float32)
        flat.mul_((1.0 + 1e-2 * (2.0 * u - 1.0)).to(dst.dtype))
    return flat, g


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
