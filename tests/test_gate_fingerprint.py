"""The gate worker's process-state fingerprint (gate/worker/fingerprint.py): settings a candidate could leave behind to
slow down, or change the numerics of, code that runs after it in its worker (the original timed beside it)."""

from __future__ import annotations

import signal
import sys
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from tilesmith.gate.worker.fingerprint import _state_change, process_state


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_mode_left_entered_autocast_and_the_switch_interval_are_state_changes():
    st = SimpleNamespace(state0=process_state())
    assert _state_change(st) == ""
    mode = _PassThrough()
    mode.__enter__()
    try:
        assert "modes [0, 0] -> [1, 0]" in _state_change(st)
    finally:
        mode.__exit__(None, None, None)
    assert _state_change(st) == ""
    with torch.autocast("cpu"):
        assert "autocast" in _state_change(st)
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    try:
        assert "switch_interval" in _state_change(st)
    finally:
        sys.setswitchinterval(old)
    assert _state_change(st) == ""


def test_a_python_signal_handler_or_an_armed_interval_timer_left_behind_is_a_state_change():
    st = SimpleNamespace(state0=process_state())
    old = signal.signal(signal.SIGALRM, lambda signum, frame: None)
    try:
        assert "signals" in _state_change(st)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert _state_change(st) == ""
    old = signal.signal(signal.SIGVTALRM, signal.SIG_IGN)  # armed, the timer must not end the test process
    try:
        signal.setitimer(signal.ITIMER_VIRTUAL, 100.0)
        assert "interval_timers [False, False, False] -> [False, True, False]" in _state_change(st)
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    finally:
        signal.signal(signal.SIGVTALRM, old)
    assert _state_change(st) == ""
