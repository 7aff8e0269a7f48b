"""The gate against cheats that do a candidate's work outside its timed window (tests/redteam_late.py), judged as
tests/test_gate_redteam.py judges the red team: the static stage switched off, only the dynamic defences acting.

Each was accepted before the defence that now rejects it (2-core VM, one OpenMP thread, seed 0, 4 s budget):
- an output whose memory is registered with userfaultfd is computed by the first read of it, which was the worker's
  own digest after the closing mark, and only the two calls the reservoir keeps ever are
  (computes_its_outputs_on_first_read: gcc-built fault server, accepted at 8.93x, low 7.43x, confirmed 9.14x;
  ..._from_python, torch's own ctypes and a raw thread: 6.96x and 6.38x, confirmed). Now the parent stops the worker
  and reads the outputs itself (gate/freeze.py): an unfilled userfaultfd page reads as EIO from outside
  (`outputs-unreadable`), and the Python one's fault-serving thread, left waiting, is seen after the request;
- a callback queued with Py_AddPendingCall runs on the worker's main thread at the interpreter's next check, as a
  signal handler would, with no signal: after the closing mark it filled the checked outputs
  (fills_its_outputs_from_a_pending_call: 3.44x, 3.84x, 4.02x, confirmed), and at op_time's entry it computed every
  timed call from the request's fill and perturb before the refill (precomputes_the_sample_from_a_pending_call:
  11.9x, 11.7x, 11.8x, confirmed; 3.19x on the stopped-worker branch before the next defence). Now the worker serves
  from a thread of its own and its main thread never runs bytecode again (gate/worker/serve.py main): the callback
  never runs, the late one leaves its outputs uncomputed and the early one answers nothing.
With the static stage on, all four are refused there (the native one by the screen, the others by the allowlist).
"""

from __future__ import annotations


import pytest

from tests import redteam_late
from tests.test_gate_redteam import _SCREEN, _judge, inf_graph, screen_off  # noqa: F401  (fixtures)
from tilesmith.gate import static

# The parent's read of an output's unfilled userfaultfd page fails (gate/freeze.py).
LATE = "outputs-unreadable"


LATE_CHEATS = [
    pytest.param(redteam_late.computes_its_outputs_on_first_read, LATE, id="computes_its_outputs_on_first_read"),
    # The parent's read of its unfilled pages fails too, but first its fault-serving thread, still waiting for a read
    # from inside the worker that never comes, is seen by the checks after the request.
    pytest.param(redteam_late.computes_its_outputs_on_first_read_from_python, "process-state",
                 id="computes_its_outputs_on_first_read_from_python"),
    pytest.param(redteam_late.fills_its_outputs_from_a_pending_call, "wrong-values-in-timing",
                 id="fills_its_outputs_from_a_pending_call"),
    # Before the window rather than after it: the span from the sample's request to its opening mark.
    pytest.param(redteam_late.precomputes_the_sample_from_a_pending_call, "not-faster",
                 id="precomputes_the_sample_from_a_pending_call"),
]


def test_the_static_stage_refuses_the_late_cheats_too(inf_graph):
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
