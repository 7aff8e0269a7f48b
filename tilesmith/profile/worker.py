"""Worker for tilesmith/profile/baseline.py: runs wrapper code, reports raw nanoseconds as one JSON line.

CPU: each kernel and library call is timed through a proxy (proxy.py: the wrapper looks its kernels up as
module globals at call time). CUDA: torch.profiler's device time per kernel name.
"""

from __future__ import annotations

import json
import sys
import time

_STARTED = time.time()  # the module's first line (the package, and torch with it, imported before it)

import torch  # noqa: E402

from tilesmith import source  # noqa: E402
from tilesmith.capture import loading  # noqa: E402
from tilesmith.gate import clock  # noqa: E402
from tilesmith.profile import proxy  # noqa: E402


def _nbytes(args) -> int:
    """Bytes the tensor arguments span (each view's extent, a storage counted once per extent): an
    upper bound on the kernel's memory traffic that does not count unused parts of pooled buffers."""
    seen, total = set(), 0
    for a in args:
        if isinstance(a, torch.Tensor) and a.numel():
            extent = 1 + sum((n - 1) * abs(st) for n, st in zip(a.shape, a.stride()))
            key = (a.data_ptr(), extent)
            if key not in seen:
                seen.add(key)
                total += extent * a.element_size()
    return total


def _flops(name: str, args) -> int:
    """2*M*N*K for matmul-like calls: library mm/addmm/bmm/baddbmm and Inductor's mm templates."""
    t = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if name.startswith("triton_tem_") and "mm" in name:
            return _template_flops(t)
        if name.endswith(("mm", "addmm")) and not name.endswith(("bmm", "baddbmm")) and len(t) >= 2:
            a, b = (t[-2], t[-1]) if name.endswith("addmm") else (t[0], t[1])
            if a.dim() == 2 and b.dim() == 2:
                return 2 * a.shape[0] * a.shape[1] * b.shape[1]
        if name.endswith(("bmm", "baddbmm")) and len(t) >= 2:
            a, b = (t[-2], t[-1]) if name.endswith("baddbmm") else (t[0], t[1])
            return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    except Exception:
        return 0
    return 0


def _template_flops(t) -> int:
    """A matmul template's operands: the first two tensors with matching inner dimensions."""
    for i, a in enumerate(t):
        for b in t[i + 1:]:
            if a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0]:
                return 2 * a.shape[0] * a.shape[1] * b.shape[1]
            if a.dim() == b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]:
                return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    return 0


_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def _dtype(args) -> str:
    """The float dtype of the largest tensor argument (picks the FLOP ceiling)."""
    t = [a for a in args if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    return _DT.get(max(t, key=lambda a: a.numel()).dtype, "fp32") if t else "fp32"


class _Meta:
    """Records, for one graph call, each kernel's launches, argument bytes, FLOPs, dtype and the wrapper
    lines that launch it; `annotate` also wraps each launch in a profiler range named after its line."""

    def __init__(self, offset: int, lines: list[str]):
        self.on, self.annotate, self.stats = False, False, {}
        self._offset, self._lines = offset, lines

    def launch(self, name: str, kind: str, fn, args, kwargs):
        line = sys._getframe(2).f_lineno  # the wrapper's line: launch <- proxy <- wrapper
        if self.on:
            s = self.stats.setdefault(name, {"kind": kind, "bytes": 0, "flops": 0, "dtype": _dtype(args), "sites": {}})
            s["bytes"] += _nbytes(list(args) + list(kwargs.values()))  # extern calls write into out=buf
            s["flops"] += _flops(name, args)
            code = self._lines[line - 1].strip()[:160] if 0 < line <= len(self._lines) else ""
            s["sites"][str(line + self._offset)] = code
        if self.annotate:
            with torch.profiler.record_function(f"tilesmith::{name}@{line + self._offset}"):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)


_no_sync = clock.device_sync("cpu")  # CPU kernels are done when they return


