"""tilesmith.gate.clock: the timed loop the screens share (measure worker, profile worker, kernel bench), on real
torch calls. No assertion rests on how long anything took."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilesmith.gate import clock  # noqa: E402


class _Counting:
    """A real torch call that records the order of calls and syncs it saw."""

    def __init__(self):
        self.log = []
        self.a = torch.randn(64, 64)

    def call(self):
        self.log.append("call")
        return self.a @ self.a

    def sync(self):
        self.log.append("sync")


def test_timed_runs_the_thunk_n_times_between_two_syncs_and_returns_integer_nanoseconds():
    c = _Counting()
    ns = clock.timed(c.call, 5, c.sync)
    assert c.log == ["sync"] + ["call"] * 5 + ["sync"]
    assert isinstance(ns, int) and ns >= 0


def test_timed_hands_each_call_result_to_after_call_in_order_inside_the_window():
    c, seen = _Counting(), []
    clock.timed(c.call, 3, c.sync, after_call=lambda i, out: (seen.append((i, tuple(out.shape))), c.log.append("after")))
    assert seen == [(0, (64, 64)), (1, (64, 64)), (2, (64, 64))]
    assert c.log == ["sync"] + ["call", "after"] * 3 + ["sync"]  # the after-call hooks run before the closing sync


def test_calls_per_sample_stays_between_one_and_the_cap():
    c = _Counting()
    assert clock.calls_per_sample(c.call, c.sync, sample_ms=1e-9) == 1  # any call outlasts a femtosecond sample
    assert clock.calls_per_sample(c.call, c.sync, sample_ms=1e9, most=7) == 7  # no call makes a 11-day sample short
    assert c.log == ["sync", "call", "sync"] * 2  # one timed call each


def test_device_of_cpu_arguments_is_cpu_and_its_sync_returns_at_once():
    assert clock.device_of([torch.ones(2), 3, None]) == "cpu"
    assert clock.device_of([]) == "cpu"
    assert clock.device_sync("cpu")() is None
