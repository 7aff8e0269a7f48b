"""Baseline profile of a graph: time per kernel and library call inside one `call`, launch overhead,
device gaps between kernels (CUDA), bytes/FLOPs per kernel from its real arguments, achieved GB/s and
TFLOP/s against the device's ceilings and a roofline class per kernel and per graph
(tilesmith/profile/roofline.py). Measured in a worker subprocess; statistics here."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import paths
from tilesmith.launch import sandbox
from tilesmith.launch.secrets import redact, redact_obj
from tilesmith.errors import TilesmithError
from tilesmith.gate import procfs
from tilesmith.gate.spares import calm_spares
from tilesmith.workspace import graph_devices

BUSY_SHARE = 0.25  # a profile whose run saw some task wait for a CPU this share of the time or more: flagged


@dataclass
class KernelTime:
    name: str  # wrapper global (triton_poi_fused_add_0, cpp_fused_relu_1) or library call (extern_kernels.mm)
    kind: str  # triton | template | cpp | extern | device (a library kernel seen only by the profiler)
    calls: int  # launches per graph call
    time_ms: float  # per graph call: device time on CUDA (profiler), CPU time on CPU
    share: float  # of the summed kernel time
    bytes: int = 0  # per graph call: bytes its tensor arguments span (an upper bound on memory traffic)
    flops: int = 0  # per graph call: matmul-like calls and templates (2*M*N*K), else 0
    dtype: str = ""  # float dtype of its largest argument (bf16 | fp16 | fp32), picks the FLOP ceiling
    gbps: float | None = None  # achieved GB/s (bytes / time)
    tflops: float | None = None  # achieved TFLOP/s
    bw_frac: float | None = None  # of the bandwidth ceiling
    flop_frac: float | None = None  # of the FLOP ceiling for its dtype
    bound_ms: float | None = None  # roofline time: max(bytes / bandwidth, flops / FLOP rate)
    headroom_ms: float | None = None  # time_ms - bound_ms: what a kernel at the ceiling would save
    klass: str = "unknown"  # latency | memory | compute | unknown (tilesmith/profile/roofline.py)
    sites: dict = field(default_factory=dict)  # wrapper file line -> the code there that launches it
    library_kernels: list = field(default_factory=list)  # device kernels a library call ran (CUDA)


@dataclass
class Profile:
    key: str
    device: str
    wall_ms: float  # median wall time of one call, back to back, synchronised
    kernel_ms: float  # sum of kernel times in one call
    launch_overhead_ms: float  # wall_ms - kernel_ms, floored at 0: Python, allocation, launch costs
    launch_overhead_share: float
    kernels: list[KernelTime] = field(default_factory=list)
    wall_samples_ms: list[float] = field(default_factory=list)
    gap_ms: float | None = None  # device idle between consecutive kernels per call (CUDA), else None
    klass: str = "unknown"  # launch | latency | memory | compute | unknown
    headroom_ms: float = 0.0  # summed kernel headroom (roofline), per call
    ceilings: dict = field(default_factory=dict)  # roofline.Ceilings.to_dict(): measured or datasheet
    counters: str = ""  # whether hardware counters (ncu) were readable, said plainly
    phases_s: dict = field(default_factory=dict)  # the worker's seconds per phase (load, warm_up, wall, ...)
    # Of the worker's whole run, the share some task on the machine waited for a CPU (/proc/pressure/cpu; None where
    # the kernel keeps no such count). At BUSY_SHARE or more the times may be another program's: a decoder step's
    # 4 ms call was profiled at 140 ms beside a test suite, its samples on the scheduler's 4 ms ticks.
    busy_share: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(**{**d, "kernels": [KernelTime(**k) for k in d.get("kernels", [])]})


def profile_graph(graph_dir: str | Path, source_text: str | None = None, *, timeout_s: float = 900,
                  calls: int = 20) -> Profile:
    """Profile the captured wrapper (or `source_text`, a rewrite of it) on the captured inputs."""
    (res,) = _profile([(graph_dir, source_text)], timeout_s, calls)
    if isinstance(res, TilesmithError):
        raise res
    return res


def profile_graphs(graph_dirs: list, *, timeout_s: float = 900, calls: int = 20) -> list:
    """Profile several captured graphs in one worker process, one after another (one interpreter start
    and one measurement of the device's ceilings for all: on a GPU the start alone is ~12 s per process).
    Per graph, in order: its Profile, or the TilesmithError that says why it could not be profiled.
    `timeout_s` is per graph."""
    return _profile([(d, None) for d in graph_dirs], timeout_s * max(1, len(graph_dirs)), calls) if graph_dirs else []


def _profile(jobs: list, timeout_s: float, calls: int) -> list:
    gdirs = [paths.absolute(d) for d, _ in jobs]
    hint = "run `tilesmith replay` on the graph to check the workspace"
    with tempfile.TemporaryDirectory(prefix="tilesmith-profile-") as tmp:
        listing = []
        for i, (gdir, (_, text)) in enumerate(zip(gdirs, jobs)):
            src_file = Path(tmp) / f"source_{i}.py"
            src_file.write_text(text if text is not None else (gdir / "wrapper.py").read_text())
            listing.append([str(gdir), str(src_file)])
        (Path(tmp) / "jobs.json").write_text(json.dumps(listing))
        cmd = [sys.executable, "-m", "tilesmith.profile.worker", "--batch", str(Path(tmp) / "jobs.json"), str(calls)]
        calm_spares()  # no gate worker may still be starting while this one measures
        devices = graph_devices(gdirs)
        spec = sandbox.Spec.for_graphs(tmp, devices, readable=[str(g) for g in gdirs])
        called, stalled = time.time(), procfs.cpu_pressure_us()
        res = sandbox.run_json(cmd, spec, timeout_s)
        ended, stalled_after = time.time(), procfs.cpu_pressure_us()
    busy = (round(min(1.0, (stalled_after - stalled) / 1e6 / max(ended - called, 1e-3)), 3)
            if stalled is not None and stalled_after is not None else None)
    names = ", ".join(g.name[:12] for g in gdirs)
    if res.returncode is None:
        return [TilesmithError(f"profiling {names} took over {timeout_s:.0f} s", code="profile-timeout")] * len(jobs)
    results = res.reply.get("results") if res.reply else None
    if res.returncode != 0 or not isinstance(results, list) or len(results) != len(jobs):
        return [TilesmithError(f"profiling {names} failed: {res.tail}", code="profile-failed", hint=hint)] * len(jobs)
    process = _process_phases(res.reply.get("stamps"), called, res.spawned, ended)
    out = []
    for gdir, r in zip(gdirs, results):
        if isinstance(r, dict) and "error" in r:  # this graph failed in the worker; the others ran
            out.append(TilesmithError(f"profiling {gdir.name[:12]} failed: {redact(str(r['error']))}",
                                      code="profile-failed", hint=hint))
        else:
            p = summarize(redact_obj(r))
            p.phases_s.update(process)
            p.busy_share = busy
            out.append(p)
    return out


def _process_phases(stamps, called: float, spawned: float, ended: float) -> dict:
    """The worker process's own seconds around the graphs (shared by every graph of the batch): this
    process's before the spawn (the sandbox's probe, the worker's environment), from the spawn until the
    worker module runs (sandbox, fork or exec, the tilesmith package's imports), the module's own imports
    (torch's where it was not forked), and from its reply to its exit as this process saw it."""
    try:
        started, entered, replied = (float(stamps[k]) for k in ("started", "entered", "replied"))
    except (TypeError, KeyError, ValueError):
        return {}
    return {"before_spawn": round(spawned - called, 3), "process_start": round(started - spawned, 3),
            "process_imports": round(entered - started, 3), "process_exit": round(ended - replied, 3)}


def summarize(raw: dict) -> Profile:
    """Raw worker samples -> Profile (medians; shares of the summed kernel time; roofline per kernel)."""
    from tilesmith.profile import roofline

    wall = [ns / 1e6 for ns in raw["wall_ns"]]
    wall_ms = statistics.median(wall)
    ceil = raw.get("ceilings") or None
    kernels = []
    for name, k in raw["kernels"].items():
        per_call_ms = statistics.median(k["ns"]) / 1e6 if k.get("ns") else k.get("total_ns", 0) / 1e6 / raw["profiled_calls"]
        kt = KernelTime(name, k["kind"], int(k["calls"]), per_call_ms, 0.0, int(k.get("bytes", 0)),
                        int(k.get("flops", 0)), str(k.get("dtype", "")), sites=dict(k.get("sites") or {}),
                        library_kernels=list(k.get("library_kernels") or []))
        r = roofline.classify(kt.time_ms, kt.bytes, kt.flops, kt.dtype or "fp32", ceil, str(raw["device"]))
        kt.gbps, kt.tflops, kt.bw_frac, kt.flop_frac = r.gbps, r.tflops, r.bw_frac, r.flop_frac
        kt.bound_ms, kt.headroom_ms, kt.klass = r.bound_ms, r.headroom_ms, r.klass
        kernels.append(kt)
    total = sum(k.time_ms for k in kernels)
    for k in kernels:
        k.share = k.time_ms / total if total > 0 else 0.0
    kernels.sort(key=lambda k: k.time_ms, reverse=True)
    overhead = max(0.0, wall_ms - total)
    share = overhead / wall_ms if wall_ms > 0 else 0.0
    gap = raw.get("gap_ns")
    return Profile(raw["key"], raw["device"], wall_ms, total, overhead, share, kernels, wall,
                   gap_ms=gap / 1e6 if gap is not None else None, klass=roofline.graph_class(share, kernels),
                   headroom_ms=sum(k.headroom_ms or 0.0 for k in kernels), ceilings=dict(ceil or {}),
                   counters=str(raw.get("counters") or ""), phases_s=dict(raw.get("phases_s") or {}))
