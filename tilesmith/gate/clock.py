"""The timing primitives the screens share: which device some arguments live on, a device-wide sync for
it, a timed loop of calls, and how many calls make one sample long enough to time.

Used by the gate worker's timed samples, the tuner's measure worker, the profile worker and the agent's
kernel bench. The gate worker imports it before any candidate code runs, and rejects a candidate that
rebinds anything here (gate.worker.patches watches this module). The clock and
the CUDA synchronisation are bound at import, like the gate's, so code loaded later that replaces
`time.perf_counter_ns` or `torch.cuda.synchronize` does not change what these loops measure.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import torch

_perf_ns = time.perf_counter_ns
_cuda_sync = torch._C._cuda_synchronize if hasattr(torch._C, "_cuda_synchronize") else None


def _nothing() -> None:
    return None


def device_of(args) -> str:
    """'cuda:N' for the first CUDA tensor among `args`, else 'cpu' (the device a graph call runs on)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return f"cuda:{a.device.index or 0}"
    return "cpu"


def device_sync(device: str) -> Callable[[], None]:
    """A function that waits for all work queued on `device` ('cpu': returns at once, CPU calls are
    synchronous). On CUDA it waits for every stream of the device, not just the current one."""
    d = torch.device(device)
    if d.type != "cuda":
        return _nothing
    index = d.index if d.index is not None else torch.cuda.current_device()
    if _cuda_sync is not None and index == torch.cuda.current_device():
        return _cuda_sync  # the current device: no device switch around each sync
    return functools.partial(torch.cuda.synchronize, index)


def timed(thunk: Callable[[], object], n: int, sync: Callable[[], None],
          after_call: Callable[[int, object], None] | None = None) -> int:
    """Nanoseconds for `n` back-to-back calls of `thunk`, `sync()` before the clock starts and before it stops.

    thunk: one call (e.g. `lambda: mod.call(list(args))`); its result is passed to `after_call`.
    n: calls in the timed window (at least 1).
    sync: waits for the device (`device_sync`); the one before the window keeps earlier work out of it.
    after_call: called as `after_call(i, result)` after call i, inside the window (its cost is timed too,
    so keep it to a few operations, e.g. a draw deciding which call's outputs to keep).
    The clock is read through a local bound before any call: code run by `thunk` that rebinds this module's
    clock and puts it back before anyone looks changes nothing here. (The gate worker writes its own window
    out, with its checks in its frame's locals: gate/worker/sample.py op_time.)"""
    perf = _perf_ns
    sync()
    t0 = perf()
    if after_call is None:
        for _ in range(n):
            thunk()
    else:
        for i in range(n):
            after_call(i, thunk())
    sync()
    return perf() - t0


# What the gate worker sends on its mark socket as a timed window opens and as it closes (gate/worker/sample.py op_time): the
# kernel's timestamps of the two are the parent's own measure of the window (gate/windows.py: the time the deciding process counts).
WINDOW_MARK = b"|"
# What it sends right after the closing mark where the parent stops it to read the outputs itself (gate/freeze.py):
# the layout of the outputs, in datagrams of at most LAYOUT_CHUNK bytes after their first byte: LAYOUT_PART, and
# LAYOUT_MARK on the last.
LAYOUT_MARK, LAYOUT_PART, LAYOUT_CHUNK = b"L", b"l", 16384
# A worker's first datagram on that socket, sent as it starts, before it loads anything: its pid, from the kernel.
HELLO_MARK = b"H"
# Where the parent writes a sample's input values itself (gate/refill.py): sent once the request is read and everything
# before the window is done; the worker then waits for VALUES_GO, which the parent queues after writing the values into
# the stopped worker, right before it lets it run (the sample's start).
ARMED_MARK, VALUES_GO = b"V", b"R"
MAX_GAP_NS = 50_000_000  # the program's host time between calls the gate spends per call, at most 50 ms


def spin(ns: int, perf: Callable[[], int] | None = None) -> None:
    """Busy-waits `ns` nanoseconds on the host, holding the GIL as the Python it stands for would (the gate's
    stand-in for the program's own host time between a graph's calls: capture/gaps.py). perf: the clock, as
    for `timed`."""
    perf = perf or _perf_ns
    end = perf() + ns
    while perf() < end:
        pass


def calls_per_sample(thunk: Callable[[], object], sync: Callable[[], None], sample_ms: float = 1.0,
                     most: int = 1000) -> int:
    """How many calls of `thunk` make one sample last about `sample_ms`, from one timed call (1..`most`):
    a sample that long makes the timer's resolution and the two syncs' cost negligible.

    thunk: one call, already warmed up (a first call that compiles would make this 1).
    sync: waits for the device (`device_sync`).
    sample_ms: the wanted length of one sample, in milliseconds.
    most: the cap on calls per sample (very fast calls would otherwise make a sample of thousands)."""
    ns = timed(thunk, 1, sync)
    return max(1, min(most, int(sample_ms * 1e6 / max(1, ns))))
