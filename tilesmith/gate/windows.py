"""The deciding process's own clock for a worker's timed samples, which nothing inside the worker's process can
move: the time the parent wrote each sample's request, and the kernel's timestamps of the marks the worker sends as
the sample's window opens and closes (proc._mark_socket). The number the worker reports is never used to decide.

A sample's time is its marked window, plus how much longer than the original's in its own worker (same round) the
span from its request to that window was, where it was longer. That span holds the same work for every role (reading the request,
refilling the same buffers with the same values, synchronising the device), and candidate code runs in none of it
unless it found a way in that the worker does not close: whatever runs there after the sample's input values are
known is charged to the sample, never left off the clock, and honest noise there (a loaded CPU or a GPU shared with
other processes: on an H100 with four gate jobs beside, an A/A candidate's spans came 278 us later than the
original's at the median) costs an honest candidate little (in the median of its rounds, none where its span is
no longer than the original's half the time), and is never a rejection of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilesmith.gate.verdict import Reason


@dataclass
class Sample:
    """One timed sample as the parent measured it."""

    ns: int  # the window: the kernel's timestamps of its marks (the parent's wall span where there are none)
    pre_ns: int = 0  # from the request's write to the window's opening mark (0 where there are no marks)
    short_ns: int = 0  # how much shorter the worker's own number was than its marked window (reported only)


def measured(worker, reply: dict, wall_ns: int, least_ns: int) -> tuple[Sample | None, Reason | None]:
    """The sample of `reply`, timed by the parent: `worker.marks` (the kernel's send times of the window's two marks,
    None where the platform cannot timestamp them) and `worker.sent_ns` (when the request was written, on the
    clock the kernel stamps them with); `wall_ns` the parent's span from request to reply, the time where there
    are no marks. `least_ns`: the program's host time the sample had to spend (gate.timed.program_gap_ns)."""
    ns = reply.get("ns")
    if not isinstance(ns, int) or isinstance(ns, bool) or ns <= 0:
        return None, Reason("timing-forged", "the timing worker returned a malformed sample")
    marks = getattr(worker, "marks", None)
    if marks is None:
        s = Sample(wall_ns)
    elif len(marks) != 2 or min(marks) < 0 or marks[1] < marks[0]:
        return None, Reason("timing-forged", f"the timing worker's sample came with {len(marks)} window marks, not 2 "
                                             "timestamped ones: the window it ran cannot be measured")
    else:
        sent = getattr(worker, "sent_ns", 0) or marks[0]
        s = Sample(marks[1] - marks[0], max(0, marks[0] - sent), marks[1] - marks[0] - ns)
    if s.ns < least_ns:
        return None, Reason("timing-forged", f"a sample of {s.ns / 1e6:.3f} ms is shorter than the {least_ns / 1e6:.3f} "
                                             "ms of the program's host time its calls had to spend: the wait was skipped")
    return s, None


def charged(samples: list) -> list[int]:
    """The time each (side, Sample) of one round counts for: its window, plus (for every side but the original
    apart) how much longer its span before the window was than the original's apart in this round, where it was
    longer. Never less: a span shorter than the original's is noise (the refill is the worker's, the same for every
    role), and crediting it made a 100x candidate's few-microsecond windows swing with it (183x, then 37x)."""
    apart = next((s for side, s in samples if side == "apart"), None)
    return [s.ns + (max(0, s.pre_ns - apart.pre_ns) if apart is not None and side != "apart" else 0)
            for side, s in samples]
