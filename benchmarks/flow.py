"""Shared by benchmark.py and moe_benchmark.py: the public CLI flow, interleaved timing, a table."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def cli(*args, check: bool = True) -> subprocess.CompletedProcess:
    """Run `tilesmith ARGS` as a user would; exit with its output when it fails and check is set."""
    p = subprocess.run([sys.executable, "-m", "tilesmith_cli.app", *args], text=True, capture_output=True,
                       env={**os.environ, "COLUMNS": "140"})
    if check and p.returncode != 0:
        sys.exit(f"tilesmith {args[0]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def json_out(p: subprocess.CompletedProcess) -> dict:
    return json.loads(p.stdout[p.stdout.index("{"):])


def capture_optimize_install(script: str, script_args: list[str], ws: str, optimizer: str = "tuner",
                             extra: list[str] | None = None) -> tuple[dict, float]:
    """capture -> optimize -> install through the CLI; returns (optimize result, seconds spent)."""
    t0 = time.monotonic()
    cli("capture", script, "-w", ws, "--force", "--", *script_args)
    run = json_out(cli("optimize", "-w", ws, "--optimizer", optimizer, "--json", *(extra or [])))
    cli("install", run["run_id"], check=False)  # nothing accepted is not an error here
    return run, time.monotonic() - t0


def interleaved(paths: dict, call_args: tuple, seconds: float, calls: int, sync, min_rounds: int = 10) -> dict:
    """Per path, per-call ms of each sample; paths take turns, the first of each round rotating."""
    samples = {name: [] for name in paths}
    names = list(paths)
    deadline = time.monotonic() + seconds
    r = 0
    while time.monotonic() < deadline or r < min_rounds:
        for name in names[r % len(names):] + names[: r % len(names)]:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                paths[name](*call_args)
            sync()
            samples[name].append((time.perf_counter_ns() - t0) / calls / 1e6)
        r += 1
    return samples


def iqr(v: list[float]) -> float:
    if len(v) < 4:
        return max(v) - min(v)
    q = statistics.quantiles(v, n=4)
    return q[2] - q[0]


def table(samples: dict, errors: dict, eager: str | None, default: str | None) -> list[dict]:
    """Print median, IQR, speedups and max error per path; return the rows."""
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    print(f"{'path':34} {'median ms':>10} {'IQR ms':>9} {'vs eager':>9} {'vs default':>11} {'max |err| vs eager':>19}")
    for k in med:
        row = {"path": k, "median_ms": med[k], "iqr_ms": iqr(samples[k]), "rounds": len(samples[k]),
               "speedup_vs_eager": med[eager] / med[k] if eager else None,
               "speedup_vs_default": med[default] / med[k] if default else None, "max_abs_error": errors.get(k)}
        rows.append(row)
        fmt = lambda x: f"{x:8.3f}x" if x else "       -"  # noqa: E731
        print(f"{k:34} {med[k]:10.4f} {row['iqr_ms']:9.4f} {fmt(row['speedup_vs_eager'])} "
              f"{fmt(row['speedup_vs_default']):>11} {row['max_abs_error'] if row['max_abs_error'] is not None else '-':>19}")
    return rows
