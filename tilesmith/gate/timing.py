"""Stage 3 statistics, in the deciding process: paired log ratios, a one-sided confidence bound on the
speedup, adaptive sampling under a time budget, and the plausibility checks on raw samples.

A round is one baseline sample and one candidate sample (order alternating, same input buffers);
its log ratio log(baseline_ns / candidate_ns) removes drift common to both. The estimate is the
median of the log ratios, and its bounds are order statistics from the sign test (distribution-free):
on a shared machine a preempted sample inflates one side by a whole time slice, and the median with
its sign-test interval shrugs off up to a third of such samples where a mean and a t interval widen
until nothing is ever accepted. speedup = exp(median) > 1 is faster.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from tilesmith.gate.verdict import Reason, Timing


@dataclass
class Estimate:
    speedup: float  # exp(median log ratio)
    low: float  # one-sided lower bound at `confidence`
    high: float  # one-sided upper bound at `confidence`
    n: int


def sign_test_rank(n: int, confidence: float) -> int:
    """Largest k (1-based) with P(Binomial(n, 1/2) < k) <= 1 - confidence: the k-th smallest of n paired
    differences is a one-sided lower bound of their median at `confidence`; 0 if n is too small."""
    alpha = 1.0 - confidence
    cdf, k = 0.0, 0
    log_half_n = n * math.log(2.0)
    for j in range(n + 1):
        # P(B = j) in log space: 2**n overflows a float past n = 1023
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) - log_half_n)
        if cdf > alpha:
            break
        k = j + 1
    return k


def estimate(baseline_ns: list[int], candidate_ns: list[int], confidence: float) -> Estimate:
    """Median paired speedup with distribution-free one-sided bounds (sign test)."""
    logs = sorted(math.log(b / c) for b, c in zip(baseline_ns, candidate_ns))
    n = len(logs)
    k = sign_test_rank(n, confidence)
    med = statistics.median(logs)
    if k == 0:  # too few rounds for any bound at this confidence
        return Estimate(math.exp(med), 0.0, math.inf, n)
    return Estimate(math.exp(med), math.exp(logs[k - 1]), math.exp(logs[n - k]), n)


def decide(est: Estimate, min_improvement: float, futility_high: float | None = None) -> str:
    """'accept' when the lower bound clears 1 + min_improvement, 'reject' when even the upper bound does
    not, else 'undecided'. futility_high, an upper bound at a lower confidence, may end a hopeless case
    sooner: stopping to reject never adds a false accept (it only gives up some power)."""
    if est.low > 1 + min_improvement:
        return "accept"
    if min(est.high, futility_high if futility_high is not None else math.inf) < 1 + min_improvement:
        return "reject"
    return "undecided"


def check_samples(ns: dict, rounds: int, wall_ns: int) -> Reason | None:
    """The worker's raw samples must be well-formed and fit in the wall time the parent itself measured."""
    try:
        b, c = ns["baseline"], ns["candidate"]
        ok = len(b) == rounds and len(c) == rounds and all(isinstance(x, int) and x > 0 for x in b + c)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        return Reason("timing-forged", "the timing worker returned malformed samples")
    if sum(b) + sum(c) > wall_ns:
        return Reason("timing-forged", f"the samples add up to {(sum(b) + sum(c)) / 1e6:.1f} ms but the request took "
                                       f"{wall_ns / 1e6:.1f} ms of wall time: the clock was tampered with")
    return None


def measure(worker, policy, mode: str, reps: int, per_call_ns: float) -> tuple[Timing | None, list[Reason]]:
    """Paired rounds from a loaded, set-up worker until the bound decides or the time budget is spent."""
    b_all: list[int] = []
    c_all: list[int] = []
    start = time.monotonic()
    batch = policy.min_rounds
    while True:
        budget_ns = batch * 2 * reps * per_call_ns
        w0 = time.perf_counter_ns()
        reply = worker.request({"op": "time", "rounds": batch, "reps": reps, "round0": len(b_all),
                                "roles": ["baseline", "candidate"], "mode": mode},
                               timeout_s=max(60.0, 20 * budget_ns / 1e9))
        wall = time.perf_counter_ns() - w0
        bad = check_samples(reply.get("ns"), batch, wall)
        if bad:
            return None, [bad]
        b_all += reply["ns"]["baseline"]
        c_all += reply["ns"]["candidate"]
        est = estimate(b_all, c_all, policy.confidence)
        state = decide(est, policy.min_improvement, estimate(b_all, c_all, policy.futility_confidence).high)
        spent = time.monotonic() - start
        if state != "undecided" or spent > policy.time_budget_s or len(b_all) >= policy.max_rounds:
            break
        # Double the sample count, but stay inside the budget at the measured rate.
        rate = spent / len(b_all)
        batch = max(4, min(len(b_all), policy.max_rounds - len(b_all), int((policy.time_budget_s - spent) / rate) + 1))
    timing = Timing(mode=mode, baseline_ms=statistics.median(b_all) / reps / 1e6,
                    candidate_ms=statistics.median(c_all) / reps / 1e6, speedup=est.speedup, speedup_low=est.low,
                    speedup_high=est.high, samples=len(b_all), calls_per_sample=reps,
                    baseline_ns=b_all, candidate_ns=c_all)
    if state == "accept":
        return timing, []
    need = 1 + policy.min_improvement
    how = "clearly not" if state == "reject" else "not shown to be"
    return timing, [Reason("not-faster", f"{how} faster: speedup {est.speedup:.3f}x, {policy.confidence:.1%} lower "
                                         f"bound {est.low:.3f}x, needs > {need:.3f}x ({len(b_all)} paired samples)")]
