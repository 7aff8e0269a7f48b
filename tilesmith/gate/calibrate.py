"""Calibrating the timing decision rule on its own: the gate's timing stage (a real worker, the same rotating
input buffers, paired interleaved rounds, adaptive stopping and statistic: `timing.measure`) run many
times in one worker, on wrappers the caller trusts (the original, or a copy of it slowed on purpose).

A full decision costs seconds of worker start-up; a false-accept rate near 0.5 % needs hundreds of
trials, so benchmarks/gate_calibration.py measures the rule here and a few full decisions besides.
"""

from __future__ import annotations

import statistics
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
    import torch

    from tilesmith import loading
    from tilesmith.gate import graph_device, resolve_mode, timing
    from tilesmith.gate.original import rotating, save_sets
    from tilesmith.gate.inputs import make_sets
    from tilesmith.gate.proc import Worker

    t0 = time.monotonic()
    gdir = paths.absolute(graph_dir)
    data = loading.load_graph_data(gdir, device_map="cpu")
    mode = resolve_mode(policy.mode, data.meta)
    device = graph_device(data.meta)
    sets = make_sets(data.meta, data.inputs, policy.seed, policy.random_sets)
    with tempfile.TemporaryDirectory(prefix="tilesmith-calibrate-") as scratch, \
            Worker("calibration", Path(scratch), device) as w:
        w.request({"op": "load", "graph_dir": str(gdir), "baseline": True,
                   "baseline_file": str(baseline_path) if baseline_path else None,
                   "candidate": str(candidate_path), "device": device}, policy.load_timeout_s)
        f = Path(scratch) / "rotating.pt"
        save_sets(f, rotating(sets, policy), torch)
        w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline", "candidate"], "mode": mode},
                  policy.call_timeout_s)
        solo = w.request({"op": "time", "rounds": 7, "reps": 1, "roles": ["baseline"]}, policy.call_timeout_s)
        per_call_ns = max(1000.0, float(statistics.median(solo["ns"]["baseline"])))
        reps = max(1, min(100000, round(policy.target_sample_ms * 1e6 / per_call_ns)))  # as the gate sizes them
        out = TimingCalibration(mode, reps, per_call_ns / 1e6, time.monotonic() - t0)
        start = time.monotonic()
        for i in range(trials):
            if budget_s is not None and i and time.monotonic() - start > budget_s:
                break
            w0 = time.monotonic()
            t, reasons = timing.measure(w, policy, mode, reps, per_call_ns)
            if t is None:  # forged samples cannot come from trusted wrappers: report, do not hide
                raise RuntimeError(f"timing trial {i} failed: {reasons}")
            trial = TimingTrial(not reasons, t.speedup, t.speedup_low, t.samples, time.monotonic() - w0,
                                (sum(t.baseline_ns) + sum(t.candidate_ns)) / 1e9)
            out.trials.append(trial)
            if on_trial:
                on_trial(i, trial)
    return out
