"""The notes a graph's report carries about how its verdicts were timed: the program's host time before each call, the
deciding process's own clock, NaN/inf placement allowed, and wins a busy machine cost (tilesmith/report/build.py
puts them on each graph)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from tilesmith import runs


def timing_notes(verdicts) -> list[str]:
    """What the timing of the graph's verdicts owes to how the gate times: the program's host time before each call,
    the deciding process's own clock, NaN/inf placement allowed."""
    out = []
    gap_us = max((number(deciding_timing(v).get("gap_us")) or 0.0 for _, v, _ in verdicts), default=0.0)
    if gap_us:
        out.append(f"timed as the program runs it: {gap_us:.1f} us of the program's own host time (measured "
                   "at capture) before each timed call, original and candidate alike")
    marked = [deciding_timing(v) for _, v, _ in verdicts
              if v.get("accepted") and deciding_timing(v).get("window_short_original_us")]
    if marked:  # the deciding process's own clock (gate/windows.py)
        w = max(marked, key=lambda x: number(x.get("window_short_us")) or 0.0)
        late = (number(w.get("before_window_us")) or 0.0) - (number(w.get("before_window_original_us")) or 0.0)
        out.append(f"accepted samples timed by the gate's own clock (kernel timestamps of each window's marks): the "
                   f"candidate worker's own numbers fell {number(w.get('window_short_us')) or 0.0:.0f} us short of "
                   "them "
                   f"(median), the original's {number(w.get('window_short_original_us')) or 0.0:.0f} us; its windows "
                   f"opened {abs(late):.0f} us {'later' if late >= 0 else 'sooner'} after their requests than the "
                   + ("original's (median; inside the samples: the gate wrote each sample's inputs into the stopped "
                      "worker and timed it from there, gate/refill.py" + _waited(w) + ")"
                      if w.get("inputs_from_parent") else
                      "original's (median; the span before a window is reported, not charged: gate/windows.py)"))
    if note := _nonfinite_note([v for _, v, _ in verdicts if v.get("accepted")]):
        out.append(note)
    if note := _slow_worker_note(verdicts):
        out.append(note)
    if note := _retried_note(verdicts):
        out.append(note)
    return out


def _retried_note(verdicts) -> str:
    """Decisions with passes a busy machine lost and the gate measured again (the verdict's `retried`: the candidate's
    worker as a whole ran the original slower than the original's own worker did; gate/readings.py slow_worker)."""
    hits = [(index, v) for index, v, _ in verdicts if isinstance(v.get("retried"), list) and v["retried"]]
    if not hits:
        return ""
    won = sum(1 for _, v in hits if v.get("accepted"))
    passes = sum(len(v["retried"]) for _, v in hits)
    names = ", ".join(str(i) for i, _ in hits[:8]) + (f" and {len(hits) - 8} more" if len(hits) > 8 else "")
    return (f"{passes} timing pass(es) of {len(hits)} decision(s) measured again in a fresh worker (candidates {names}): "
            "the candidate's worker ran the original slower than the original's own worker for the whole pass, a busy "
            f"machine's doing; {won} of those decisions accepted, every counted pass judged as any other")


# A rejected pass whose candidate's worker as a whole ran this many times slower than the original's own worker (its
# copy of the original too), while beside that copy the candidate cleared the bar: the machine's doing. The gate
# measures such a pass again, a few times a decision (gate/readings.py slow_worker, from 1.15x); these are the ones
# still lost, where the difference is large enough to say so. Beside two CPU hogs on 2 cores such workers ran 8-16x slower.
SLOW_WORKER = 2.0


