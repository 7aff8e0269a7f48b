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
    phases = {}

    def phase(name: str, start: float) -> None:  # printed as it happens: a run cut off still shows where it was
        phases[name] = round(time.monotonic() - start, 1)
        print(f"[flow] {name}: {phases[name]} s", file=sys.stderr, flush=True)

    t = time.monotonic()
    cli("capture", script, "-w", ws, "--force", "--", *script_args)
    phase("capture", t)
    t = time.monotonic()
    run = json_out(cli("optimize", "-w", ws, "--optimizer", optimizer, "--json", *(extra or [])))
    phase("optimize", t)
    t = time.monotonic()
    cli("install", run["run_id"], check=False)  # nothing accepted is not an error here
    phase("install", t)
    run["phases_s"] = phases
    return run, time.monotonic() - t0


def serve(fn, call_args: tuple, sync, out_file: str, extra=None, grad: bool = False) -> None:
    """Worker side of `measure_in_processes`: save one output, then time `fn` on request.

    Protocol on stdin/stdout, one line each: "time N" -> per-call ms of N back-to-back calls;
    "quit" -> a JSON line of `extra()` (e.g. runtime stats), then exit. grad: run with autograd on
    (a training step that calls backward itself).
    """
    import torch

    with torch.enable_grad() if grad else torch.no_grad():
        for _ in range(3):  # compile, autotune, record CUDA graphs
            out = fn(*call_args)
        sync()
        torch.save(out.detach().float().cpu().clone(), out_file)
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "time":
                n = int(cmd[1])
                sync()
                t0 = time.perf_counter_ns()
                for _ in range(n):
                    fn(*call_args)
                sync()
                print((time.perf_counter_ns() - t0) / n / 1e6, flush=True)
            else:
                print(json.dumps(extra() if extra else {}), flush=True)
                return


def measure_in_processes(worker_cmd, names: list[str], out_dir, seconds: float, calls: int,
                         min_rounds: int = 10) -> tuple[dict, dict, dict]:
    """Each path in its own process (Dynamo caches and the runtime hook cannot leak between paths),
    timed in interleaved rounds, the first of each round rotating. `worker_cmd(name, out_file)` is
    the command line of one worker. Returns (samples ms per path, max |error| vs names[0], extras).
    """
    import torch

    procs = {}
    for name in names:
        out_file = f"{out_dir}/{name.replace(' ', '_')}.pt"
        procs[name] = (subprocess.Popen(worker_cmd(name, out_file), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1), out_file)
    try:
        for name, (p, _) in procs.items():
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise SystemExit(f"path '{name}' failed to start: {line.strip()!r} (exit {p.poll()})")
        ref = torch.load(procs[names[0]][1])
        errors = {n: float((torch.load(f) - ref).abs().max()) for n, (_, f) in procs.items()}
        samples = {n: [] for n in names}
        deadline, r = time.monotonic() + seconds, 0
        while time.monotonic() < deadline or r < min_rounds:
            for n in names[r % len(names):] + names[: r % len(names)]:
                p = procs[n][0]
                p.stdin.write(f"time {calls}\n")
                samples[n].append(float(p.stdout.readline()))
            r += 1
        extras = {}
        for n, (p, _) in procs.items():
            p.stdin.write("quit\n")
            extras[n] = json.loads(p.stdout.readline())
        return samples, errors, extras
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.kill()


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
