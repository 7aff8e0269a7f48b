"""The gate worker's setup ops (requests `load`, `time_setup` and `pin`; serve.py runs them): the wrappers loaded,
the rotating timing buffers filled and, in graph and trees modes, the CUDA graphs or cudagraph trees over them. The
clock and the device synchronisation used here are bound at import, before any wrapper code can run.
"""

from __future__ import annotations

import functools
import os
import time

import torch

from tilesmith.gate.inputs import parameter_indices, rescaled_parameters, trees_static, updated_indices
from tilesmith.gate.worker import patches, seccomp
from tilesmith.gate.worker.fingerprint import process_state
from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import _refill, _to_device

_perf_ns = time.perf_counter_ns  # bound before candidate code exists in this process
_CUDA = torch.cuda.is_available()
_device_sync = torch._C._cuda_synchronize if _CUDA else (lambda: None)


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
        # From here on no signal handler can be installed, nor a timer armed, nor (on the CPU, where the parent writes
        # the samples' values: no_processes) a process started, by anything in this process: the kernel refuses
        # (gate/worker/seccomp.py). One the load itself left behind, the
        # checks after this request find.
        if st.seccomp is None:
            st.seccomp = seccomp.install(processes=bool(req.get("no_processes")) and str(st.device).startswith("cpu"))
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
    st.rescaled = rescaled_parameters(st.data.meta) if st.data else set()
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
                    restart(st, role)
                    thunk()
        restart(st, role)
    _device_sync()
    out = {"trees_fallback": dict(st.trees_fallback)} if st.trees_fallback else {}
    if st.device == "cpu":  # where the parent writes a sample's values into the buffers itself (gate/refill.py)
        out["addresses"] = {role: [[x.data_ptr() if isinstance(x, torch.Tensor) else 0 for x in b] for b in st.bufs[role]]
                            for role in req["roles"]}
    return out


def _updated(st: State) -> list[int]:
    """The inputs the graph updates in place (graph.json's mutated_inputs)."""
    return sorted(updated_indices(st.data.meta)) if st.data else []


def restart(st: State, role: str) -> None:
    """Put the captured state back into the parameters the graph updates in place (one buffer for every set, so
    each call carries its state to the next: a KV cache and its position counter, running statistics, optimizer
    state), before untimed calls: the warm-ups here and before each sample (sample.op_warm), the graph captures.
    With the timed samples' calls capped at the program's own count (inputs.state_horizon) and each sample starting
    from the captured state (sample._set_content), no call runs from a state the program's own calls never reached.
    Their content is the same in every pool set and never perturbed: nothing a sample will read."""
    pool = st.pool.get(role)
    if not pool:
        return
    for i in st.shared & set(_updated(st)):
        x = st.bufs[role][0][i]
        if isinstance(x, torch.Tensor):
            _refill(x, pool[0][i])


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
                restart(st, role)
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


def op_pin(st: State, req: dict) -> dict:
    """Run on exactly these CPUs from now on: the parent gives the baseline's worker and the candidate's
    the same ones, so their paired samples share a core's load and caches (on a machine shared with
    other work, two processes left to the scheduler settle on differently loaded cores)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(int(c) for c in req["cpus"]))
        if st.state0 is not None:  # the parent's own change of the process's state
            st.state0["affinity"] = sorted(os.sched_getaffinity(0))
    return {}
