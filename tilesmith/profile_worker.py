"""Worker for tilesmith.profile: runs wrapper code, reports raw nanoseconds as one JSON line.

CPU: each kernel and library call is wrapped in a timing proxy (the wrapper looks its kernels up as
module globals at call time). CUDA: torch.profiler's device time per kernel name.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from tilesmith import loading, source
from tilesmith.search.kernels import find_kernels


def _nbytes(args) -> int:
    seen, total = set(), 0
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel():
            sid = a.untyped_storage().data_ptr()
            if sid not in seen:
                seen.add(sid)
                total += a.untyped_storage().nbytes()
    return total


def _flops(name: str, args) -> int:
    t = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if name.endswith(("mm", "addmm")) and len(t) >= 2:
            a, b = (t[-2], t[-1]) if name.endswith("addmm") else (t[0], t[1])
            if a.dim() == 2 and b.dim() == 2:
                return 2 * a.shape[0] * a.shape[1] * b.shape[1]
        if name.endswith(("bmm", "baddbmm")) and len(t) >= 2:
            a, b = t[-2], t[-1]
            return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    except Exception:
        return 0
    return 0


class _Timed:
    """A callable (or .run-holder) that accumulates its own CPU time per graph call."""

    def __init__(self, fn, name, kind, stats):
        self._fn, self._name, self._stats = fn, name, stats
        stats.setdefault(name, {"kind": kind, "calls": 0, "cur": 0, "ns": [], "bytes": 0, "flops": 0})

    def __call__(self, *args, **kwargs):
        s = self._stats[self._name]
        t0 = time.perf_counter_ns()
        out = self._fn(*args, **kwargs)
        s["cur"] += time.perf_counter_ns() - t0
        s["calls_cur"] = s.get("calls_cur", 0) + 1
        if not s["bytes"]:
            s["bytes"] = _nbytes(args)
            s["flops"] = _flops(self._name, args)
        return out


class _ExternProxy:
    def __init__(self, inner, stats):
        self._inner, self._stats = inner, stats

    def __getattr__(self, attr):
        return _Timed(getattr(self._inner, attr), f"extern_kernels.{attr}", "extern", self._stats)


def main(gdir: str, src_file: str, calls: int) -> dict:
    data = loading.load_graph_data(gdir)
    text = open(src_file).read()
    mod = loading.load_module(text, data.constants)
    args = loading.clone_args(data.inputs)
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        for _ in range(3):  # warm-up: first Triton calls autotune and compile
            mod.call(list(args))
        sync()
        wall = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            mod.call(list(args))
            sync()
            wall.append(time.perf_counter_ns() - t0)
        wrapper = source.split_header(text)[1]
        kernels = _device_kernels(mod, wrapper, args, calls) if cuda else _cpu_kernels(mod, wrapper, args, calls)
    return {"key": data.meta["key"], "device": data.meta["device"], "wall_ns": wall, "kernels": kernels,
            "profiled_calls": calls}


def _cpu_kernels(mod, wrapper, args, calls) -> dict:
    stats: dict = {}
    for k in find_kernels(wrapper):
        if hasattr(mod, k.name):
            setattr(mod, k.name, _Timed(getattr(mod, k.name), k.name, k.kind, stats))
    if hasattr(mod, "extern_kernels"):
        mod.extern_kernels = _ExternProxy(mod.extern_kernels, stats)
    for _ in range(calls):
        for s in stats.values():
            s["cur"], s["calls_cur"] = 0, 0
        mod.call(list(args))
        for s in stats.values():
            if s.get("calls_cur"):
                s["ns"].append(s["cur"])
                s["calls"] = s["calls_cur"]
    return {n: {k: v for k, v in s.items() if k not in ("cur", "calls_cur")} for n, s in stats.items() if s["ns"]}


def _device_kernels(mod, wrapper, args, calls) -> dict:
    from torch.profiler import ProfilerActivity, profile

    names = {k.name: k.kind for k in find_kernels(wrapper)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            mod.call(list(args))
        torch.cuda.synchronize()
    out: dict = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if not t or e.count == 0:
            continue
        kind = names.get(e.key, "device")
        out[e.key] = {"kind": kind, "calls": max(1, round(e.count / calls)), "total_ns": t * 1000.0}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
