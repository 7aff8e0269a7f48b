"""The gate against cheats that do a candidate's work after its timed window's closing mark (tests/redteam_late.py),
judged as tests/test_gate_redteam.py judges the red team: the static stage switched off, only the dynamic defences
acting.

Main accepts both today (the xfails below): an output whose memory is registered with userfaultfd is computed by the
first read of it, which is the worker's digest, after the closing mark and off the clock; only the two calls the
reservoir keeps are ever computed. Measured on the 2-core VM, one OpenMP thread, seed 0, 4 s budget:
computes_its_outputs_on_first_read accepted at 8.93x (low 7.43x; confirmed 9.14x), and
computes_its_outputs_on_first_read_from_python at 6.96x (low 5.62x; confirmed 6.25x) and 6.38x (confirmed 6.31x).

LATE names the reason a defence would give; none exists yet. One that would see both: the parent stops the worker
(SIGSTOP, every thread) as the window closes and reads the kept outputs itself through /proc/PID/mem: a page of a
userfaultfd region no one has filled reads as EIO from outside (checked on kernel 6.18, with and without
UFFD_USER_MODE_ONLY), where the worker's own read blocks until the candidate's thread fills it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import gate_helpers as h
from tests import redteam_late
from tests.test_gate_redteam import _SCREEN, _judge
from tilesmith.gate import static

LATE = "late-outputs"  # proposed: the kept outputs were not in memory when the window closed

_ACCEPTED_TODAY = ("accepted on main: the outputs are computed by the digest's first read of them, after the window's "
                   "closing mark (userfaultfd); nothing after the window sees it")

LATE_CHEATS = [
    pytest.param(redteam_late.computes_its_outputs_on_first_read, id="computes_its_outputs_on_first_read",
                 marks=pytest.mark.xfail(strict=True, reason=_ACCEPTED_TODAY)),
    pytest.param(redteam_late.computes_its_outputs_on_first_read_from_python,
                 id="computes_its_outputs_on_first_read_from_python",
                 marks=pytest.mark.xfail(strict=True, reason=_ACCEPTED_TODAY)),
]


@pytest.fixture(scope="module")
def inf_graph(inference_ws) -> Path:
    return h.graph_of(inference_ws)


@pytest.fixture
def screen_off(monkeypatch):
    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call; the allowlist is off too


def test_only_the_static_stage_refuses_the_late_cheats_today(inf_graph):
    """The static stage's word on them (the dynamic tests below switch it off): the native one is refused by the
    screen; the one through torch's own ctypes passes the screen and only the allowlist refuses it."""
    text = (inf_graph / "wrapper.py").read_text()
    native = redteam_late.computes_its_outputs_on_first_read(text)
    assert {f.code for f in _SCREEN(native)} >= {"static-native"}
    python = redteam_late.computes_its_outputs_on_first_read_from_python(text)
    assert _SCREEN(python) == []
    assert static.allowlist(python)


@pytest.mark.parametrize("maker", LATE_CHEATS)
def test_gate_rejects_a_cheat_that_computes_its_outputs_after_the_window(inf_graph, tmp_path, screen_off, monkeypatch,
                                                                        maker):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    v = _judge(inf_graph, maker((inf_graph / "wrapper.py").read_text()), tmp_path)
    t = v.first.timing if v.first else None
    assert not v.accepted, f"accepted at {t.speedup:.2f}x (low {t.speedup_low:.2f}x)" if t else v
    assert v.codes == [LATE] and v.stage == "timing", v.reasons
