"""How a pass's timed samples are sized, before the first one: calls per sample from the original's time alone,
rotating buffer sets so that no call of a sample reads what another read, and the CPUs both timed workers share."""

from __future__ import annotations

import statistics

from tilesmith.gate.timing import _sample


def solo_ns(worker, role: str, timeout_s: float, samples: int = 7, gap_ns: int = 0) -> float:
    """Median of `samples` single calls of `role`, alone (each after `gap_ns` of host time): sizes timed samples."""
    ns = []
    for i in range(samples):
        worker.request({"op": "warm", "role": role, "reps": 1, "start": i}, timeout_s=timeout_s)
        s, bad, _ = _sample(worker, {"op": "time", "role": role, "reps": 1, "start": i, "gap_ns": gap_ns}, timeout_s)
        if bad:
            raise RuntimeError(bad.message)
        ns.append(s.ns)
    return max(1000.0, float(statistics.median(ns)))


# Rotating buffer sets for timing: one per call of a sample where memory allows, up to this many and this
# many bytes of rotating inputs, never fewer than Policy.rotating_sets.
MOST_BUFFERS = 64
BUFFER_CAP_BYTES = 1 << 30


def sample_size(policy, per_call_ns: float, contents: list, shared: set, horizon: int | None = None) -> tuple[int, int]:
    """(calls per timed sample, rotating buffer sets). A sample takes about policy.target_sample_ms, but
    never has more calls than there are buffer sets: no call of a sample reads an address or values
    another call of it read. With more calls than buffers (a graph under 31 us per call, or inputs too
    big for 64 sets), a cache keyed on its inputs' addresses and first and last elements answered every
    later lap of a sample from memory, right on the checked calls, and was accepted at a speedup it
    never has in a program (tests/redteam.py). `shared`: inputs held in one buffer for every set
    (parameters), not counted against the memory cap. `horizon`: at most this many calls a sample, where a
    parameter updated in place carries state from call to call (inputs.state_horizon)."""
    import torch

    reps = max(1, min(100000, round(policy.target_sample_ms * 1e6 / per_call_ns), horizon or 100000))
    rotating = sum(x.untyped_storage().nbytes() for i, x in enumerate(contents[0][1])
                   if isinstance(x, torch.Tensor) and i not in shared)
    fit = BUFFER_CAP_BYTES // max(1, rotating)
    buffers = max(1, policy.rotating_sets, min(reps, MOST_BUFFERS, fit))
    return min(reps, buffers), buffers


def resize(policy, reps: int, buffers: int, per_call_ns: float, contents: list, shared: set,
           horizon: int | None = None) -> tuple[int, int, bool]:
    """(calls per sample, buffer sets, whether the buffers must be set up again) for a per-call time measured
    in the timing mode itself: more calls where the mode runs faster than the time the sizes came from, never
    fewer (the buffers are there already), never more calls than buffer sets."""
    want, need = sample_size(policy, per_call_ns, contents, shared, horizon)
    if want <= reps:
        return reps, buffers, False
    return want, max(buffers, need), need > buffers


def shared_cpus() -> list[int]:
    """The CPUs both timed workers are pinned to: as many as one worker's threads use (OMP_NUM_THREADS,
    else every CPU this process may use), the highest-numbered first (CPU 0 takes most interrupts).
    Empty where affinity cannot be set."""
    import os

    if not hasattr(os, "sched_getaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", "") or len(cpus))
    except ValueError:
        n = len(cpus)
    return cpus[-max(1, min(n, len(cpus))):]
