"""The controlled fixture: one graph with a known win available to the tuner, through the whole flow
(capture -> optimize with the tuner -> gate -> install -> runtime) in about a minute or two.

    python benchmark.py run [--seconds 10] [--out-dir bench-out]

The graph is examples/oversubscribed.py: CPU inference whose C++ kernels were generated with four
times more OpenMP threads than the process may use (a container that sees the host's cores). The
tuner's thread-count search is expected to find that. The table compares, interleaved round by
round, each path in its own process: eager, Inductor's code, and the same compile with `import
tilesmith.runtime` (separate processes, so Dynamo's cache cannot hand one path's code to another).
Exits non-zero unless the runtime path is correct and faster than Inductor's by the threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks import flow

ROOT = Path(__file__).resolve().parent
EXAMPLE = ROOT / "examples" / "oversubscribed.py"


PATHS = ["eager", "compile default", "tilesmith on default"]


def worker(a) -> None:
    """One path in this process: eager, Inductor's code, or the same compile with the runtime."""
    import runpy

    import torch

    ns = runpy.run_path(str(EXAMPLE), run_name="fixture")  # sets Inductor's thread count, defines Scorer
    torch.manual_seed(0)
    model = ns["Scorer"]().eval()
    x = torch.randn(256, 1024)
    fn, extra = model, None
    if a.path != "eager":
        if a.path.startswith("tilesmith"):
            import tilesmith.runtime as rt

            extra = lambda: rt.stats().to_dict()  # noqa: E731
        fn = torch.compile(model)
    flow.serve(fn, (x,), lambda: None, a.out, extra)


def run(a) -> int:
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "home", ignore_errors=True)  # a fresh store: the whole flow runs, no exact hit
    os.environ["TILESMITH_HOME"] = str(out / "home")
    opt, pipeline_s = flow.capture_optimize_install(str(EXAMPLE), ["--steps", "1"], str(out / "workspace"))
    samples, errors, extras = flow.measure_in_processes(
        lambda name, f: [sys.executable, __file__, "worker", "--path", name, "--out", f], PATHS, str(out),
        a.seconds, a.calls)
    import torch

    d = {"samples_ms": samples, "max_abs_error": errors, "runtime": extras["tilesmith on default"],
         "threads": 4 * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
         "torch": torch.__version__}
    thr = float(os.environ.get("TILESMITH_MIN_IMPROVEMENT", "0.02"))
    print(f"\nbenchmark.py: oversubscribed CPU fixture ({d['threads']} OpenMP threads), torch {d['torch']}; "
          f"pipeline {pipeline_s:.0f} s, run {opt['run_id']}")
    rows = flow.table(d["samples_ms"], d["max_abs_error"], "eager", "compile default")
    med = {r["path"]: r["median_ms"] for r in rows}
    correct = d["max_abs_error"]["tilesmith on default"] <= 1e-5
    faster = med["tilesmith on default"] * (1 + thr) < med["compile default"]
    subs = d["runtime"].get("substituted", 0)
    track = opt["tracks"][0]
    print(f"gate: {track['status']}, {track['candidates']} candidate(s), speedup {track['speedup'] or 0:.3f}x "
          f"(>= {track['speedup_low'] or 0:.3f}x); runtime substituted {subs}; correct {correct}; faster {faster}")
    (out / "benchmark.json").write_text(json.dumps({"rows": rows, "gate": track, "runtime": d["runtime"], "correct": correct,
                                                    "faster": faster, "pipeline_s": pipeline_s, "phases_s": opt["phases_s"], "threshold": thr,
                                                    "date": time.strftime("%Y-%m-%d"), "torch": d["torch"]}, indent=2))
    print(f"wrote {out / 'benchmark.json'}")
    return 0 if (correct and faster and subs) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r, w = sub.add_parser("run"), sub.add_parser("worker", help="one measured path (run starts these)")
    r.add_argument("--seconds", type=float, default=10.0, help="timing budget, interleaved rounds")
    r.add_argument("--calls", type=int, default=20, help="calls per timed sample")
    r.add_argument("--out-dir", default="bench-out")
    w.add_argument("--path", required=True, choices=PATHS)
    w.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "worker":
        worker(a)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
