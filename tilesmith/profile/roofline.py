"""Ceilings of the device (memory bandwidth, FLOP rates) and the roofline class of a kernel.

Ceilings are measured in the profile worker where possible (a large device copy, a large matmul per
dtype); where measuring fails they come from the chip's datasheet, and `source` says which. Classes:
  latency  the kernel is too short to approach either ceiling (its time is launch and tail latency:
           fusing it away helps, tuning it does not);
  memory   its arithmetic intensity (FLOPs per byte) is below the ridge point: bandwidth bounds it;
  compute  above the ridge point: the FLOP rate bounds it;
  unknown  neither bytes nor FLOPs are known.
A graph is `launch`-bound when more than half its wall time is outside kernels (Python, allocation,
launches), else the class that holds most of its kernel time.

The bandwidth ceiling is the device memory's (a copy far larger than the last-level cache): a kernel
whose working set stays in cache (H200: 50 MB of L2) can exceed it, which reads as over 100 % and no
headroom. Ceilings measured on a loaded machine (other processes on the cores or the GPU) are low.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field

LATENCY_MS = {"cuda": 0.008, "cpu": 0.02}  # below this a kernel is latency-bound unless near a ceiling
NEAR_CEILING = 0.5  # ... where "near" is this fraction of a ceiling

# Datasheet peaks (dense; NVIDIA's sheets list Tensor Core rates with 2:4 sparsity, halved here).
# name substring -> (GB/s, {dtype: TFLOP/s}, source)
DATASHEET = {
    "H200": (4800.0, {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 67.0},
             "NVIDIA H200 Tensor Core GPU datasheet (SXM: 4.8 TB/s HBM3e; BF16 1,979 TFLOPS with sparsity)"),
    "H100": (3350.0, {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 67.0},
             "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s; BF16 1,979 TFLOPS with sparsity)"),
    "A100": (2039.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
             "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM: 2,039 GB/s; BF16 312 TFLOPS dense)"),
}


@dataclass
class Ceilings:
    device: str  # cpu | cuda
    name: str  # the GPU's name, or the CPU's thread count
    bandwidth_gbps: float | None
    tflops: dict = field(default_factory=dict)  # dtype (bf16, fp16, fp32) -> TFLOP/s
    source: str = ""  # measured (how) or datasheet (which)

    def to_dict(self) -> dict:
        return asdict(self)


def measure(device: str) -> Ceilings:
    """Measure the ceilings on `device` ('cpu' or 'cuda[:i]'); datasheet values where that fails."""
    import torch

    cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name(device) if cuda else f"{torch.get_num_threads()} threads"
    try:
        c = _measure(torch, torch.device(device), cuda)
        c.name = name
        return c
    except Exception as e:  # out of memory next to a big graph, a restricted device: the datasheet
        for key, (bw, fl, src) in DATASHEET.items():
            if cuda and key in name:
                return Ceilings("cuda", name, bw, dict(fl), f"datasheet: {src} (measuring failed: {type(e).__name__})")
        return Ceilings("cuda" if cuda else "cpu", name, None, {}, f"unknown (measuring failed: {e!r})"[:200])


def _measure(torch, dev, cuda: bool) -> Ceilings:
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def best_s(fn, reps: int) -> float:
        fn()
        sync()
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t0)
        return min(out)

    n = (512 << 20) if cuda else (64 << 20)  # bytes copied: far beyond the last-level cache
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * n / best_s(lambda: dst.copy_(src), 5) / 1e9  # read + write
    src = dst = None  # free the copy buffers before the matmuls
    tflops = {}
    m = 8192 if cuda else 1024
    for key, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        if not cuda and key != "fp32":
            continue
        a = torch.randn(m, m, device=dev).to(dt)
        tflops[key] = 2 * m**3 / best_s(lambda: a @ a, 3 if cuda else 5) / 1e12
    how = (f"measured: {n >> 20} MiB device copy, {m}^3 matmuls per dtype (TF32 "
           f"{'on' if cuda and torch.backends.cuda.matmul.allow_tf32 else 'off'})")
    return Ceilings("cuda" if cuda else "cpu", "", bw, tflops, how)


@dataclass
class Roofline:
    gbps: float | None  # achieved: bytes / time
    tflops: float | None  # achieved: flops / time
    bw_frac: float | None  # of the bandwidth ceiling
    flop_frac: float | None  # of the FLOP ceiling for the kernel's dtype
    bound_ms: float | None  # the roofline time: max(bytes / bandwidth, flops / FLOP rate)
    headroom_ms: float | None  # time - bound_ms (>= 0): what a perfect kernel could save
    klass: str  # latency | memory | compute | unknown


def classify(time_ms: float, nbytes: int, flops: int, dtype: str, ceil: dict | None, device: str) -> Roofline:
    """The roofline numbers of one kernel (per graph call); `ceil` is Ceilings.to_dict() or None."""
    if time_ms <= 0 or (not nbytes and not flops):
        return Roofline(None, None, None, None, None, None, "unknown")
    s = time_ms / 1e3
    gbps = nbytes / s / 1e9 if nbytes else None
    tflops = flops / s / 1e12 if flops else None
    bw = (ceil or {}).get("bandwidth_gbps")
    peaks = (ceil or {}).get("tflops") or {}
    peak = peaks.get(dtype) or peaks.get("fp32")
    bw_frac = gbps / bw if gbps and bw else None
    flop_frac = tflops / peak if tflops and peak else None
    parts = [nbytes / (bw * 1e9) * 1e3 if nbytes and bw else 0.0, flops / (peak * 1e12) * 1e3 if flops and peak else 0.0]
    bound = max(parts) if any(parts) else None
    near = max(bw_frac or 0.0, flop_frac or 0.0) >= NEAR_CEILING
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if time_ms < LATENCY_MS[kind] and not near:
        klass = "latency"
    elif flops and bw and peak and flops / max(nbytes, 1) > peak * 1e12 / (bw * 1e9):
        klass = "compute"
    elif nbytes:
        klass = "memory"
    else:
        klass = "compute" if flops else "unknown"
    return Roofline(gbps, tflops, bw_frac, flop_frac, bound, max(0.0, time_ms - bound) if bound else None, klass)


def graph_class(launch_overhead_share: float, kernels) -> str:
    """launch when over half the wall time is outside kernels; else the class with most kernel time."""
    if launch_overhead_share > 0.5:
        return "launch"
    by: dict = {}
    for k in kernels:
        by[k.klass] = by.get(k.klass, 0.0) + k.time_ms
    return max(by, key=by.get) if by else "unknown"


def counters_note(cuda: bool) -> str:
    """Whether hardware counters (Nsight Compute) could be read here, said plainly."""
    if not cuda:
        return "CPU: no hardware counters read; bytes come from each kernel's arguments, FLOPs from matmul shapes"
    if shutil.which("ncu") is None:
        return ("ncu (Nsight Compute) is not on PATH: no hardware counters; bytes come from each kernel's "
                "arguments (an upper bound on its traffic), FLOPs from matmul shapes")
    restricted = ""
    try:
        with open("/proc/driver/nvidia/params") as f:
            restricted = "RmProfilingAdminOnly: 1" in f.read()
    except OSError:
        pass
    if restricted and os.geteuid() != 0:
        return ("ncu is installed but GPU performance counters are restricted to administrators "
                "(RmProfilingAdminOnly=1): no hardware counters; bytes and FLOPs come from kernel arguments")
    return ("ncu is installed and counters look readable; this profile does not run it (it replays every "
            "kernel many times): `ncu --set roofline python -m tilesmith.profile.worker GRAPH_DIR SOURCE 1` "
            "gives measured DRAM bytes and FLOPs; bytes here come from kernel arguments")
