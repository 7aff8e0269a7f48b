"""The gate worker's seccomp filter (tilesmith/gate/worker/seccomp.py): once installed, the kernel refuses a signal handler
and an armed timer to everything in the process, ctypes included, and lets through what kernels and the worker need.
A filter cannot be removed, so it is only ever installed in a process of its own."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tilesmith.gate.worker import seccomp

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in ("x86_64", "aarch64"),
                                reason="seccomp filters for Linux on x86_64 and aarch64")

_PROBE = r'''
import ctypes, json, signal, threading, torch
from tilesmith.gate.worker import seccomp

torch.randn(256, 256) @ torch.randn(256, 256)  # the thread pool up, as in a worker after its loads
out = {"why": seccomp.install()}
libc = ctypes.CDLL(None, use_errno=True)
tries = {"signal": lambda: signal.signal(signal.SIGALRM, lambda *a: None),
         "setitimer": lambda: signal.setitimer(signal.ITIMER_REAL, 0.01),
         "ctypes sigaction": lambda: (ctypes.set_errno(0), libc.sigaction(14, ctypes.c_void_p(0), None),
                                      ctypes.get_errno())[2],
         "ctypes alarm": lambda: (ctypes.set_errno(0), libc.alarm(5), ctypes.get_errno())[2],
         "thread": lambda: threading.Thread(target=lambda: None).start(),
         "matmul": lambda: float((torch.randn(512, 512) @ torch.randn(512, 512)).sum()),
         "read handlers and timers": lambda: (signal.getsignal(signal.SIGINT), signal.getitimer(signal.ITIMER_REAL)),
         "mask signals": lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [])}
for name, fn in tries.items():
    try:
        r = fn()
        out[name] = "refused" if r == 1 else "allowed"  # errno 1: EPERM through ctypes
    except OSError as e:
        out[name] = "refused" if e.errno == 1 else f"errno {e.errno}"
out["timer armed"] = signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)
print(json.dumps(out))
'''


def test_once_installed_no_handler_or_timer_can_be_set_by_any_path_and_kernels_still_run():
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r.pop("why") == ""
    assert r == {"signal": "refused", "setitimer": "refused", "ctypes sigaction": "refused", "ctypes alarm": "refused",
                 "thread": "allowed", "matmul": "allowed", "read handlers and timers": "allowed",
                 "mask signals": "allowed", "timer armed": False}


def test_the_filter_denies_exactly_the_listed_calls_on_its_own_architecture():
    """The program as the kernel reads it: its architecture checked first (another one's numbers mean other calls),
    x86_64's x32 calls refused as a whole, each listed call answered EPERM, everything else allowed."""
    for machine, (arch, refused, _) in seccomp._ARCH.items():
        prog = seccomp.program(machine)
        assert prog[0] == (0x20, 0, 0, 4) and prog[1][3] == arch and prog[3] == (0x20, 0, 0, 0)
        assert prog[-1] == (0x06, 0, 0, 0x00050000 | 1) and prog[-2] == (0x06, 0, 0, 0x7FFF0000)
        checks = prog[4:-2]
        assert [k for code, _, _, k in checks if code == 0x15] == list(refused)
        assert all(jt == len(checks) - i for i, (_, jt, _, _) in enumerate(checks))  # each match lands on the deny
        assert (machine == "x86_64") == any(code == 0x35 and k == 0x40000000 for code, _, _, k in checks)
