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
PROFILE_AFTER = (SKIP + 2, SKIP + 5, SKIP + 8)  # the gaps after these calls are profiled: none may hold GPU work
SYNCS = ("Synchronize", "cudaMemcpy")  # CUDA runtime calls that make the host wait for the GPU (cudaMemcpyAsync too)

_perf_ns = time.perf_counter_ns


class GapWatch:
    """Wraps each graph's outermost callable (after Inductor's post_compile: the trees' replay included) and
    records, per graph, the host time between its consecutive calls.

    Only the main thread's calls profile a gap (a profiler is started and stopped on one thread); a graph whose
    calls come from several threads or overlap has no usable gap. Never raises into the program."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last: tuple[str, int, int] | None = None  # (graph key, thread, when its last call ended)
        self._stats: dict[str, dict] = {}
        self._prof = None  # (key, profiler) while a gap is profiled (main thread only)
        # The waits an empty profiled window shows: our own sync before the stop, and whatever the runtime,
        # the driver and the profiler add around it (2 per window on the H200). None until measured.
        self._base_waits: int | None = None
        self._main = threading.main_thread().ident

    def wrap(self, key: str, device: str, fn):
        st = self._stats.setdefault(key, {"device": device, "calls": 0, "gaps": [], "interleaved": 0,
                                          "outside": [], "outside_error": "", "threads": set(), "in_flight": 0,
                                          "overlapped": 0})
        watch = self

        def call(args):
            watch._enter(key, st)
            try:
                return fn(args)
            finally:
                watch._exit(key, st)

        call.__name__ = getattr(fn, "__name__", "call")
        return call

    def _enter(self, key: str, st: dict) -> None:
        t, me = _perf_ns(), threading.get_ident()
        try:
            with self._lock:
                st["threads"].add(me)
                st["in_flight"] += 1
                if st["in_flight"] > 1:
                    st["overlapped"] += 1
                last, self._last = self._last, None
            if self._prof is not None and me == self._main:
                self._stop_profile(key)
                return  # the profiled gap is not a plain one
            if last is None or st["calls"] < SKIP:
                return
            if last[0] != key or last[1] != me:
                st["interleaved"] += 1
            elif len(st["gaps"]) < RECORD:
                st["gaps"].append(t - last[2])
        except Exception:  # noqa: BLE001 - never break the user's program over a measurement
            st["outside_error"] = st["outside_error"] or "the gap watch failed"

    def _exit(self, key: str, st: dict) -> None:
        try:
            with self._lock:
                st["in_flight"] -= 1
                st["calls"] += 1
            me = threading.get_ident()
            if (st["calls"] in PROFILE_AFTER and me == self._main and self._prof is None
                    and st["device"].startswith("cuda") and not st["interleaved"]):
                self._start_profile(key, st)
            self._last = (key, me, _perf_ns())
        except Exception:  # noqa: BLE001
            st["outside_error"] = st["outside_error"] or "the gap watch failed"

    def _start_profile(self, key: str, st: dict) -> None:
        try:
            import torch

            torch.cuda.synchronize()  # the graph's own work done: what the profile sees is queued after
            if self._base_waits is None:
                self._base_waits = _empty_window_waits(torch)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
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
            n, ns, waits = device_work(prof)
            base = self._base_waits or 0
            st["outside"].append({"kernels": n, "device_us": round(ns / 1e3, 2), "syncs": len(waits) - base,
                                  "waits": sorted(set(waits))[:6], "next_graph_same": next_key == key})
            if base < 1:  # an empty window showed not even our own sync: the runtime's calls are not seen
                st["outside_error"] = "the profiled gap does not show the CUDA runtime's calls"
        except Exception as e:  # noqa: BLE001
            st["outside_error"] = f"could not read the profiled gap: {e!r}"[:200]

    def close(self) -> None:
        """After the script (on the main thread): a profile still running is stopped."""
        if self._prof is not None:
            key, prof = self._prof
            self._prof = None
            try:
                prof.stop()
            except Exception:  # noqa: BLE001
                pass
            self._stats[key]["outside_error"] = "the program made no call after a profiled gap"

    def result(self, key: str, compiled: int = 1) -> dict | None:
        st = self._stats.get(key)
        return None if st is None else summarize(st, compiled)


def device_work(prof) -> tuple[int, int, list[str]]:
    """(device events, their nanoseconds, the names of the host's waiting calls) in a stopped torch profiler:
    kernels, copies and sets run on the device; a synchronize or a blocking copy makes the host wait for it."""
    from torch.autograd import DeviceType

    n = ns = 0
    waits = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CPU:
            n += 1
            ns += int(e.duration_ns())
        elif any(x in e.name() for x in SYNCS):
            waits.append(e.name())
    return n, ns, waits


def _empty_window_waits(torch) -> int:
    """The waits a profiled window with nothing in it shows (its closing sync as seen by the runtime and the
    driver, the profiler's own flush): subtracted from every profiled gap's count."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.start()
    torch.cuda.synchronize()
    prof.stop()
    return len(device_work(prof)[2])


def summarize(st: dict, compiled: int = 1) -> dict:
    """graph.json's program_gap: the measured gap, and whether the gate may spend it (`usable`, else `why`).
    `compiled`: how many times capture saw this graph's code compiled (the copies after the first are not
    watched, so their calls cannot count as other graphs between this one's)."""
    gaps = sorted(st["gaps"])
    outside = list(st["outside"])
    out = {"device": st["device"], "calls": st["calls"], "gaps": len(gaps), "interleaved": st["interleaved"],
           "profiled": outside, "threads": len(st["threads"])}
    if gaps:
        q = statistics.quantiles(gaps, n=4) if len(gaps) > 1 else [gaps[0]] * 3
        out.update(host_us=round(statistics.median(gaps) / 1e3, 2), q1_us=round(q[0] / 1e3, 2),
                   q3_us=round(q[2] / 1e3, 2))
    work = [o for o in outside if o["kernels"]]
    waits = [o for o in outside if o.get("syncs", 0) > 0]
    why = ""
    if not st["device"].startswith("cuda"):
        why = "a CPU graph: its calls are synchronous, the program's host time adds to every version alike"
    elif compiled > 1:
        why = f"its code was compiled {compiled} times (e.g. one block compiled per layer): other copies run between its calls"
    elif len(st["threads"]) > 1 or st["overlapped"]:
        why = "called from several threads: the time between calls is not one program's step"
    elif st["interleaved"]:
        why = f"other graphs ran between its calls ({st['interleaved']} times): the gap is not this graph's alone"
    elif len(gaps) < MIN_GAPS:
        why = (f"the program called it {st['calls']} times: the gap is measured after the first {SKIP}, "
               f"on {MIN_GAPS} or more calls")
    elif st["outside_error"]:
        why = st["outside_error"]
    elif len(outside) < len(PROFILE_AFTER):
        why = f"{len(outside)} of {len(PROFILE_AFTER)} gaps were profiled"
    elif work:
        why = (f"the program queues GPU work of its own between calls ({work[0]['kernels']} kernels or copies, "
               f"{work[0]['device_us']} us): the gate would credit host time the program's GPU does not wait")
    elif waits:
        why = ("the program waits for the GPU between calls (a synchronize, .item(), a copy to the host): its step "
               "is not pipelined, and the gap holds that wait")
    out["usable"] = not why
    if why:
        out["why"] = why
    return out