def main(gdir: str, src_file: str, calls: int) -> dict:
    from tilesmith.profile import roofline

    phases, t0 = {}, time.perf_counter()

    def phase(name: str) -> None:  # where a profile's seconds go (a GPU profile of 4 graphs took 2 minutes)
        nonlocal t0
        phases[name] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()

    data = loading.load_graph_data(gdir)
    text = open(src_file).read()
    mod = loading.load_module(text, data.constants)
    args = loading.clone_args(data.inputs)
    device = clock.device_of(args)
    cuda, sync = device != "cpu", clock.device_sync(device)
    reset = loading.state_reset(data, args) or (lambda: None)  # inputs updated in place: from the captured state
    phase("load")

    def timed_call() -> int:
        reset()
        sync()
        return clock.timed(lambda: mod.call(list(args)), 1, sync)

    with torch.no_grad():
        for _ in range(3):  # warm-up: first Triton calls autotune and compile
            reset()
            mod.call(list(args))
        sync()
        phase("warm_up")
        wall = [timed_call() for _ in range(calls)]
        reset()
        phase("wall")
        wrapper = source.split_header(text)[1]
        meta = _Meta(text[: len(text) - len(wrapper)].count("\n"), wrapper.splitlines())
        originals = proxy.instrument(mod, wrapper, meta.launch)
        proxies = {k: getattr(mod, k) for k in originals}
        meta.on = True  # one untimed call records what every kernel was launched with
        mod.call(list(args))
        sync()
        meta.on = False
        proxy.restore(mod, originals)  # time the kernels themselves, not the recording proxies
        phase("record_arguments")
        # Profiled passes on a GPU start from the captured state once each (a reset inside one would add its copies
        # to the kernels it reports); on the CPU each call does.
        reset()
        if cuda:
            kernels, gap_ns = _device_kernels(mod, wrapper, args, calls)
            phase("device_profile")
            # A second profiled pass with each launch in a range named after its wrapper line credits
            # library kernels to the extern call that ran them (its overhead stays out of the gaps).
            proxy.restore(mod, proxies)
            meta.annotate = True
            reset()
            _credit_library_kernels(_profiled_events(mod, args, calls), kernels, calls)
            proxy.restore(mod, originals)
            phase("library_credit")
        else:
            kernels, gap_ns = _cpu_kernels(mod, wrapper, args, calls, reset), None
            phase("kernel_times")
    for name, m in meta.stats.items():
        if name in kernels:
            kernels[name].update(bytes=m["bytes"], flops=m["flops"], dtype=m["dtype"], sites=m["sites"])
    ceilings = _ceilings(device)
    phase("ceilings")
    return {"key": data.meta["key"], "device": data.meta["device"], "wall_ns": wall, "kernels": kernels,
            "profiled_calls": calls, "gap_ns": gap_ns, "ceilings": ceilings,
            "counters": roofline.counters_note(cuda), "phases_s": phases}


_CEILINGS: dict = {}  # device -> measured ceilings: once per process, however many graphs it profiles


def _ceilings(device: str) -> dict:
    from tilesmith.profile import roofline

    if device not in _CEILINGS:
        _CEILINGS[device] = roofline.measure(device).to_dict()
    return _CEILINGS[device]


def _cpu_kernels(mod, wrapper, args, calls, reset) -> dict:
    """CPU time per kernel and library call, summed per graph call (each launch timed as it runs)."""
    stats: dict = {}

    def launch(name: str, kind: str, fn, a, kw):
        s, out = stats.setdefault(name, {"kind": kind, "calls": 0, "cur": 0, "ns": []}), []
        s["cur"] += clock.timed(lambda: fn(*a, **kw), 1, _no_sync, lambda i, r: out.append(r))
        s["calls_cur"] = s.get("calls_cur", 0) + 1
        return out[0]

    proxy.instrument(mod, wrapper, launch)
    for _ in range(calls):
        for s in stats.values():
            s["cur"], s["calls_cur"] = 0, 0
        reset()
        mod.call(list(args))
        for s in stats.values():
            if s.get("calls_cur"):
                s["ns"].append(s["cur"])
                s["calls"] = s["calls_cur"]
    return {n: {k: v for k, v in s.items() if k not in ("cur", "calls_cur")} for n, s in stats.items() if s["ns"]}


