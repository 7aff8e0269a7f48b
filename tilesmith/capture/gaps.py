"""The program's own host time between a graph's calls, measured at capture (graph.json "program_gap").

On a GPU a graph's call only queues work: the program's step lasts as long as the longer of the GPU's
work and the host's, and the host's is the call's own path (launches, a replay, the trees' Python) plus
what the program does between calls (dynamo's guards, the module's wrappers, the user's own Python).
Timed back to back, a graph's calls show only the first: on the H200 the MoE's whole-call replay tied
Inductor's trees in the gate (0.97-0.99x) and ran 1.17-1.28x faster in the program, whose step was
host-bound. The gate spends this gap between calls for both roles (gate.timed), so it times what the
program runs, where that can be told:

- the gap is the median host time from the end of one of the graph's calls to the start of its next,
  after its first SKIP calls (compiles, autotuning, the trees' warm-up and recording);
- only where nothing else the capture saw ran in between (no other graph: a training step's forward and
  backward, a graph break's halves), and
- only where the program queued no GPU work of its own between two calls (one gap is profiled): such work
  would keep the GPU busy in the program and not in the gate, which would then credit host time the
  program never spends waiting.

CPU graphs get none: their calls are synchronous, so the gap adds to both roles' steps alike and can only
dilute a ratio.
"""

from __future__ import annotations

import statistics
import threading
import time

SKIP = 5  # a graph's first calls compile, autotune, warm up and record the trees: not the steady state
RECORD = 64  # gaps kept per graph
MIN_GAPS = 8  # fewer, and the median says too little
PROFILE_AFTER = SKIP + 2  # the gap after this call is profiled for GPU work the program queued between calls

_perf_ns = time.perf_counter_ns


class GapWatch:
    """Wraps each graph's outermost callable (after Inductor's post_compile: the trees' replay included) and
    records, per graph, the host time between its consecutive calls."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: tuple[str, int] | None = None  # (graph key, when its last call ended)
        self._stats: dict[str, dict] = {}
        self._prof = None  # (key, profiler) while one gap is profiled

    def wrap(self, key: str, device: str, fn):
        st = self._stats.setdefault(key, {"device": device, "calls": 0, "gaps": [], "interleaved": 0,
                                          "outside": None, "outside_error": ""})
        watch = self

        def call(args):
            watch._enter(key, _perf_ns())
            try:
                return fn(args)
            finally:
                watch._exit(key, st)

        call.__name__ = getattr(fn, "__name__", "call")
        call._tilesmith_gap_of = fn  # type: ignore[attr-defined]
        return call

    def _enter(self, key: str, t: int) -> None:
        if self._prof is not None:
            self._stop_profile(key)
            self._last = None  # the profiled gap is not a plain one
            return
        last, self._last = self._last, None
        st = self._stats.get(key)
        if last is None or st is None or st["calls"] < SKIP:
            return
        if last[0] != key:
            st["interleaved"] += 1
        elif len(st["gaps"]) < RECORD:
            st["gaps"].append(t - last[1])

    def _exit(self, key: str, st: dict) -> None:
        st["calls"] += 1
        if st["calls"] == PROFILE_AFTER and st["device"].startswith("cuda") and st["outside"] is None:
            self._start_profile(key, st)
        self._last = (key, _perf_ns())

    def _start_profile(self, key: str, st: dict) -> None:
        try:
            import torch

            torch.cuda.synchronize()  # the graph's own work done: what the profile sees is queued after
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.start()
            self._prof = (key, prof)
        except Exception as e:  # noqa: BLE001 - a profiler already running, none built in: the gap stays unused
            st["outside_error"] = f"could not profile a gap: {e!r}"[:200]

    def _stop_profile(self, next_key: str) -> None:
        key, prof = self._prof
        self._prof = None
        st = self._stats[key]
        try:
            import torch

            torch.cuda.synchronize()  # work queued in the gap has run before the profile stops
            prof.stop()
            n, ns = device_work(prof)
            st["outside"] = {"kernels": n, "device_us": round(ns / 1e3, 2), "next_graph_same": next_key == key}
        except Exception as e:  # noqa: BLE001
            st["outside_error"] = f"could not read the profiled gap: {e!r}"[:200]

    def close(self) -> None:
        if self._prof is not None:
            key, prof = self._prof
            self._prof = None
            try:
                prof.stop()
            except Exception:  # noqa: BLE001
                pass
            self._stats[key]["outside_error"] = "the program made no call after the profiled gap"

    def result(self, key: str) -> dict | None:
        st = self._stats.get(key)
        return None if st is None else summarize(st)


def device_work(prof) -> tuple[int, int]:
    """(events, nanoseconds) of device activity (kernels, copies, sets) in a stopped torch profiler."""
    from torch.autograd import DeviceType

    n = ns = 0
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CPU:
            n += 1
            ns += int(e.duration_ns())
    return n, ns


def summarize(st: dict) -> dict:
    """graph.json's program_gap: the measured gap, and whether the gate may spend it (`usable`, else `why`)."""
    gaps = sorted(st["gaps"])
    out = {"device": st["device"], "calls": st["calls"], "gaps": len(gaps), "interleaved": st["interleaved"],
           "outside": st["outside"]}
    if gaps:
        q = statistics.quantiles(gaps, n=4) if len(gaps) > 1 else [gaps[0]] * 3
        out.update(host_us=round(statistics.median(gaps) / 1e3, 2), q1_us=round(q[0] / 1e3, 2),
                   q3_us=round(q[2] / 1e3, 2))
    why = ""
    if not st["device"].startswith("cuda"):
        why = "a CPU graph: its calls are synchronous, the program's host time adds to every version alike"
    elif st["interleaved"]:
        why = f"other graphs ran between its calls ({st['interleaved']} times): the gap is not this graph's alone"
    elif len(gaps) < MIN_GAPS:
        why = f"the program called it {st['calls']} times: the gap is measured after the first {SKIP}, on {MIN_GAPS} or more"
    elif st["outside"] is None:
        why = st["outside_error"] or "the gap was not profiled"
    elif st["outside"]["kernels"]:
        why = (f"the program queues GPU work of its own between calls ({st['outside']['kernels']} kernels or copies, "
               f"{st['outside']['device_us']} us): the gate would credit host time the program's GPU does not wait")
    out["usable"] = not why
    if why:
        out["why"] = why
    return out
