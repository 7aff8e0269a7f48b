"""The gate against cheats aimed at the stopped-worker read and the parked main thread (tests/redteam_freeze.py),
judged as tests/test_gate_redteam.py judges the red team: the static stage switched off, only the dynamic defences
acting.

Both are accepted by branch `freeze` (1a4d71f) with the screen off (2-core VM under a load average of 10-13, one
OpenMP thread, seed 0, 4 s budget), so their tests are xfail(strict) until a defence rejects them:
- rigs_the_reservoirs_draws: os.urandom's PyMethodDef rewritten (ctypes) to answer zeros in a timed window, so the
  kept call is always the last and only it runs (accepted 2 of 2 at 4 calls a sample: 1.61x low 1.16x, 1.92x low
  1.42x; the sample is bounded by calls_per_sample: at 1 call it cannot gain);
- precomputes_the_kept_call_while_the_refill_runs: the same, and that last call computed by a native thread that
  takes the GIL inside the refill's torch ops, once its buffer set holds the sample's values (accepted 2 of 2 at 3
  calls a sample: 3.76x low 1.64x, 4.23x low 1.78x; before_window_us 3.9-6.3 ms against the original's 2.4-2.6 ms).
What would close them: the kept call drawn by the parent (told to the worker only after the stop, or every call's
output layout sent so the parent picks which to read), and the span before the window either compared or charged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import gate_helpers as h
from tests import redteam_freeze
from tests.test_gate_redteam import _SCREEN, _judge
from tilesmith.gate import static

# With the kept call the parent's own choice, an uncomputed one among those checked.
RIGGED = "wrong-values-in-timing"

FREEZE_CHEATS = [
    pytest.param(redteam_freeze.rigs_the_reservoirs_draws, RIGGED, id="rigs_the_reservoirs_draws",
                 marks=pytest.mark.xfail(strict=True, reason="accepted (1.61x, 1.92x): the reservoir's draw is the "
                                                             "worker's os.urandom, whose C entry point ctypes rewrites")),
    pytest.param(redteam_freeze.precomputes_the_kept_call_while_the_refill_runs, RIGGED,
                 id="precomputes_the_kept_call_while_the_refill_runs",
                 marks=pytest.mark.xfail(strict=True, reason="accepted (3.76x, 4.23x): draws rigged, and the span "
                                                             "before the window, where a native thread takes the GIL "
                                                             "during the refill, is neither compared nor charged")),
]


@pytest.fixture(scope="module")
def inf_graph(inference_ws) -> Path:
    return h.graph_of(inference_ws)


@pytest.fixture
def screen_off(monkeypatch):
    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call; the allowlist is off too


def test_the_static_stage_refuses_the_freeze_cheats_too(inf_graph):
    """The static stage's word on them (the dynamic tests below switch it off)."""
    text = (inf_graph / "wrapper.py").read_text()
    assert {f.code for f in _SCREEN(redteam_freeze.rigs_the_reservoirs_draws(text))} >= {"static-module-state"}
    native = redteam_freeze.precomputes_the_kept_call_while_the_refill_runs(text)
    assert {f.code for f in _SCREEN(native)} >= {"static-processes", "static-module-state"}
    for maker in (redteam_freeze.rigs_the_reservoirs_draws, redteam_freeze.precomputes_the_kept_call_while_the_refill_runs):
        assert static.allowlist(maker(text))


@pytest.mark.parametrize("maker,code", FREEZE_CHEATS)
def test_gate_rejects_a_cheat_that_chooses_which_call_is_checked(inf_graph, tmp_path, screen_off, monkeypatch, maker,
                                                                 code):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    v = _judge(inf_graph, maker((inf_graph / "wrapper.py").read_text()), tmp_path)
    t = v.first.timing if v.first else None
    assert not v.accepted, f"accepted at {t.speedup:.2f}x (low {t.speedup_low:.2f}x)" if t else v
    assert v.codes == [code] and v.stage == "timing", v.reasons
