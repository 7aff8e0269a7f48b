"""Time each kernel of a wrapper on its real arguments: the agent's shell harness.

    python -m tilesmith.search.kernel_bench ATTEMPT.py [--graph GRAPH_DIR] [--calls N] [--json]

Loads the wrapper with the graph's captured inputs and constants (GRAPH_DIR defaults to
$TILESMITH_GRAPH_DIR, which the agent's shell sets), then runs `call(args)` a few times with every
kernel it launches wrapped (tilesmith/profile/proxy.py): each Triton kernel's `.run`, each C++ kernel,
and each `extern_kernels.*` library call is timed on exactly the arguments the wrapper passes it
(device synchronized before and after each launch, so the times are per kernel, not overlapped). It prints, per kernel, the launches
per graph call, the time per graph call and its share, and the shapes of its first launch's tensor
arguments; then the uninstrumented wall time per call. A graph that updates its inputs in place starts each call from
the captured state. A screen, not a verdict: only the gate decides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class KernelRow:
    name: str
    kind: str  # triton | cpp | extern
    launches: int = 0  # over all timed calls
    ns: int = 0  # total over all timed calls
    arg_shapes: list = field(default_factory=list)  # tensor argument shapes of the first launch

    def per_call_ms(self, calls: int) -> float:
        return self.ns / calls / 1e6


@dataclass
class Bench:
    calls: int  # timed graph calls
    wall_ms: float  # uninstrumented median wall time per graph call
    instrumented_ms: float  # per graph call with every launch synchronized
    device: str
    kernels: list[KernelRow]

    def to_dict(self) -> dict:
        return asdict(self)


def bench(source: str, graph_dir: str | Path, calls: int = 10) -> Bench:
    """Load `source` on the graph's captured inputs and time every kernel it launches."""
    import statistics

    import torch

    from tilesmith.capture import loading
    from tilesmith.gate import clock
    from tilesmith.profile import proxy
    from tilesmith.source import split_header

    data = loading.load_graph_data(graph_dir)
    mod = loading.load_module(source, data.constants)
    args = loading.clone_args(data.inputs)
    device = clock.device_of(args)
    sync = clock.device_sync(device)
    one_call = lambda: mod.call(list(args))  # noqa: E731
    # A graph that updates inputs in place (a decoder's cache and position) starts each call from the captured
    # state, outside the time (capture/loading.state_reset): called again and again on one set of buffers, its
    # position would run past the cache's end.
    reset = loading.state_reset(data, args)

    def timed_call() -> int:
        if reset:
            reset()
            sync()
        return clock.timed(one_call, 1, sync)

    with torch.no_grad():
        for _ in range(3):  # compile, autotune, warm caches
            if reset:
                reset()
            one_call()
        wall = [timed_call() for _ in range(calls)]
        rows: dict[str, KernelRow] = {}

        def launch(name: str, kind: str, fn, a, kw):  # each launch timed on its own, the device synchronized
            row = rows.setdefault(name, KernelRow(name, kind if kind in ("cpp", "extern") else "triton"))
            if not row.arg_shapes:
                row.arg_shapes = [tuple(x.shape) for x in a if hasattr(x, "shape")][:8]
            out = []  # the launch's result, taken inside the timed window
            row.ns += clock.timed(lambda: fn(*a, **kw), 1, sync, lambda i, r: out.append(r))
            row.launches += 1
            return out[0]

        proxy.instrument(mod, split_header(source)[1], launch)
        total_ns = sum(timed_call() for _ in range(calls)) if reset else clock.timed(one_call, calls, sync)
        instrumented = total_ns / calls / 1e6
    live = sorted((r for r in rows.values() if r.launches), key=lambda r: -r.ns)
    return Bench(calls, statistics.median(wall) / 1e6, instrumented, device.split(":")[0], live)


def table(b: Bench) -> str:
    total = sum(r.ns for r in b.kernels) / b.calls / 1e6
    lines = [f"{'kernel':<52} {'kind':<7} {'launches/call':>13} {'ms/call':>10} {'share':>6}  first launch's tensor shapes"]
    for r in b.kernels:
        ms = r.per_call_ms(b.calls)
        lines.append(f"{r.name:<52} {r.kind:<7} {r.launches / b.calls:>13g} {ms:>10.4f} {ms / max(total, 1e-12):>6.1%}"
                     f"  {r.arg_shapes}")
    if not b.kernels:
        lines.append("(no kernel launched from Python: a call replayed from a CUDA graph launches nothing here)")
    lines.append(f"sum of kernels {total:.4f} ms/call; instrumented call {b.instrumented_ms:.4f} ms "
                 f"(every launch synchronized); plain call {b.wall_ms:.4f} ms (median of {b.calls}, {b.device})")
    lines.append("Python between launches and uninstrumented ops make up the rest; only the gate's timing decides.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilesmith.search.kernel_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("wrapper", help="the attempt (or any wrapper) file to time")
    ap.add_argument("--graph", default=os.environ.get("TILESMITH_GRAPH_DIR"),
                    help="the captured graph folder (default: $TILESMITH_GRAPH_DIR)")
    ap.add_argument("--calls", type=int, default=10, help="timed graph calls (default 10)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ns = ap.parse_args(argv)
    if not ns.graph:
        print("no graph folder: pass --graph or set TILESMITH_GRAPH_DIR", file=sys.stderr)
        return 2
    b = bench(Path(ns.wrapper).read_text(), ns.graph, max(1, ns.calls))
    print(json.dumps(b.to_dict()) if ns.json else table(b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
