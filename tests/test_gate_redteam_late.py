"""The gate against cheats that do a candidate's work after its timed window's closing mark (tests/redteam_late.py),
judged as tests/test_gate_redteam.py judges the red team: the static stage switched off, only the dynamic defences
acting.

Main accepts these today (the xfails below); each of the first three computes only the two calls the reservoir keeps,
once the window has closed and it can know which they are:
- an output whose memory is registered with userfaultfd is computed by the first read of it, the worker's digest
  (computes_its_outputs_on_first_read: gcc-built fault server, accepted at 8.93x, low 7.43x, confirmed 9.14x; 7.88x
  in pytest; ..._from_python, torch's own ctypes and a raw thread: 6.96x and 6.38x, confirmed 6.25x and 6.31x; 5.95x);
- a callback queued with Py_AddPendingCall runs on the worker's main thread at the interpreter's next check after the
  closing mark, as a signal handler would, with no signal (fills_its_outputs_from_a_pending_call: 3.44x, low 2.97x,
  confirmed 3.66x; 3.84x, confirmed 4.00x; 4.02x).
And, before the window rather than after it, the same pending call computes every timed call's outputs at op_time's
entry, from the request's fill and perturb (precomputes_the_sample_from_a_pending_call: 11.9x, low 10.4x, confirmed
11.8x; 11.7x, confirmed 12.1x).
Measured on the 2-core VM, one OpenMP thread, seed 0, 4 s budget.

What a defence would have to see. The parent can stop the worker (SIGSTOP stops every thread; the worker is its PID
namespace's init, so its own SIGSTOP is ignored and only one from outside the namespace stops it) and read the outputs
itself through /proc/PID/mem: a page of a userfaultfd region no one has filled reads as EIO from outside (kernel 6.18,
with and without UFFD_USER_MODE_ONLY). A pending call runs whenever the main thread runs bytecode, so the worker must
run none between its closing mark and the stop (the write of the mark is itself followed by a check). Work between the
mark and the stop is off the clock unless the window ends at the stop, and a cheat that learns which calls are checked
still computes only those unless the parent picks them after the stop. As a non-root user, a worker forked from the
zygote that makes itself non-dumpable (prctl, not refused) cannot be read: the read's failure must reject.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import gate_helpers as h
from tests import redteam_late
from tests.test_gate_redteam import _SCREEN, _judge
from tilesmith.gate import static

# The reasons the defences proposed would give; none exists yet (the xfails). The parent stops the worker at the
# closing mark and reads the outputs itself: an unfilled userfaultfd page reads as EIO (LATE, a new code). The worker
# serves its requests from a thread other than the main thread, parked in C: the interpreter runs a callback queued
# with Py_AddPendingCall only on its main thread (3.11), so a queued one never runs during a request, the late one
# leaves its outputs uncomputed (wrong-values-in-timing) and the early one answers nothing (not-faster).
LATE = "late-outputs"


def _xfail(why: str):
    return pytest.mark.xfail(strict=True, reason="accepted on main: " + why)


_ON_READ = _xfail("the outputs are computed by the digest's first read of them, after the window's closing mark "
                  "(userfaultfd); nothing after the window sees it")
_PENDING = _xfail("a callback queued with Py_AddPendingCall runs between the worker's bytecodes, as a signal handler "
                  "did, with no signal for the seccomp filter to refuse")

LATE_CHEATS = [
    pytest.param(redteam_late.computes_its_outputs_on_first_read, LATE, id="computes_its_outputs_on_first_read",
                 marks=_ON_READ),
    pytest.param(redteam_late.computes_its_outputs_on_first_read_from_python, LATE,
                 id="computes_its_outputs_on_first_read_from_python", marks=_ON_READ),
    pytest.param(redteam_late.fills_its_outputs_from_a_pending_call, "wrong-values-in-timing",
                 id="fills_its_outputs_from_a_pending_call", marks=_PENDING),
    # Before the window rather than after it: the span from the sample's request to its opening mark.
    pytest.param(redteam_late.precomputes_the_sample_from_a_pending_call, "not-faster",
                 id="precomputes_the_sample_from_a_pending_call", marks=_PENDING),
]


@pytest.fixture(scope="module")
def inf_graph(inference_ws) -> Path:
    return h.graph_of(inference_ws)


@pytest.fixture
def screen_off(monkeypatch):
    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call; the allowlist is off too


def test_only_the_static_stage_refuses_the_late_cheats_today(inf_graph):
    """The static stage's word on them (the dynamic tests below switch it off): the native one is refused by the
    screen; those through torch's own ctypes pass the screen and only the allowlist refuses them."""
    text = (inf_graph / "wrapper.py").read_text()
    native = redteam_late.computes_its_outputs_on_first_read(text)
    assert {f.code for f in _SCREEN(native)} >= {"static-native"}
    for maker in (redteam_late.computes_its_outputs_on_first_read_from_python,
                  redteam_late.fills_its_outputs_from_a_pending_call,
                  redteam_late.precomputes_the_sample_from_a_pending_call):
        python = maker(text)
        assert _SCREEN(python) == []
        assert static.allowlist(python)


@pytest.mark.parametrize("maker,code", LATE_CHEATS)
def test_gate_rejects_a_cheat_that_computes_its_outputs_outside_the_window(inf_graph, tmp_path, screen_off, monkeypatch,
                                                                          maker, code):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    v = _judge(inf_graph, maker((inf_graph / "wrapper.py").read_text()), tmp_path)
    t = v.first.timing if v.first else None
    assert not v.accepted, f"accepted at {t.speedup:.2f}x (low {t.speedup_low:.2f}x)" if t else v
    assert v.codes == [code] and v.stage == "timing", v.reasons