def _device_kernels(mod, wrapper, args, calls) -> tuple[dict, float | None]:
    """Device time per kernel name (torch.profiler) and device idle time between kernels."""
    names = {k.name: k.kind for k in source.kernels_in(wrapper)}
    events = _profiled_events(mod, args, calls)
    out: dict = {}
    for e in events:  # device activity (kernels, copies, memsets), grouped by name
        if not _on_device(e):
            continue
        row = out.setdefault(e.name, {"kind": names.get(e.name, "device"), "count": 0, "total_ns": 0.0})
        row["count"] += 1
        row["total_ns"] += e.time_range.elapsed_us() * 1000.0
    for row in out.values():
        row["calls"] = max(1, round(row.pop("count") / calls))
    return out, _gap_ns(events, calls)


def _profiled_events(mod, args, calls) -> list:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            mod.call(list(args))
        torch.cuda.synchronize()
    return list(prof.events())


def _on_device(e) -> bool:
    return str(getattr(e, "device_type", "")).endswith(("CUDA", "PrivateUse1"))


def _subtree_kernels(e) -> list:
    found, stack = [], [e]
    while stack:
        x = stack.pop()
        found += list(getattr(x, "kernels", None) or [])
        stack += list(getattr(x, "cpu_children", None) or [])
    return found


def _credit_library_kernels(events, out: dict, calls: int) -> None:
    """Rows for extern calls from the ranges `tilesmith::extern_kernels.mm@LINE` of an annotated pass:
    the device kernels the profiler linked under each; those kernels' own device rows are dropped."""
    for e in events:
        if not e.name.startswith("tilesmith::extern_kernels."):
            continue
        name = e.name[len("tilesmith::"):].rsplit("@", 1)[0]
        row = out.setdefault(name, {"kind": "extern", "calls": 0, "total_ns": 0.0, "library_kernels": [],
                                    "_launches": 0})
        row["_launches"] += 1
        for k in _subtree_kernels(e):
            row["total_ns"] += k.duration * 1000.0
            if k.name not in row["library_kernels"]:
                row["library_kernels"].append(k.name)
    credited = set()
    for key in list(out):
        row = out[key]
        if "_launches" in row:
            row["calls"] = max(1, round(row.pop("_launches") / calls))
            if not row["total_ns"]:
                del out[key]  # the profiler linked no kernel to this call: its kernels stay as device rows
            else:
                credited |= set(row["library_kernels"])
    for name in credited:  # now shown under the wrapper's call that ran them
        if out.get(name, {}).get("kind") == "device":
            del out[name]


def _gap_ns(events, calls: int) -> float | None:
    """Device idle time between consecutive kernels, per graph call (the calls ran back to back)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if _on_device(e) and e.time_range.end > e.time_range.start)
    if len(spans) < 2:
        return None
    gap, end = 0.0, spans[0][1]
    for a, b in spans[1:]:
        gap += max(0.0, a - end)
        end = max(end, b)
    return gap * 1000.0 / calls  # us -> ns


def batch(jobs_file: str, calls: int) -> dict:
    """Several graphs in this one process, one after another: {"results": [each job's answer, or
    {"error": ...} for a job that raised; the jobs after it still run]}."""
    entered, results = time.time(), []
    for gdir, src_file in json.loads(open(jobs_file).read()):
        try:
            results.append(main(gdir, src_file, calls))
        except Exception as e:  # noqa: BLE001 - one graph's failure is its own answer
            results.append({"error": f"{type(e).__name__}: {e}"[:2000]})
    # Wall-clock stamps (the parent subtracts its own): when the interpreter started, when its imports were
    # done, when it replied.
    return {"results": results, "stamps": {"started": _STARTED, "entered": entered, "replied": time.time()}}



if __name__ == "__main__":  # GRAPH_DIR SOURCE CALLS (one graph, e.g. under ncu), or --batch JOBS.json CALLS
    if sys.argv[1] == "--batch":
        loading.reply(batch(sys.argv[2], int(sys.argv[3])))
    else:
        loading.reply(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
