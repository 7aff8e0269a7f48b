"""Shared by benchmark.py and moe_benchmark.py: the public CLI flow, interleaved timing, a table."""

from __future__ import annotations

import json
import math
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

    Protocol on stdin/stdout, one line each: "time N [W]" -> per-call ms of N back-to-back calls (after W
    untimed ones: the GPU's clocks and the caches warm again after the worker waited for its turn);
    "profile N" -> a JSON line of `profile` (is the step host- or GPU-bound?); "quit" -> a JSON line
    of `extra()` (e.g. runtime stats), then exit. grad: run with autograd on (a training step that
    calls backward itself).
    """
    import torch

    step = lambda: fn(*call_args)  # noqa: E731
    with torch.enable_grad() if grad else torch.no_grad():
        for _ in range(3):  # compile, autotune, record CUDA graphs
            out = fn(*call_args)
        sync()
        torch.save(out.detach().float().cpu().clone(), out_file)
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "time":
                for _ in range(int(cmd[2]) if len(cmd) > 2 else 0):
                    step()
                print(ms_per_call(step, sync, int(cmd[1])), flush=True)
            elif cmd[0] == "profile":
                print(json.dumps(profile(step, sync, int(cmd[1]), out.is_cuda)), flush=True)
            else:
                print(json.dumps(extra() if extra else {}), flush=True)
                return


def ms_per_call(step, sync, n: int, wait: bool = True) -> float:
    """Per-call ms of n back-to-back steps. wait=False: the time to issue them, the GPU maybe still busy."""
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        step()
    if wait:
        sync()
    return (time.perf_counter_ns() - t0) / n / 1e6


def profile(step, sync, n: int, cuda: bool) -> dict:
    """Where a step's time goes: host_ms, the time to issue one (min(n, 20) steps without waiting,
    so the GPU queue is not yet full); wall_ms, the per-call time of n steps; on CUDA, `device_summary`
    of n steps under the profiler (None on CPU). A step near gpu_busy_ms is GPU-bound; one well above
    it waits on the host or on gaps between kernels. An exception becomes "error" beside what was
    measured: a failing profiler never costs the timing rounds.
    """
    res: dict = dict.fromkeys(("host_ms", "wall_ms", "gpu_busy_ms", "kernels_per_step", "top"))
    try:
        res["wall_ms"] = ms_per_call(step, sync, n)  # first: it also wakes the worker up from its idle wait
        res["host_ms"] = ms_per_call(step, sync, min(n, 20), wait=False)
        if cuda:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                sync()
                for _ in range(n):
                    step()
                sync()
            res.update(device_summary(prof.events(), n))
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        res["error"] = f"{type(e).__name__}: {e}"[:500]
    return res


def device_summary(events, n: int) -> dict:
    """Per step of n, from the profiler's raw events (key_averages sums overlapping kernels): the
    time the GPU is busy (the union of the device events' intervals, in µs: streams that overlap
    count once), device kernels (copies and sets are busy time, not kernels), and the 5 kernels with
    the most device time. GPU-side spans of record_function ranges (user annotations) cover the gaps
    between their kernels, so they are left out; CUDA sync events are off unless asked for.
    """
    from torch.profiler import DeviceType

    dev = sorted((e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation),
                 key=lambda e: e.time_range.start)
    busy, end = 0.0, float("-inf")
    for e in dev:
        if e.time_range.end > end:
            busy += e.time_range.end - max(e.time_range.start, end)
            end = e.time_range.end
    kernel_us: dict = {}
    count = 0
    for e in dev:
        if not e.name.startswith(("Memcpy", "Memset")):
            count += 1
            kernel_us[e.name] = kernel_us.get(e.name, 0.0) + e.time_range.end - e.time_range.start
    top = sorted(kernel_us.items(), key=lambda kv: -kv[1])[:5]
    return {"gpu_busy_ms": busy / n / 1e3, "kernels_per_step": count / n,
            "top": [[name[:60], us / n / 1e3] for name, us in top]}


def measure_in_processes(worker_cmd, names: list[str], out_dir, seconds: float, calls: int,
                         min_rounds: int = 10, profile_calls: int = 0,
                         min_sample_ms: float = 0.0, ready_s: float | None = None) -> tuple[dict, dict, dict]:
    """Each path in its own process (Dynamo caches and the runtime hook cannot leak between paths),
    timed in interleaved rounds, the first of each round rotating. `worker_cmd(name, out_file)` is
    the command line of one worker. Returns (samples ms per path, max |error| vs names[0], extras).
    profile_calls: then profile each path over that many calls (`profile`), in its extras' "profile";
    a worker that dies there (a crash in the profiler) is an error in it, the samples are kept.
    min_sample_ms: each path's sample is then as many calls (at least `calls`) as last that long, after a
    quarter as many untimed ones: ten 0.1-ms CUDA-graph replays right after another process had the GPU
    measured 0.238 ms per call where fifty back to back measured 0.131 (the H200, session 11). Each
    path's calls per sample and warm-up calls are in its extras' "sampling".
    ready_s: a path whose worker is not ready (compiled, first output saved) that many seconds after the
    workers start is left out, its worker ended, and the others are timed: on the H200 max-autotune's
    compile of ResNet-18 outlasted a 10-minute device call, and every other path's numbers went with it.
    A left-out path has no samples; its extras say why ({"error": ..., "left_out": True}). The first path
    (the reference for the error column) is never left out: without it nothing is compared.
    """
    import torch

    def ask(p, request: str) -> str:
        """The worker's reply line; "" when it has exited."""
        try:
            p.stdin.write(request + "\n")
        except BrokenPipeError:
            return ""
        return p.stdout.readline()

    def ms(n: str, request: str) -> float:
        """A timing reply; a worker that died or answered something else ends this model's timing, clearly."""
        p = procs[n][0]
        line = ask(p, request)
        try:
            return float(line)
        except ValueError:
            raise SystemExit(f"path '{n}' {'exited' if not line else 'answered ' + repr(line[:200])} during timing "
                             f"(exit {p.poll()})") from None

    procs = {}
    for name in names:
        out_file = f"{out_dir}/{name.replace(' ', '_')}.pt"
        procs[name] = (subprocess.Popen(worker_cmd(name, out_file), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1), out_file)
    left_out, ready_after = {}, {}
    try:
        started = time.monotonic()
        ready_by = started + ready_s if ready_s else None
        for name, (p, _) in list(procs.items()):
            line = _ready_line(p, None if name == names[0] else ready_by)
            # Seconds from the workers' start to this one's first output (compile, autotune, capture; all paths
            # compile at once, so each is an upper bound of its own compile): max-autotune's cost to a user.
            ready_after[name] = round(time.monotonic() - started, 1)
            if line is not None and line.strip() != "ready" and name == names[0]:
                raise SystemExit(f"path '{name}' failed to start: {line.strip()!r} (exit {p.poll()})")
            if line is None or line.strip() != "ready":
                # Still compiling at the deadline, or failed in the program's loop (reduce-overhead on a training
                # step, say): a result, reported; the other paths are timed.
                p.kill()
                p.wait()
                why = (f"not ready {ready_s:g} s after the workers started (still compiling)" if line is None else
                       f"failed in the program's loop (exit {p.poll()}; its traceback is on stderr above)")
                left_out[name] = {"error": f"{why}: left out, the other paths timed", "left_out": True}
                del procs[name]
        names = [n for n in names if n in procs]
        ref = torch.load(procs[names[0]][1])
        errors = {n: float((torch.load(f) - ref).abs().max()) for n, (_, f) in procs.items()}
        samples = {n: [] for n in names}
        plan = {n: (calls, 0) for n in names}  # path -> (calls per sample, untimed calls before it)
        if min_sample_ms:
            for n in names:  # the smaller of two probes: the first call after an idle wait runs slow
                probe = min(ms(n, f"time {calls}"), ms(n, f"time {calls}"))
                k = max(calls, min(100_000, math.ceil(min_sample_ms / max(probe, 1e-6))))
                plan[n] = (k, k // 4)
        deadline, r = time.monotonic() + seconds, 0
        while time.monotonic() < deadline or r < min_rounds:
            for n in names[r % len(names):] + names[: r % len(names)]:
                samples[n].append(ms(n, "time {} {}".format(*plan[n])))
            r += 1
        profiles = {}  # every path before any quits: an exiting worker does not disturb another's profile
        if profile_calls:
            for n, (p, _) in procs.items():
                line = ask(p, f"profile {profile_calls}")
                profiles[n] = json.loads(line) if line else {"error": f"worker exited during profile (exit {p.poll()})"}
        extras = {}
        for n, (p, _) in procs.items():
            line = ask(p, "quit")
            extras[n] = json.loads(line) if line else {"error": f"worker exited (exit {p.poll()})"}
            extras[n]["sampling"] = {"calls": plan[n][0], "warmup": plan[n][1], "ready_after_s": ready_after[n]}
            if n in profiles:
                extras[n]["profile"] = profiles[n]
        return samples, errors, {**extras, **left_out}
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.kill()


def _ready_line(p: subprocess.Popen, by: float | None) -> str | None:
    """The worker's first line; None when `by` (a monotonic time) passes first."""
    if by is not None:
        import select

        if not select.select([p.stdout], [], [], max(0.0, by - time.monotonic()))[0]:
            return None
    return p.stdout.readline()


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
