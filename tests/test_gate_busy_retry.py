"""A pass a busy machine lost is measured again (gate/__init__.py _measured, gate/readings.py slow_worker): the
decision's control flow with the passes' timings given, and what stays a rejection. The measured effect on a busy
machine is benchmarks/busy_gate.py's (benchmarks/RESULTS.md)."""

from __future__ import annotations

import pytest

import tilesmith.gate as gate
from tilesmith.gate import readings
from tilesmith.gate.verdict import Policy, Reason, Timing, Verdict


def _timing(apart: float, beside: float) -> Timing:
    """A pass's timing: the candidate `apart` and `beside` times faster (their lower bounds alike); the original in the
    candidate's worker as much slower than in its own as the two estimates differ."""
    slow = beside / apart
    base = [1_000_000] * 20
    return Timing(mode="launch", baseline_ms=1.0, candidate_ms=1.0 / apart, speedup=min(apart, beside),
                  speedup_low=min(apart, beside), speedup_high=min(apart, beside), samples=20, calls_per_sample=1,
                  baseline_ns=base, candidate_ns=[int(1e6 / apart)] * 20, apart_speedup=apart, apart_low=apart,
                  beside_speedup=beside, beside_low=beside, beside_ns=[int(1e6 * slow)] * 20)


BUSY = _timing(apart=0.12, beside=1.4)  # the shape beside two CPU hogs: the candidate's worker slow
WIN = _timing(apart=1.4, beside=1.4)
SLOWER = _timing(apart=0.8, beside=0.8)


def test_the_trigger_is_the_ratio_of_the_two_paired_estimates_not_of_the_raw_medians():
    """A pass whose two workers' medians of the original agree while the estimates differ (the samples either ran or
    waited a hog's slice, the shares of waits differing) is measured again, on every device."""
    t = _timing(0.912, 1.175)
    t = Timing(**{**vars(t), "beside_ns": list(t.baseline_ns)})  # the medians agree
    assert readings.slow_worker(t, 0.02) == pytest.approx(1.175 / 0.912)


def test_slow_worker_is_the_busy_machine_shape_only():
    bar = 0.02
    assert readings.slow_worker(BUSY, bar) == pytest.approx(1.4 / 0.12)
    assert readings.slow_worker(WIN, bar) is None  # cleared both
    assert readings.slow_worker(SLOWER, bar) is None  # not faster beside either
    assert readings.slow_worker(_timing(0.97, 1.05), bar) is None  # two processes of the same code, a few % apart
    assert readings.slow_worker(_timing(0.2, 1.01), bar) is None  # beside, not faster than the bar
    # the two lost wins the medians' ratio missed (benchmarks/RESULTS.md): measured again now
    assert readings.slow_worker(_timing(0.967, 1.125), bar) == pytest.approx(1.125 / 0.967)
    assert readings.slow_worker(_timing(0.912, 1.175), bar) == pytest.approx(1.175 / 0.912)
    assert readings.slow_worker(None, bar) is None
    assert readings.slow_worker(Timing(**{**vars(BUSY), "beside_ns": []}), bar) is None  # not timed beside


class _Prep:
    started: list = []

    def __init__(self, ctx=None):
        self.closed = False
        _Prep.started.append(self)

    def close(self):
        self.closed = True


class _Ctx:
    policy = Policy()
    device = "cpu"
    notes: list = []

    def note(self, stage, text):
        self.notes.append(text)


