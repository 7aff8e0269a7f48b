"""What the gate is asked (Policy) and what it answers (Verdict): plain dataclasses with a JSON round trip."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Literal

STAGES = ("static", "load", "correctness", "timing", "confirmation")
MODES = ("auto", "launch", "graph")
Mode = Literal["auto", "launch", "graph"]  # graph: the wrapper replayed from a CUDA graph; auto: as captured


def default_min_improvement() -> float:
    """TILESMITH_MIN_IMPROVEMENT, else 0.02 (a candidate must be at least 2 % faster)."""
    raw = os.environ.get("TILESMITH_MIN_IMPROVEMENT", "").strip()
    try:
        return float(raw) if raw else 0.02
    except ValueError:
        return 0.02


@dataclass
class Policy:
    """How strict the gate is and how much time it may spend."""

    min_improvement: float = field(default_factory=default_min_improvement)
    mode: Mode = "auto"
    seed: int = 0  # input sets of the first pass; confirmation derives its own from it
    random_sets: int = 4  # random input sets (normal, uniform, positive, heavy-tailed), cycled
    confidence: float = 0.995  # one-sided, per look at the timing samples
    futility_confidence: float = 0.95  # one-sided upper bound that stops sampling to reject (never to accept)
    time_budget_s: float = 20.0  # timing samples per pass stop after this much wall time
    min_rounds: int = 12  # paired rounds before the first look
    max_rounds: int = 4000  # the time budget normally ends sampling first
    target_sample_ms: float = 2.0  # calls per timed sample are chosen so one sample takes about this long
    rotating_sets: int = 4  # input buffers the timed calls rotate through
    suspicious_speedup: float = 10.0  # above this, the speedup is reported as suspicious
    load_timeout_s: float = 600.0  # a cold compile of the wrapper's kernels can take minutes
    call_timeout_s: float = 120.0  # one correctness step (all input sets) in a worker
    confirm: bool = True
    # Passes of one decision a busy machine lost (the candidate's worker as a whole several times slower than the
    # original's: gate/timing.py slow_worker) that are measured again in a fresh worker; 0: none.
    busy_retries: int = 2
    # The confirmation's worker starts with the others (its startup overlapping the first pass) when the
    # machine has at least this many cores; on fewer it starts when the first pass has passed.
    prestart_min_cores: int = 4
    # A wrapper file timed as the baseline instead of the original: the best source so far when an
    # optimizer loops (each loop must beat the best, not merely the original). Correctness is always
    # judged against the original.
    timing_baseline: str | None = None
    # Load and correctness only (the agent's `check`): the verdict stops after the first pass's
    # correctness, is never accepted, and says so in `checked_only`.
    correctness_only: bool = False
    # Spend the program's own host time between a graph's calls (graph.json program_gap, measured at capture)
    # before each timed call, for every role alike, where capture found it usable (capture/gaps.py).
    program_gap: bool = True
    # The special-value sets (gate/inputs.py special_sets: NaN, +-inf, extreme magnitudes, subnormals, -0.0 in the
    # activations) require NaN, +inf and -inf where the original has them ("nonfinite-mismatch"). True lets them
    # differ there (their finite values are still compared), e.g. a kernel that is meant to handle non-finite
    # inputs its own way; the verdict records it and a warning says where they differed.
    allow_nonfinite_differences: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Reason:
    code: str  # machine-readable, e.g. "wrong-values", "not-faster", "static-threads"
    message: str  # one human sentence

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SetCorrectness:
    """One input set: worst errors over all outputs (abs and relative to the output's max magnitude)."""

    name: str
    ok: bool
    max_abs_error: float = 0.0  # candidate vs original
    max_rel_error: float = 0.0
    ref64_candidate_abs_error: float | None = None  # vs the float64 run of the FX program
    ref64_original_abs_error: float | None = None
    nonfinite_mismatches: int = 0  # elements where NaN/+inf/-inf differ from the original's (special-value sets)


@dataclass
class Timing:
    """Paired timing of one pass; every statistic was computed in the deciding process."""

    mode: str  # launch | graph
    baseline_ms: float  # median per call
    candidate_ms: float
    speedup: float  # baseline / candidate: exp(median of the paired log ratios)
    speedup_low: float  # one-sided lower confidence bound (sign test, Policy.confidence)
    speedup_high: float
    samples: int  # paired rounds
    calls_per_sample: int
    baseline_ns: list[int] = field(default_factory=list)  # raw per-sample totals, nanoseconds
    candidate_ns: list[int] = field(default_factory=list)
    checked_calls: int = 0  # timed calls whose outputs were compared with the original's (parent-chosen)
    # The two comparisons behind speedup (the one with the lower bound is reported above): the baseline
    # timed "apart", in a worker where candidate code never ran, and "beside", in the candidate's own
    # worker. Apart, no candidate can slow the baseline down; beside, no difference between two processes
    # (memory layout, thread placement: several % on a busy machine) can pass for a speedup. Both must clear.
    apart_speedup: float = 0.0
    apart_low: float = 0.0
    beside_speedup: float = 0.0
    beside_low: float = 0.0
    beside_ns: list[int] = field(default_factory=list)  # raw totals of the baseline in the candidate's worker
    # CPU time the candidate's processes used while the original was timed apart, and those samples' wall
    # time: an honest worker is idle then (timing.IDLE_CPU_SHARE).
    idle_cpu_ms: float = 0.0
    idle_wall_ms: float = 0.0
    buffer_sets: int = 0  # rotating input buffer sets, never fewer than calls_per_sample (sizing.sample_size)
    gap_us: float = 0.0  # host time spent before each timed call, both roles: the program's (graph.json program_gap)
    # The share of the pass in which some task on the machine waited for a CPU (/proc/pressure/cpu; 0 where not read),
    # and the budget the pass ran under: policy.time_budget_s, or longer on a busy machine (timing._budget_s)
    busy_share: float = 0.0
    budget_s: float = 0.0
    seconds: float = 0.0  # the pass's sampling, wall time
    # The samples are the windows the deciding process measured (gate/windows.py): the kernel's timestamps of the
    # marks the worker sends as each opens and closes. How much shorter the workers' own numbers were (median, us):
    # the candidate's, and the original's in its own worker.
    window_short_us: float = 0.0
    window_short_original_us: float = 0.0
    # From a sample's request to its window's start, median (us): the candidate's, and the original's in its own
    # worker (reported; gate/windows.py says why it is not compared).
    before_window_us: float = 0.0
    before_window_original_us: float = 0.0
    # From a sample's window's end to the parent's stop of its worker, median (us), counted in the sample (a CPU
    # worker's outputs are read by the parent from the stopped process: gate/freeze.py); 0 where samples do not stop.
    after_window_us: float = 0.0
    after_window_original_us: float = 0.0
    # Filled samples: the median wait for a CPU taken out of them (procfs.forgiven_ns), the candidate's and the original's
    waited_us: float = 0.0
    waited_original_us: float = 0.0
    # The parent wrote each sample's input values into the stopped worker and timed the sample from the moment it let
    # it run (gate/refill.py, CPU workers): the span before the window is then inside the sample, not beside it.
    inputs_from_parent: bool = False


@dataclass
class Pass:
    """One correctness + timing pass (the first one, or the fresh confirmation)."""

    seed: int
    correctness: list[SetCorrectness] = field(default_factory=list)
    timing: Timing | None = None


@dataclass
class Verdict:
    accepted: bool
    stage: str  # the stage reached: static | load | correctness | timing | confirmation
    graph_key: str
    candidate_sha256: str  # of the exact bytes judged; install checks it
    reasons: list[Reason] = field(default_factory=list)  # why rejected; empty when accepted
    warnings: list[Reason] = field(default_factory=list)
    first: Pass | None = None
    confirmation: Pass | None = None
    reference64: bool = False  # whether a float64 run of the FX program was available
    min_improvement: float = 0.02
    wall_s: float = 0.0
    # Wall seconds per step of the deciding thread (gate/context.py StageClock, e.g. "first.timing"); steps that
    # run in the background (the reference worker) are listed too, so they can add up to more than wall_s.
    stage_seconds: dict[str, float] = field(default_factory=dict)
    timing_baseline_sha256: str | None = None  # set when the timing baseline was not the original
    checked_only: bool = False  # judged with Policy.correctness_only: no timing, never accepted
    # The isolation candidate code ran under: "namespaces" (an OS sandbox: own user, PID, mount and network
    # namespaces, read-only file system) or "env-only" (a scrubbed environment only); see tilesmith.launch.sandbox.
    sandbox: str = ""
    # Judged with Policy.allow_nonfinite_differences: NaN/inf placed unlike the original's on the special-value
    # sets was not a rejection (a "nonfinite-differences-allowed" warning says where it happened).
    allow_nonfinite_differences: bool = False
    # Passes set aside and measured again because the candidate's worker as a whole ran several times slower than the
    # original's (a busy machine: gate/__init__.py _measured); each with a busy-retry warning.
    retried: list[Pass] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        d = dict(d)
        d["reasons"] = [Reason(**r) for r in d.get("reasons", [])]
        d["warnings"] = [Reason(**r) for r in d.get("warnings", [])]
        def one(p: dict) -> Pass:
            p = dict(p)
            p["correctness"] = [SetCorrectness(**c) for c in p.get("correctness", [])]
            p["timing"] = Timing(**p["timing"]) if p.get("timing") else None
            return Pass(**p)

        for k in ("first", "confirmation"):
            if d.get(k) is not None:
                d[k] = one(d[k])
        d["retried"] = [one(p) for p in d.get("retried") or []]
        return cls(**d)

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]


def compact_verdict(vd: dict) -> dict:
    """A verdict dict without the raw nanosecond samples (hundreds of numbers a reader, or the agent,
    does not need); everything else as it was."""
    out = json.loads(json.dumps(vd))
    for p in [out.get("first"), out.get("confirmation"), *(out.get("retried") or [])]:
        t = (p or {}).get("timing")
        if t:
            t.pop("baseline_ns", None)
            t.pop("candidate_ns", None)
            t.pop("beside_ns", None)
    return out
