"""The deciding process's own clock for a worker's timed samples, which nothing inside the worker's process can
move: the time the parent wrote each sample's request, and the kernel's timestamps of the marks the worker sends as
the sample's window opens and closes (gate/marksock.py). The number the worker reports is never used to decide.
And its word on whether the original's samples could be measured at all (`implausible`).

A sample's time is its marked window; on the CPU it ends instead when the parent stops the worker after the closing
mark to read the outputs itself (gate/freeze.py), so that what any thread did after the window is timed; and, with
TILESMITH_GATE_REFILL=1, it starts when the parent lets the worker run after writing the sample's input values into
it (gate/refill.py), so that what any thread did before the window is timed too, less the wait for a CPU that the
machine made (procfs.forgiven_ns: on a loaded machine the thawed worker waits for a core), never below the work its
threads did over their CPUs. Otherwise (a GPU, where device memory is not in /proc; the CPU by default) the span
from its request to that window holds the same work for every role (reading the request, refilling the same buffers
with the same values, synchronising the device), and nothing of the candidate's runs on the worker's own thread
there: no profile or trace function (the audit hook refuses one), no finalizer (the collector is off), no signal
handler (none can be installed once the candidate has loaded: gate/worker/seccomp.py), and no torch mode or
dispatcher kernel left by the warm-up (worker.op_time checks before the refill). A native thread of the candidate's
own could still run beside the refill and read the values it writes, off the clock (tests/redteam_freeze.py): on a
GPU, not closed yet. That span is not compared between processes: honest spans differ by hundreds of microseconds to
milliseconds between two workers on a loaded machine (an A/A candidate's came 278 us later than the original's at
the median on an H100 shared with other gate jobs, and 5.5 ms later on the 2-core CPU machine under load), which
rejected honest code as work done off the clock when compared, and biased every decision against the candidate when
charged to it. It is reported (Timing.before_window_us).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tilesmith.gate import procfs
from tilesmith.gate.verdict import Reason


@dataclass
class Sample:
    """One timed sample as the parent measured it."""

    ns: int  # the window: the kernel's timestamps of its marks (the parent's wall span where there are none)
    pre_ns: int = 0  # from the request's write to the window's opening mark (0 where there are no marks)
    short_ns: int = 0  # how much shorter the worker's own number was than its marked window (reported only)
    post_ns: int = 0  # from the closing mark to the parent's stop, counted in ns (gate/freeze.py; 0 without a stop)
    waited_ns: int = 0  # a filled sample's wait for a CPU that nothing of the worker's caused, taken out (procfs)


def measured(worker, reply: dict, wall_ns: int, least_ns: int, filled: bool = False) -> tuple[Sample | None,
                                                                                              Reason | None]:
    """The sample of `reply`, timed by the parent: `worker.marks` (the kernel's send times of the window's two marks,
    None where the platform cannot timestamp them) and `worker.sent_ns` (when the request was written, on the
    clock the kernel stamps them with); `wall_ns` the parent's span from request to reply, the time where there
    are no marks. `least_ns`: the program's host time the sample had to spend (gate.timed.program_gap_ns).
    filled: the parent wrote the sample's values into the stopped worker and let it run at `worker.sent_ns`
    (gate/refill.py): the sample starts there, not at the window's opening mark."""
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
        sent = getattr(worker, "sent_ns", None)
        s = Sample(marks[1] - marks[0], max(0, marks[0] - sent) if sent is not None else 0, marks[1] - marks[0] - ns)
        if getattr(worker, "stops", False):  # the sample ends when the parent stopped the worker (gate/freeze.py)
            stop = getattr(worker, "stop_ns", None)
            if getattr(worker, "freeze_error", ""):
                return None, Reason("outputs-unreadable", "the parent could not read the timed calls' outputs out of "
                                                          f"the stopped worker: {worker.freeze_error}")
            if stop is None or stop < marks[1]:
                return None, Reason("timing-forged", "the timing worker replied without waiting to be stopped at its "
                                                     "window's end: what it did after the window cannot be timed")
            s.post_ns, s.ns = stop - marks[1], stop - marks[0]
            if filled:  # everything after the values were written is the sample's, the span before the window too
                if sent is None or sent > marks[0]:
                    return None, Reason("timing-forged", "the timing worker's window opened before the parent let it "
                                                         "run with the sample's values")
                # Less the wait for a CPU that the machine's other work, not the worker's, made (procfs.forgiven_ns):
                # on a loaded machine the thawed worker waits for a core before it runs.
                begun, ended = getattr(worker, "sched", (None, None))
                s.waited_ns = min(procfs.forgiven_ns(begun, ended, stop - sent), stop - sent - 1)
                s.ns = stop - sent - s.waited_ns
    if s.ns < least_ns:
        return None, Reason("timing-forged", f"a sample of {s.ns / 1e6:.3f} ms is shorter than the {least_ns / 1e6:.3f} "
                                             "ms of the program's host time its calls had to spend: the wait was skipped")
    return s, None


# The original's own samples say whether the machine let them be measured: one sample per call this many times its
# time alone (and a millisecond more), and the pass is measured again; in each
# of timing.UNSTABLE_PASSES passes, and the decision is `unstable-timing`.
# Seen on the 2-core machine with another job beside: the original's samples 28-48 ms thirteen times, then 0.02 ms
# (its kernels sum to 0.014 ms), and a 0.8x candidate accepted at 1.43x on them. A finer test (thirds of the pass
# whose medians differ 3x) fired on honest originals in the CPU suite, whose other test process comes and goes.
IMPLAUSIBLE_FACTOR = 5.0


def implausible(b_all: list, i_all: list, reps: int, per_call_ns: float) -> str:
    """Why the original's samples (apart, and beside) cannot be trusted, or "". per_call_ns: its time per call alone,
    with the program's host time before each call (gap_ns) included."""
    for name, xs in (("in its own worker", b_all), ("beside the candidate", i_all)):
        if len(xs) < 3:
            continue
        per_call = statistics.median(xs) / reps
        if per_call > IMPLAUSIBLE_FACTOR * per_call_ns and per_call > per_call_ns + 1e6:
            return (f"the original {name} ran {per_call / 1e6:.3f} ms per call, {per_call / per_call_ns:.0f}x its "
                    f"{per_call_ns / 1e6:.3f} ms alone")
    return ""
