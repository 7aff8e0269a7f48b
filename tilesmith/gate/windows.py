"""The deciding process's own measures of a worker's timed windows, which nothing inside the worker's process can
move: the kernel's timestamps of the marks the worker sends as each window opens and closes (proc._mark_socket),
and the time the parent wrote each sample's request. timing._sample collects them per side; these compare the
candidate's with the original's in its own worker, which no candidate can slow down."""

from __future__ import annotations

import statistics

from tilesmith.gate.verdict import Reason


def _beyond(spans: dict, c_ns: list, least_ns: int, share: float, spread: float) -> tuple | None:
    """(spans counted, the candidate's median, the original's, the slack) where the candidate's spans exceed the
    original's (medians) by more than the largest of `least_ns`, `share` of the candidate's sample and `spread` times
    the original's interquartile range; None where they do not, or too few were measured to judge."""
    c, a = spans.get("candidate") or [], spans.get("apart") or []
    if len(c) < 3 or len(a) < 3:
        return None
    mc, ma = statistics.median(c), statistics.median(a)
    q = statistics.quantiles(a, n=4)
    allowed = max(least_ns, share * statistics.median(c_ns), spread * (q[2] - q[0]))
    return (len(c), mc, ma, allowed) if mc - ma > allowed else None


# A candidate's samples may fall short of the windows the parent saw by at most this much more than the
# original's do in its own worker (medians): the largest of an absolute slack, a share of the candidate's sample,
# and half the spread (interquartile range) of the original's shortfalls, which grows on a loaded machine.
# Measured in the gate on the 2-core VM: honest samples 11.2-11.5 us short of the span of their marks (13.6-14.3
# with two busy loops on the same two cores); the frame cheat reporting a fifth of its window, 2,044 us
# (RESULTS.md, session 17).
FORGED_MIN_NS = 30_000
FORGED_SHARE = 0.03
FORGED_SPREAD = 0.5


def forged_window(short: dict, c_ns: list) -> Reason | None:
    """timing-forged when the candidate's samples are shorter than the windows their marks span (the worker sends a
    mark on a socket as each window opens and closes, and the kernel stamps each with its send time:
    proc._mark_socket) by more than the original's are in its own worker, beyond the slack (FORGED_MIN_NS,
    FORGED_SHARE, FORGED_SPREAD of the original's spread). An honest sample falls short by a few microseconds
    whatever code it timed; a number made smaller inside the worker's process (its clock rebound, the window's
    start moved in its frame, the reply rewritten) cannot also move the times the kernel stamped."""
    over = _beyond(short, c_ns, FORGED_MIN_NS, FORGED_SHARE, FORGED_SPREAD)
    if over is None:
        return None
    n, mc, ma, allowed = over
    return Reason("timing-forged", f"the candidate's samples were {mc / 1e3:.0f} us shorter than the windows the "
                                   f"kernel's timestamps of their marks span (median of {n}; the original's in "
                                   f"its own worker {ma / 1e3:.0f} us, {allowed / 1e3:.0f} us more allowed): the time "
                                   "it reports is not the time it ran")


# A candidate's windows may open later after their requests were written than the original's do in its own worker
# (medians) by at most the largest of an absolute slack, a share of the candidate's sample and the spread of the
# original's spans. Both spans hold the same work (reading the request, refilling the same buffers with the same
# values, synchronising the device); candidate code runs in neither, unless it found a way in that the worker does
# not close (its audit hook refuses profile and trace functions and code swapped in place, and it collects no cycles
# there: no finalizer runs; a signal handler remains). Generous: the two processes hold different memory, and a refill
# that allocates takes longer in one (an honest candidate's came 62 us later than an original's with 3 % of its
# sample allowed, on the 2-core VM).
LATE_MIN_NS = 100_000
LATE_SHARE = 0.05
LATE_SPREAD = 1.0


def work_before_window(pre: dict, c_ns: list) -> Reason | None:
    """timing-forged when the candidate's windows open later after their requests were written than the original's
    in its own worker, beyond the slack (LATE_MIN_NS, LATE_SHARE, LATE_SPREAD): work done there is off the clock,
    after the sample's input values were known (a red-team cheat's profile function computed every call's outputs
    as the request was decoded: its windows opened 1.8-4.5 ms late, at 16x)."""
    over = _beyond(pre, c_ns, LATE_MIN_NS, LATE_SHARE, LATE_SPREAD)
    if over is None:
        return None
    n, mc, ma, allowed = over
    return Reason("timing-forged", f"the candidate's timed windows opened {mc / 1e3:.0f} us after their requests were "
                                   f"written (median of {n}; the original's in its own worker {ma / 1e3:.0f} us, "
                                   f"{allowed / 1e3:.0f} us more allowed): work was done before the window, off the "
                                   "clock, after the sample's input values were known")
