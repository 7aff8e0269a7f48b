"""The controlled fixture: one graph with a known win available to the tuner, through the whole flow
(capture -> optimize with the tuner -> gate -> install -> runtime) in about a minute or two.

    python benchmark.py run [--seconds 10] [--out-dir bench-out]

The graph is examples/oversubscribed.py: CPU inference whose C++ kernels were generated with four
times more OpenMP threads than the process may use (a container that sees the host's cores). The
tuner's thread-count search is expected to find that. The table compares, in one process and
interleaved: eager, Inductor's code, and the same compile with `import tilesmith.runtime`.
Exits non-zero unless the runtime path is correct and faster than Inductor's by the threshold.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import flow

ROOT = Path(__file__).resolve().parent
EXAMPLE = ROOT / "examples" / "oversubscribed.py"


def measure(a) -> None:
    import runpy

    import torch

    ns = runpy.run_path(str(EXAMPLE), run_name="fixture")  # defines Scorer, compiles nothing yet
    torch.manual_seed(0)
    model = ns["Scorer"]().eval()
    x = torch.randn(256, 1024)
    paths = {"eager": model, "compile default": torch.compile(copy.deepcopy(model))}
    with torch.no_grad():
        for fn in paths.values():
            fn(x)
        import tilesmith.runtime as rt

        paths["tilesmith on default"] = torch.compile(copy.deepcopy(model))
        paths["tilesmith on default"](x)
        ref = model(x)
        errors = {k: float((fn(x) - ref).abs().max()) for k, fn in paths.items()}
        samples = flow.interleaved(paths, (x,), a.seconds, a.calls, lambda: None)
    Path(a.out).write_text(json.dumps({"samples_ms": samples, "max_abs_error": errors, "runtime": rt.stats().to_dict(),
                                       "threads": torch._inductor.config.cpp.threads, "torch": torch.__version__}))


def run(a) -> int:
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["TILESMITH_HOME"] = str(out / "home")
    opt, pipeline_s = flow.capture_optimize_install(str(EXAMPLE), ["--steps", "1"], str(out / "workspace"))
    raw = out / "measure.json"
    m = subprocess.run([sys.executable, __file__, "measure", "--out", str(raw), "--seconds", str(a.seconds),
                        "--calls", str(a.calls)], text=True, capture_output=True)
    if m.returncode != 0:
        sys.exit(f"measure failed:\n{m.stderr[-3000:]}")
    d = json.loads(raw.read_text())
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
                                                    "faster": faster, "pipeline_s": pipeline_s, "threshold": thr,
                                                    "date": time.strftime("%Y-%m-%d"), "torch": d["torch"]}, indent=2))
    print(f"wrote {out / 'benchmark.json'}")
    return 0 if (correct and faster and subs) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r, m = sub.add_parser("run"), sub.add_parser("measure")
    for p in (r, m):
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--calls", type=int, default=20)
    r.add_argument("--out-dir", default="bench-out")
    m.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "measure":
        measure(a)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
