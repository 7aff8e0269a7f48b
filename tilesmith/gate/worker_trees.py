"""The gate worker's "trees" timing mode: the original of a graph compiled with reduce-overhead timed the
way the program runs it, through Inductor's cudagraph trees.

Graph mode times the original as a bare `CUDAGraph.replay()` with its inputs in place: cheaper than
what the program pays under reduce-overhead, where every call goes through the trees' Python (which node
to replay, its invariants, the outputs rebuilt from the graph's pool, inputs not marked static copied in).
A candidate that replays itself (tilesmith.cudagraph) runs in the program instead of the trees, so that is
what it must beat; against a bare replay it never can (benchmarks/RESULTS.md, session 8).

Here every tensor input is marked static and every call reads the first buffer set, refilled between
samples (new values, same addresses): the trees copy no input and replay one node, their cheapest path.
The program's trees can only do more (copy the inputs Inductor does not mark static), so the original is
never timed slower than the program runs it. Each call is a new step (torch.compiler.cudagraph_mark_step_begin),
as each call of an inference loop is.
"""

from __future__ import annotations

import inspect

import torch

from tilesmith.gate.worker_tensors import _as_list


def tree_thunks(fn, bufs: list, device: str, n: int, mutated) -> tuple[list, object]:
    """n thunks (one per rotating buffer set; all read `bufs`) calling `fn` through the cudagraph trees,
    and the object that must stay alive while they are timed. Raises where the trees cannot be set up."""
    if mutated:
        # Inputs the graph updates in place: the program's trees would copy them back and forth (or skip
        # CUDA graphs); no cheapest path is known, so the caller times a bare replay instead.
        raise ValueError("the graph updates inputs in place")
    run = tree_function(fn, bufs, device)
    mark = torch.compiler.cudagraph_mark_step_begin

    def call():
        mark()
        return run(list(bufs))

    return [call] * n, run


def tree_function(fn, bufs: list, device: str):
    """Inductor's own wrapping of a compiled call under reduce-overhead (compile_fx.cudagraphify), every
    tensor input static; only the keywords this torch's signature has are passed."""
    from torch._inductor import compile_fx

    with torch.no_grad():
        n_out = len(_as_list(fn(list(bufs))))  # a plain call first: how many outputs (stack_traces has one each)
    static = [i for i, x in enumerate(bufs) if isinstance(x, torch.Tensor)]
    kw = dict(device_index=torch.device(device).index or 0, stack_traces=[None] * n_out, is_backward=False,
              is_inference=True, constants=(), placeholders=(), mutated_input_idxs=())
    params = inspect.signature(compile_fx.cudagraphify).parameters
    missing = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and p.default is p.empty and k not in kw]
    if missing:
        raise TypeError(f"compile_fx.cudagraphify wants {', '.join(missing)}, unknown here")
    return compile_fx.cudagraphify(fn, static, **{k: v for k, v in kw.items() if k in params})