def _decide(monkeypatch, timings: list) -> tuple[Verdict, bool, list]:
    """_measured over passes whose timings come from `timings` in turn; not-faster where one does not clear both."""
    monkeypatch.setattr(gate, "_Prepared", _Prep)
    left = list(timings)

    def fake_pass(v, p, named_sets, contents, ctx, prep, ref, others, confirmation):
        assert not prep.closed
        p.timing = left.pop(0)
        v.warnings.append(Reason("original-slowed", "said of every pass here"))
        ok = min(p.timing.apart_low, p.timing.beside_low) > 1 + ctx.policy.min_improvement
        if not ok:
            v.reasons.append(Reason("not-faster", "not faster"))
        return ok

    monkeypatch.setattr(gate, "_pass", fake_pass)
    _Prep.started = []
    v = Verdict(accepted=False, stage="timing", graph_key="g", candidate_sha256="x")
    retries = [Policy().busy_retries]
    first = _Prep()
    ok = gate._measured(v, 1, [], [], _Ctx(), first, None, [], False, retries)
    assert all(p.closed for p in _Prep.started)  # every worker it used is gone
    assert not left, "passes left unmeasured"
    return v, ok, retries


def test_a_pass_lost_to_a_slow_worker_is_measured_again_in_a_fresh_one(monkeypatch):
    v, ok, retries = _decide(monkeypatch, [BUSY, WIN])
    assert ok and retries == [Policy().busy_retries - 1] and len(_Prep.started) == 2
    assert v.first.timing is WIN and v.retried[0].timing is BUSY and not v.reasons
    # the set-aside pass's warnings go with it; one busy-retry warning says what happened
    assert [w.code for w in v.warnings] == ["busy-retry", "original-slowed"]
    assert "11.7x slower" in v.warnings[0].message
    d = Verdict.from_dict(v.to_dict())
    assert d.retried[0].timing.beside_ns == BUSY.beside_ns


def test_at_most_busy_retries_a_decision_then_the_rejection_stands(monkeypatch):
    v, ok, retries = _decide(monkeypatch, [BUSY] * (Policy().busy_retries + 1))
    assert not ok and retries == [0] and len(v.retried) == Policy().busy_retries
    assert [r.code for r in v.reasons] == ["not-faster"]


@pytest.mark.parametrize("t", [SLOWER, _timing(0.97, 1.05)], ids=["slower", "its-worker-a-few-percent-slower"])
def test_other_rejections_are_never_measured_again(monkeypatch, t):
    v, ok, retries = _decide(monkeypatch, [t])
    assert not ok and not v.retried and retries == [Policy().busy_retries]


def test_a_rejection_with_another_reason_beside_not_faster_is_not_measured_again(monkeypatch):
    """Only a pass rejected at timing alone, as not faster: a forged or wrong sample never earns another draw."""
    monkeypatch.setattr(gate, "_Prepared", _Prep)

    def fake_pass(v, p, *a):
        p.timing = BUSY
        v.reasons += [Reason("not-faster", ""), Reason("wrong-values-in-timing", "")]
        return False

    monkeypatch.setattr(gate, "_pass", fake_pass)
    v = Verdict(accepted=False, stage="timing", graph_key="g", candidate_sha256="x")
    assert not gate._measured(v, 1, [], [], _Ctx(), _Prep(), None, [], False, [2]) and not v.retried


def test_the_allowance_is_the_decisions_not_each_passes(monkeypatch):
    """The first pass and the confirmation share Policy.busy_retries: a candidate that always makes its worker look slow gets
    that many more passes in all, never more."""
    monkeypatch.setattr(gate, "_Prepared", _Prep)
    seq = [BUSY, WIN, BUSY, BUSY]
    left = list(seq)

    def fake_pass(v, p, *a):
        p.timing = left.pop(0)
        ok = min(p.timing.apart_low, p.timing.beside_low) > 1.02
        if not ok:
            v.reasons.append(Reason("not-faster", ""))
        return ok

    monkeypatch.setattr(gate, "_pass", fake_pass)
    v = Verdict(accepted=False, stage="timing", graph_key="g", candidate_sha256="x")
    retries = [Policy().busy_retries]
    assert gate._measured(v, 1, [], [], _Ctx(), _Prep(), None, [], False, retries)
    assert not gate._measured(v, 2, [], [], _Ctx(), _Prep(), None, [], True, retries)
    assert retries == [0] and len(v.retried) == 2 and not left and v.confirmation.timing is BUSY