def _slow_worker_note(verdicts) -> str:
    """Candidates rejected as not faster that were faster beside the original in their own worker, in a pass where
    that worker as a whole ran SLOW_WORKER or more times slower than the original's: on a busy machine one worker can
    wait for the CPU for a whole pass. Said so the user can judge them again on a quieter machine; the verdict stands
    (the candidate's own process could have slowed itself, and the apart comparison binds): what the gate's retries
    (Policy.busy_retries) did not recover."""
    hits = []
    for index, v, f in verdicts:
        codes = [r.get("code") for r in v.get("reasons") or [] if isinstance(r, dict)]
        if v.get("accepted") or "not-faster" not in codes:
            continue
        bar = 1.0 + (number(v.get("min_improvement")) or 0.02)
        for p in (v.get("first"), v.get("confirmation")):
            t = p.get("timing") if isinstance(p, dict) else None
            if not isinstance(t, dict) or not t.get("baseline_ns") or not t.get("beside_ns"):
                continue
            try:
                slow = statistics.median(t["beside_ns"]) / statistics.median(t["baseline_ns"])
            except (TypeError, ZeroDivisionError, statistics.StatisticsError):
                continue
            if (number(t.get("beside_low")) or 0.0) > bar and slow >= SLOW_WORKER:
                beside = number(t.get("beside_speedup")) or 0.0
                hits.append((f"candidate {index} ({_attempt_file(f, v)})", beside, slow))
                break
    if not hits:
        return ""
    names = "; ".join(n for n, _, _ in hits[:6]) + (f" and {len(hits) - 6} more" if len(hits) > 6 else "")
    return (f"{len(hits)} candidate(s) rejected as not faster were faster beside the original in their own worker "
            f"(up to {max(b for _, b, _ in hits):.2f}x) while that worker as a whole ran "
            f"{min(x for _, _, x in hits):.1f}-{max(x for _, _, x in hits):.1f}x slower than the original's for the "
            "pass: a busy machine's doing more than the candidate's. The gate binds on the original in its own worker, "
            "so they stay rejected; judge one again on a quiet machine with `tilesmith validate GRAPH_DIR FILE`: "
            + names)


def _attempt_file(verdict_file: Path, v: dict) -> str:
    """The track's kept attempt whose bytes the verdict judged (the run keeps its last few); or why there is none."""
    track = verdict_file.parent.parent
    want = v.get("candidate_sha256")
    for a in sorted((track / "attempts").glob("attempt_*.py")) if want else []:
        if runs.sha256_file(a) == want:
            return str(a)
    return "its source is no longer kept: the run keeps its last attempts only"


def _waited(timing: dict) -> str:
    """The wait for a CPU taken out of filled samples (gate/procfs.forgiven_ns), where there was any."""
    cand, orig = number(timing.get("waited_us")) or 0.0, number(timing.get("waited_original_us")) or 0.0
    if not cand and not orig:
        return ""
    return (f"; less each sample's wait for a CPU that the machine's other work made: {cand:.0f} us the candidate's, "
            f"{orig:.0f} us the original's (median)")


def _nonfinite_note(accepted: list[dict]) -> str:
    """What the accepted verdicts owe to --allow-nonfinite-differences (Policy.allow_nonfinite_differences), if
    anything: a win that places NaN/inf unlike the original on the gate's special-value inputs."""
    used = [w for v in accepted if v.get("allow_nonfinite_differences") for w in v.get("warnings") or []
            if isinstance(w, dict) and w.get("code") == "nonfinite-differences-allowed"]
    if used:
        return (f"accepted with --allow-nonfinite-differences: the win places NaN/inf unlike the original on inputs "
                f"holding NaN, inf or extreme values ({len(used)} output(s); e.g. {str(used[0].get('message'))[:200]})")
    if any(v.get("allow_nonfinite_differences") for v in accepted):
        return "judged with --allow-nonfinite-differences; the accepted candidates place NaN/inf as the original does"
    return ""


def deciding_timing(v: dict) -> dict:
    """The deciding pass's timing: the confirmation when it ran, else the first pass."""
    for k in ("confirmation", "first"):
        p = v.get(k)
        if isinstance(p, dict) and isinstance(p.get("timing"), dict):
            return p["timing"]
    return {}


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
