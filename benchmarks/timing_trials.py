"""Calibrating the timing decision rule on its own: the gate's timing stage (a real worker, the same rotating
input buffers, paired interleaved rounds, adaptive stopping and statistic: `timing.measure`) run many
times in one worker, on wrappers the caller trusts (the original, or a copy of it slowed on purpose).

A full decision costs seconds of worker start-up; a false-accept rate near 0.5 % needs hundreds of
trials, so gate_calibration.py measures the rule here and a few full decisions besides. Benchmark code: the
gate itself never calls it.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tilesmith import paths
from tilesmith.gate.verdict import Policy


@dataclass
class TimingTrial:
    accepted: bool
    speedup: float
    speedup_low: float
    samples: int  # paired rounds this trial took before it stopped
    wall_s: float  # the trial's timing requests, parent's clock
    timed_s: float  # sum of the raw samples: time the device spent in timed calls
    apart_speedup: float = 0.0  # against the baseline in its own worker
    beside_speedup: float = 0.0  # against the baseline in the candidate's worker


@dataclass
class TimingCalibration:
    mode: str
    calls_per_sample: int
    per_call_ms: float  # the baseline alone, median of 7 calls
    setup_s: float  # worker start, loads and timing set-up, once
    trials: list[TimingTrial] = field(default_factory=list)


def timing_trials(graph_dir, candidate_path, policy: Policy, trials: int, baseline_path=None,
                  budget_s: float | None = None, on_trial=None) -> TimingCalibration:
    """Run the timing stage `trials` times (or until budget_s wall seconds are spent).

    graph_dir: a captured graph (its inputs make the rotating buffers, as in the gate).
    candidate_path: the wrapper timed as the candidate (trusted: this is not a verdict).
    baseline_path: the wrapper timed as the baseline; None times the graph's own wrapper.
    policy: the same fields the gate uses (min_improvement, confidence, futility_confidence, min_rounds,
    max_rounds, time_budget_s, target_sample_ms, rotating_sets, seed, mode).
    on_trial(i, TimingTrial) is called after each trial.
    """
    from tilesmith.capture import loading
    from tilesmith.gate import graph_device, resolve_mode, timing
    from tilesmith.gate.inputs import parameter_indices
    from tilesmith.gate.original import timing_contents
    from tilesmith.gate.proc import Worker

    t0 = time.monotonic()
    gdir = paths.absolute(graph_dir)
    data = loading.load_graph_data(gdir, device_map="cpu")
    mode = resolve_mode(policy.mode, data.meta)
    device = graph_device(data.meta)
    contents = timing_contents(data.meta, data.inputs, policy.seed, policy)
    base_role = "best" if baseline_path else "baseline"
    # As in the gate: the baseline in its own worker, the candidate in another, one busy at a time.
    with tempfile.TemporaryDirectory(prefix="tilesmith-calibrate-") as scratch, \
            Worker("baseline", Path(scratch), device, (gdir,)) as wb, \
            Worker("calibration", Path(scratch), device, (gdir,)) as wc:
        _load(wb, wc, gdir, device, policy, candidate_path, baseline_path)
        reps, buffers, per_call_ns = _set_up(wb, wc, base_role, mode, contents, parameter_indices(data.meta), policy)
        out = TimingCalibration(mode, reps, per_call_ns / 1e6, time.monotonic() - t0)
        start = time.monotonic()
        for i in range(trials):
            if budget_s is not None and i and time.monotonic() - start > budget_s:
                break
            w0 = time.monotonic()
            t, reasons, _ = timing.measure(wb, wc, policy, mode, reps, per_call_ns, base_role, len(contents), buffers)
            if t is None:  # forged samples cannot come from trusted wrappers: report, do not hide
                raise RuntimeError(f"timing trial {i} failed: {reasons}")
            wc.request({"op": "checks", "out_file": str(wc.dir / "checks.pt")}, policy.call_timeout_s)  # drop them
            trial = TimingTrial(not reasons, t.speedup, t.speedup_low, t.samples, time.monotonic() - w0,
                                (sum(t.baseline_ns) + sum(t.candidate_ns) + sum(t.beside_ns)) / 1e9,
                                t.apart_speedup, t.beside_speedup)
            out.trials.append(trial)
            if on_trial:
                on_trial(i, trial)
    return out


def _set_up(wb, wc, base_role: str, mode: str, contents: list, shared: set, policy: Policy) -> tuple[int, int, float]:
    """(calls per sample, buffer sets, the baseline's per-call ns as plain launches), sized as the gate sizes
    them, with every role's rotating buffers set up in `mode`: the baseline's solo time as plain launches, and
    in graph mode again from the baseline timed alone in its own mode."""
    import torch

    from tilesmith.gate import sizing, timing
    from tilesmith.gate.original import save_sets

    def setup(role_workers, role_mode: str, buffers: int) -> None:
        for w, role in role_workers:
            f = w.dir / "contents.pt"
            save_sets(f, contents, torch)
            w.request({"op": "time_setup", "sets_file": str(f), "roles": [role], "mode": role_mode,
                       "buffers": buffers}, policy.call_timeout_s)

    everyone = ((wb, base_role), (wc, "candidate"), (wc, "baseline"))
    setup(everyone[:1], "launch", policy.rotating_sets)
    per_call_ns = sizing.solo_ns(wb, base_role, policy.call_timeout_s)
    reps, buffers = sizing.sample_size(policy, per_call_ns, contents, shared)  # as the gate
    setup(everyone, mode, buffers)
    if mode == "graph":  # as the gate: sized again from the original timed alone in its own mode
        reps, buffers, again = sizing.resize(policy, reps, buffers, sizing.solo_ns(wb, base_role, policy.call_timeout_s),
                                             contents, shared)
        if again:
            setup(everyone, mode, buffers)
    return reps, buffers, per_call_ns


def _load(wb, wc, gdir, device: str, policy: Policy, candidate_path, baseline_path) -> None:
    """Load the baseline into `wb`, the candidate and the baseline beside it into `wc` (as the gate does),
    and pin both to the shared CPUs when there are any."""
    from tilesmith.gate import sizing, timing

    best = None
    if baseline_path:
        best = wb.dir / "baseline.py"
        best.write_bytes(Path(baseline_path).read_bytes())
    wb.request({"op": "load", "graph_dir": str(gdir), "baseline": True, "best_file": str(best) if best else None,
                "device": device}, policy.load_timeout_s)
    cand = wc.dir / "candidate.py"
    cand.write_bytes(Path(candidate_path).read_bytes())
    beside = {"baseline": True}  # as in the gate: the baseline is timed beside the candidate too
    if baseline_path:
        (wc.dir / "baseline.py").write_bytes(Path(baseline_path).read_bytes())
        beside = {"baseline_file": str(wc.dir / "baseline.py")}
    wc.request({"op": "load", "graph_dir": str(gdir), "candidate": str(cand), "device": device, **beside},
               policy.load_timeout_s)
    for w in (wb, wc) if sizing.shared_cpus() else ():  # as the gate does before timing
        w.request({"op": "pin", "cpus": sizing.shared_cpus()}, policy.call_timeout_s)
