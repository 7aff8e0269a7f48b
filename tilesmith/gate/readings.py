"""What a pass's timing says beyond its decision, read in the deciding process: the warnings a verdict carries (a
speedup to confirm, an original slower beside the candidate than alone or apart), and the shape of a pass a busy
machine lost, which the gate measures again (gate/__init__.py _measured)."""

from __future__ import annotations


from tilesmith.gate.timing import Estimate, estimate
from tilesmith.gate.verdict import Reason, Timing

# Beside the candidate, the original running this much slower than in its own worker is reported (a
# warning, gate/__init__.py): the decision never rests on it, as the candidate must also beat the original
# apart, which it cannot slow down; an honest candidate can leave the caches or the thread pool colder for
# code that follows it in its process (an mm candidate: the loops original 1.25x slower beside it).
SLOWED_BESIDE = 0.10


def warnings(t: Timing, policy, per_call_ns: float) -> list[Reason]:
    """What a pass's timing says without rejecting: a speedup to confirm, an original slower next to the
    candidate than alone or beside it than apart."""
    out = []
    if t.speedup > policy.suspicious_speedup:
        out.append(Reason("suspicious-speedup", f"{t.speedup:.1f}x is above {policy.suspicious_speedup:g}x: "
                                                "confirmed in a fresh worker before acceptance"))
    solo_ms = per_call_ns / 1e6
    if t.baseline_ms > 5 * solo_ms and t.baseline_ms > solo_ms + 1.0:
        # A warning, not a verdict: on a shared machine the solo time can be unlucky; the paired
        # design still compares like with like, and the warning shows up in reports.
        out.append(Reason("baseline-slowed", f"the original took {t.baseline_ms:.3f} ms per call next to the "
                                             f"candidate but {solo_ms:.3f} ms alone: the candidate may slow it down"))
    slowed = slowed_beside(t, policy.confidence)
    if slowed and slowed.low > 1 + SLOWED_BESIDE:
        out.append(Reason("original-slowed", f"the original ran {slowed.speedup:.2f}x slower in the candidate's worker "
                                             f"than in its own (lower bound {slowed.low:.2f}x): the candidate leaves its "
                                             "process slower for code that runs after it (the decision used the "
                                             "original apart)"))
    return out


# A pass rejected as not faster, in which the candidate read faster than the bar beside the original in its own worker
# while its estimate against the original in the original's own worker was this many times lower: the same candidate
# samples against two copies of the same code, so the two copies read differently, and the apart comparison measured
# the processes, not the candidate. On a busy machine one worker can wait for a CPU in many of its samples for a whole
# pass: beside two CPU hogs on 2 cores the lost wins read 1.16-10x so, and a genuine 1.36x win was rejected in 14 of
# 25 decisions with no pass measured again, 0 of 25 with (benchmarks/RESULTS.md); two processes of the same code on a
# quiet machine differ by a few %. The gate measures such a pass again in a fresh worker, at most Policy.busy_retries
# times a decision (gate/__init__.py _measured). The ratio of the two paired estimates, not of the raw samples' medians: each sample either ran or waited
# a hog's whole slice, and two workers' medians can both sit in the fast mode while their shares of waits differ.
SLOW_WORKER = 1.15


def slow_worker(t: Timing | None, min_improvement: float) -> float | None:
    """beside_speedup / apart_speedup (how many times slower the candidate's worker ran the original than the original's
    own worker did, read through the same candidate samples), in a pass whose candidate was not shown faster apart
    and read faster than the bar beside the original (its median; the bound may not have cleared yet when the apart
    comparison ended the pass), where that is SLOW_WORKER or more; else None."""
    if t is None or not t.beside_ns or not t.baseline_ns or t.beside_speedup <= 1 + min_improvement:
        return None
    if t.apart_low > 1 + min_improvement or t.apart_speedup <= 0:
        return None
    slow = t.beside_speedup / t.apart_speedup
    return slow if slow >= SLOW_WORKER else None


def slowed_beside(t: Timing, confidence: float) -> Estimate | None:
    """How much slower the original ran beside the candidate than apart (None when not timed beside)."""
    if not t.beside_ns or len(t.beside_ns) != len(t.baseline_ns):
        return None
    return estimate(t.beside_ns, t.baseline_ns, confidence)
