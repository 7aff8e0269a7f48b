"""Calibrate the gate: A/A false-accept rate, power on a known real speedup, seconds per decision.

    python benchmarks/gate_calibration.py [--device cpu|cuda] [--trials 10] [--speedup 1.05] [--out FILE.json]

A/A: the original wrapper judged against itself with a different seed each trial (every accept is a
false accept). Power: a copy of the graph whose wrapper does redundant work (a sin() into a scratch
buffer, sized so the slowed copy takes about --speedup times as long) is the baseline, and the
untouched original is the candidate: a real speedup of known, measured size. Prints a table and writes
JSON. Never passes or fails: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def capture_example(device: str, work: Path, mode: str | None) -> Path:
    ws = work / "ws"
    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(ROOT / "examples" / "inference.py"), "-w", str(ws),
           "--force", "--json", "--", "--steps", "2", "--device", device] + (["--mode", mode] if mode else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"capture failed: {p.stderr[-2000:]}")
    graphs = sorted((ws / "graphs").iterdir())
    return graphs[0]


def _call_ms(mod, inputs, n: int = 200) -> float:
    """Median per-call time of a loaded wrapper (trusted code: the original and its slowed copy only)."""
    import torch

    from tilesmith import loading

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for _ in range(n):
        args = loading.clone_args(inputs)
        sync()
        t0 = time.perf_counter_ns()
        mod.call(args)
        sync()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e6


def slowed_graph(graph: Path, work: Path, speedup: float) -> tuple[Path, float]:
    """A copy of `graph` whose wrapper also runs sin() over part of its largest float input into scratch."""
    import torch

    from tilesmith import loading

    data = loading.load_graph_data(graph)
    text = (graph / "wrapper.py").read_text()
    names = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M).group(1).split(", ")
    floats = [(x.numel(), n) for n, x in zip(names, data.inputs)
              if isinstance(x, torch.Tensor) and x.dtype.is_floating_point]
    numel, name = max(floats)
    base = loading.load_module(text, data.constants)
    t_graph = _call_ms(base, data.inputs)
    x = data.inputs[names.index(name)]
    scratch = torch.empty_like(x)
    t0 = time.perf_counter_ns()
    for _ in range(200):
        torch.sin(x, out=scratch)
    t_sin = (time.perf_counter_ns() - t0) / 200 / 1e6
    # Redundant work of about (speedup - 1) * t_graph: whole sin() passes, or one pass over a prefix.
    passes = (speedup - 1) * t_graph / t_sin
    reps, n = (round(passes), x.numel()) if passes >= 1 else (1, max(1, int(x.numel() * passes)))
    waste = (f"        _waste = torch.empty({n}, dtype={name}.dtype, device={name}.device)\n"
             f"        for _ in range({reps}):\n"
             f"            torch.sin({name}.reshape(-1)[:{n}], out=_waste)\n")
    slow_text = text.replace("        args.clear()\n", "        args.clear()\n" + waste, 1)
    out = work / "slowed" / graph.name
    out.mkdir(parents=True)
    for f in ("graph.json", "data.pt"):
        shutil.copy(graph / f, out / f)
    (out / "wrapper.py").write_text(slow_text)
    slow = loading.load_module(slow_text, data.constants)
    ratios = []
    for _ in range(5):  # interleaved, so drift cancels
        ratios.append(_call_ms(slow, data.inputs, 100) / _call_ms(base, data.inputs, 100))
    return out, statistics.median(ratios)


def trials(graph: Path, candidate: Path, n: int, policy_kw: dict, seed0: int) -> list[dict]:
    from tilesmith.gate import Policy, judge

    rows = []
    for i in range(n):
        v = judge(graph, candidate, Policy(seed=seed0 + i, **policy_kw))
        t = v.first.timing if v.first else None
        rows.append({"accepted": v.accepted, "stage": v.stage, "codes": v.codes, "wall_s": v.wall_s,
                     "speedup": t.speedup if t else None, "low": t.speedup_low if t else None,
                     "samples": t.samples if t else None})
        print(f"  trial {i + 1}/{n}: {'ACCEPT' if v.accepted else 'reject'} "
              f"speedup {rows[-1]['speedup'] or float('nan'):.3f} low {rows[-1]['low'] or float('nan'):.3f} "
              f"samples {rows[-1]['samples']} wall {v.wall_s:.1f} s", file=sys.stderr)
    return rows


def summary(rows: list[dict]) -> dict:
    acc = sum(r["accepted"] for r in rows)
    sp = [r["speedup"] for r in rows if r["speedup"]]
    return {"trials": len(rows), "accepted": acc, "accept_rate": acc / len(rows) if rows else None,
            "median_speedup": statistics.median(sp) if sp else None,
            "median_wall_s": statistics.median(r["wall_s"] for r in rows) if rows else None,
            "median_samples": statistics.median(r["samples"] for r in rows if r["samples"]) if sp else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    import torch

    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--graph", type=Path, help="a captured graph dir (default: capture examples/inference.py)")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode for the capture, e.g. reduce-overhead")
    ap.add_argument("--trials", type=int, default=10, help="trials for A/A and for power (each)")
    ap.add_argument("--speedup", type=float, default=1.05, help="the real speedup the power trials give the candidate")
    ap.add_argument("--min-improvement", type=float, default=0.02)
    ap.add_argument("--time-budget", type=float, default=20.0, help="timing seconds per gate pass")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-calibration-"))
    try:
        graph = a.graph or capture_example(a.device, work, a.compile_mode)
        slow, true_speedup = slowed_graph(graph, work, a.speedup)
        kw = dict(min_improvement=a.min_improvement, time_budget_s=a.time_budget, mode=a.mode)
        print(f"A/A: {a.trials} trials on {graph.name[:12]}", file=sys.stderr)
        aa = trials(graph, graph / "wrapper.py", a.trials, kw, a.seed)
        print(f"power: baseline slowed to {true_speedup:.3f}x, {a.trials} trials", file=sys.stderr)
        pw = trials(slow, graph / "wrapper.py", a.trials, kw, a.seed + 10_000)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"device": a.device, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "torch": torch.__version__, "min_improvement": a.min_improvement, "time_budget_s": a.time_budget,
           "true_speedup": true_speedup, "aa": summary(aa), "power": summary(pw), "aa_trials": aa, "power_trials": pw}
    rows = [("A/A false accepts", f"{res['aa']['accepted']}/{res['aa']['trials']}",
             f"{res['aa']['median_speedup'] or float('nan'):.3f}", f"{res['aa']['median_wall_s']:.1f}"),
            (f"power at {true_speedup:.3f}x", f"{res['power']['accepted']}/{res['power']['trials']}",
             f"{res['power']['median_speedup'] or float('nan'):.3f}", f"{res['power']['median_wall_s']:.1f}")]
    print(f"{'case':<24} {'accepted':>9} {'median speedup':>15} {'s/decision':>11}")
    for r in rows:
        print(f"{r[0]:<24} {r[1]:>9} {r[2]:>15} {r[3]:>11}")
    if a.out:
        a.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    main()
