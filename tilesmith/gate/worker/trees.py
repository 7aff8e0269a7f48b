"""The gate worker's "trees" timing mode: the original of a graph compiled with reduce-overhead timed the
way the program runs it, through Inductor's cudagraph trees.

Graph mode times the original as a bare `CUDAGraph.replay()` with its inputs in place: cheaper than
what the program pays under reduce-overhead, where every call goes through the trees' Python (which node
to replay, its invariants, the outputs rebuilt from the graph's pool, inputs not marked static copied in).
A candidate that replays itself (tilesmith.cudagraph) runs in the program instead of the trees, so that is
what it must beat; against a bare replay it never can (benchmarks/RESULTS-history.md).

Where the capture recorded which inputs Inductor marked static (its static_input_idxs), every one of them
stays at one address in the gate's buffer sets, and no input is an earlier graph's output
(gate.inputs.trees_static), exactly those are static here and each call reads its own buffer set: the trees
copy the others in on every call, as the program's trees do (they copy, whatever its address, every input
neither marked static nor an earlier graph's output, which they read in place as their own memory). With no
copy at all the original was timed cheaper than the program runs it (on the H200, benchmarks/RESULTS-history.md: the MoE's
replay, 1.17-1.28x faster than reduce-overhead in the program, was rejected at 0.970-0.979x; 0.993x with
the copy). Otherwise every tensor input is marked static and every call reads the first buffer set,
refilled between samples (new values, same addresses): the trees copy no input and replay one node, their
cheapest path, cheaper than any program's. Either way the original is never timed slower than the program
runs it. Each call is a new step (torch.compiler.cudagraph_mark_step_begin), as each call of an inference
loop is.
"""

from __future__ import annotations

import inspect

import torch
from torch._inductor import compile_fx, config

from tilesmith.gate.worker.tensors import _as_list

# Bound when the worker starts (it imports this module on a CUDA device before any wrapper code runs): a
# candidate that later replaces these, or sets the trees' debugging switches, cannot slow the original
# through them. (The original timed apart, in a worker that never runs candidate code, bounds any such
# slowing beside the candidate anyway: the gate keeps the lower of the two speedups.)
_CUDAGRAPHIFY = compile_fx.cudagraphify
_MARK_STEP = torch.compiler.cudagraph_mark_step_begin
# Frees every tree this process set up: a worker sets up the trees again for each pass (and for more buffer
# sets), and the trees' manager keeps every function it was given, with its recorded graphs, for good.
try:
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees as _RESET
except ImportError:  # a torch without it: each setup's trees stay until the worker ends
    _RESET = None
# Switches that make every trees call slower (eager runs, synchronizes, per-call asserts): their values now.
_SWITCHES = {k: getattr(config.triton, k) for k in ("force_cudagraphs_warmup", "fast_path_cudagraph_asserts",
                                                   "force_cudagraph_sync", "cudagraph_capture_sizes",
                                                   "cudagraph_trees", "slow_path_cudagraph_asserts")
             if hasattr(config.triton, k)}


def tree_thunks(fn, bufsets: list, device: str, mutated, static: list | None = None, *,
                reset: bool = True) -> tuple[list, object]:
    """One thunk per rotating buffer set calling `fn` through the cudagraph trees, already warmed up and
    recorded, and the object that must stay alive while they are timed. Raises where the trees cannot be
    set up or their first calls fail (the caller then times a bare replay).

    static: the inputs Inductor marked static when it compiled the graph (gate.inputs.trees_static): only
    those are static here too and every thunk reads its own buffer set, so the trees copy the other inputs
    in on every call, as the program's trees do (they copy every input neither marked static nor their own
    earlier output, whatever its address). None: every input static and every thunk reads the first
    buffer set, refilled between samples, so no input is copied (the trees' cheapest path, cheaper than
    any program's). reset: free every earlier tree of this process first (their functions stay in the
    trees' manager otherwise)."""
    if mutated:
        # Inputs the graph updates in place: the program's trees would copy them back and forth (or skip
        # CUDA graphs); no cheapest path is known, so the caller times a bare replay instead.
        raise ValueError("the graph updates inputs in place")
    if reset:  # every tree of this process (the caller knows none is still in use)
        reset_trees()
    run = tree_function(fn, bufsets[0], device, static)
    mark = _MARK_STEP

    def thunk(bufs):
        def call():
            mark()
            return run(list(bufs))
        return call

    calls = [thunk(bufsets[0])] * len(bufsets) if static is None else [thunk(b) for b in bufsets]
    with torch.no_grad():
        for _ in range(2):  # warmed up, recorded, replayed: a failure here is the trees', before any timing
            for call in calls[:2]:
                call()
    return calls, run


def reset_trees() -> None:
    """Free every tree this process set up (a torch without the reset keeps them until the worker ends)."""
    if _RESET is not None:
        _RESET()


def tree_function(fn, bufs: list, device: str, static: list | None = None):
    """Inductor's own wrapping of a compiled call under reduce-overhead (compile_fx.cudagraphify), the
    inputs at `static` static (None: every tensor input), the trees' switches as they were when the worker
    started; only the keywords this torch's signature has are passed."""
    for k, v in _SWITCHES.items():
        setattr(config.triton, k, v)
    with torch.no_grad():
        n_out = len(_as_list(fn(list(bufs))))  # a plain call first: how many outputs (stack_traces has one each)
    if static is None:
        static = [i for i, x in enumerate(bufs) if isinstance(x, torch.Tensor)]
    kw = dict(device_index=torch.device(device).index or 0, stack_traces=[None] * n_out, is_backward=False,
              is_inference=True, constants=(), placeholders=(), mutated_input_idxs=())
    params = inspect.signature(_CUDAGRAPHIFY).parameters
    missing = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty and k not in kw]
    if missing:
        raise TypeError(f"compile_fx.cudagraphify wants {', '.join(missing)}, unknown here")
    return _CUDAGRAPHIFY(fn, static, **{k: v for k, v in kw.items() if k in params})
