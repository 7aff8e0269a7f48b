"""Run independent chains of a wrapper side by side on CUDA streams, joined before return.

A candidate may not create streams or events (the static screen bans them: a cheat could hide work on
a stream the timer does not wait for). This vetted helper gives it the overlap without that power:

    from tilesmith.streams import side_by_side

    def _router(x, w):                       # e.g. the MoE's router + top-k
        ...
        return topk_vals, topk_idx
    def _experts(x, w1, w2):                  # the expert FFN, independent of the router
        ...
        return h
    (vals, idx), h = side_by_side((_router, (x, w)), (_experts, (x, w1, w2)))

The first chain runs on the caller's current stream; each further chain on its own side stream owned
by this module. The side streams first wait for everything the caller queued before (their inputs are
ready), and the caller's stream waits for every side stream before `side_by_side` returns, so work
queued after it sees every result: nothing is left running on another stream, and a timer that
synchronizes the caller's stream (or the device) measures all of it. Memory: every tensor passed as a
chain's input is marked used by that chain's stream (`record_stream`), so the caching allocator does
not hand its memory to new work while the side stream may still read it, even if the caller frees it
early; every tensor a side chain returns is marked used by the caller's stream. Pass every tensor a
chain reads as one of its inputs: tensors a chain reaches through a closure are not protected.

Launch streams: library calls (`extern_kernels.mm`, aten ops) run on the current stream, which inside a
side chain is the side stream. Inductor's Triton launches name their stream explicitly (`stream=stream0`,
read once at the top of `call`); inside a chain read it again, `stream1 = get_raw_stream(0)`, and launch
on that, or the chain's Triton kernels still run on the caller's stream (correct, but no overlap).

The same order holds under CUDA-graph capture (Inductor's cudagraph trees, `tilesmith.cudagraph`):
the fork and join become edges of the captured graph. On CPU, or when no input is a CUDA tensor, the
chains run one after another on the calling thread, with the same results.
"""

from __future__ import annotations

import threading

import torch

_streams: dict[int, list] = {}  # device index -> side streams, created once and reused
_lock = threading.Lock()


def side_by_side(*chains):
    """Run each (fn, inputs) chain as fn(*inputs); chains after the first on side streams. Returns the
    list of results, in order, after the caller's stream has joined every side stream."""
    for c in chains:
        if not (isinstance(c, tuple) and len(c) == 2 and callable(c[0])):
            raise TypeError("side_by_side takes (fn, inputs) pairs")
    device = _cuda_device([t for _, ins in chains for t in _tensors(ins)])
    if device is None or len(chains) < 2:
        return [fn(*ins) for fn, ins in chains]
    caller = torch.cuda.current_stream(device)
    side = _side_streams(device, len(chains) - 1)
    results = [None] * len(chains)
    for s, (i, (fn, ins)) in zip(side, enumerate(chains[1:], start=1)):
        s.wait_stream(caller)  # fork: the chain's inputs were produced on the caller's stream
        for t in _tensors(ins):
            t.record_stream(s)
        with torch.cuda.stream(s):
            results[i] = fn(*ins)
    fn, ins = chains[0]
    results[0] = fn(*ins)  # on the caller's stream, overlapping the side chains
    for s, r in zip(side, results[1:]):
        caller.wait_stream(s)  # join
        for t in _tensors(r):
            if t.is_cuda:
                t.record_stream(caller)
    return results


def _tensors(obj):
    """Tensors in an argument or result (nested tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _cuda_device(tensors) -> int | None:
    """The one CUDA device of the inputs; None (run plainly) when there is none or more than one."""
    devs = {t.device.index or 0 for t in tensors if t.is_cuda}
    if len(devs) != 1 or any(not t.is_cuda for t in tensors):
        return None
    return devs.pop()


def _side_streams(device: int, n: int) -> list:
    with _lock:
        pool = _streams.setdefault(device, [])
        while len(pool) < n:
            pool.append(torch.cuda.Stream(device=device))
        return pool[:n]
