"""Baseline profile of one graph: time per kernel and library call inside one `call`, launch overhead,
and bytes/FLOPs where they can be derived. Measured in a worker subprocess; statistics here."""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import sandbox
from tilesmith.errors import TilesmithError
from tilesmith.gate.proc import calm_spares


@dataclass
class KernelTime:
    name: str  # wrapper global (triton_poi_fused_add_0, cpp_fused_relu_1) or library call (extern_kernels.mm)
    kind: str  # triton | template | cpp | extern | device (a library kernel seen only by the profiler)
    calls: int  # launches per graph call
    time_ms: float  # per graph call: device time on CUDA (profiler), CPU time on CPU
    share: float  # of the summed kernel time
    bytes: int = 0  # tensor bytes its arguments span (an upper bound on memory traffic)
    flops: int = 0  # for matmul-like library calls (2*M*N*K), else 0


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(**{**d, "kernels": [KernelTime(**k) for k in d.get("kernels", [])]})


def profile_graph(graph_dir: str | Path, source_text: str | None = None, *, timeout_s: float = 900,
                  calls: int = 20) -> Profile:
    """Profile the captured wrapper (or `source_text`, a rewrite of it) on the captured inputs."""
    gdir = Path(graph_dir)
    with tempfile.TemporaryDirectory(prefix="tilesmith-profile-") as tmp:
        src_file = Path(tmp) / "source.py"
        src_file.write_text(source_text if source_text is not None else (gdir / "wrapper.py").read_text())
        cmd = [sys.executable, "-m", "tilesmith.profile_worker", str(gdir), str(src_file), str(calls)]
        calm_spares()  # no gate worker may still be starting while this one measures
        res = sandbox.run_json(cmd, sandbox.Spec(scratch=tmp, readable=[str(gdir)]), timeout_s)
    if res.returncode is None:
        raise TilesmithError(f"profiling {gdir.name[:12]} took over {timeout_s:.0f} s", code="profile-timeout")
    if res.returncode != 0 or res.reply is None:
        raise TilesmithError(f"profiling {gdir.name[:12]} failed: {res.tail}", code="profile-failed",
                             hint="run `tilesmith replay` on the graph to check the workspace")
    return summarize(sandbox.redact_obj(res.reply))


def summarize(raw: dict) -> Profile:
    """Raw worker samples -> Profile (medians; shares of the summed kernel time)."""
    wall = [ns / 1e6 for ns in raw["wall_ns"]]
    wall_ms = statistics.median(wall)
    kernels = []
    for name, k in raw["kernels"].items():
        per_call_ms = statistics.median(k["ns"]) / 1e6 if k.get("ns") else k.get("total_ns", 0) / 1e6 / raw["profiled_calls"]
        kernels.append(KernelTime(name, k["kind"], int(k["calls"]), per_call_ms, 0.0, int(k.get("bytes", 0)), int(k.get("flops", 0))))
    total = sum(k.time_ms for k in kernels)
    for k in kernels:
        k.share = k.time_ms / total if total > 0 else 0.0
    kernels.sort(key=lambda k: k.time_ms, reverse=True)
    overhead = max(0.0, wall_ms - total)
    return Profile(raw["key"], raw["device"], wall_ms, total, overhead, overhead / wall_ms if wall_ms > 0 else 0.0,
                   kernels, wall)
