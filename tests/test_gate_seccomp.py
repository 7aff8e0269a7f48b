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


_PROBE_PROCESSES = r'''
import ctypes, json, os, subprocess, sys, threading, torch
from tilesmith.gate.worker import seccomp

torch.randn(256, 256) @ torch.randn(256, 256)
out = {"why": seccomp.install(processes=True)}
libc = ctypes.CDLL(None, use_errno=True)


def started(fn):
    try:
        return "allowed" if fn() is not None else "allowed"
    except OSError as e:
        return {1: "refused", 38: "refused (ENOSYS)"}.get(e.errno, f"errno {e.errno}")


def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    if r == 0:  # a child, if the kernel let one start: it leaves at once
        os._exit(0)
    return "refused" if r == -1 and ctypes.get_errno() == 1 else f"returned {r}, errno {ctypes.get_errno()}"


tries = {"fork": lambda: started(lambda: os.fork()),
         "subprocess": lambda: started(lambda: subprocess.run(["/bin/true"])),
         "posix_spawn": lambda: started(lambda: os.posix_spawn("/bin/true", ["/bin/true"], {})),
         "raw clone": lambda: raw(56 if os.uname().machine == "x86_64" else 220, 17, 0, 0, 0, 0),  # SIGCHLD: a process
         "thread": lambda: started(lambda: threading.Thread(target=lambda: None).start()),
         "more torch threads": lambda: (torch.set_num_threads(3),
                                        float((torch.randn(512, 512) @ torch.randn(512, 512)).sum()), "allowed")[-1]}
for name, fn in tries.items():
    out[name] = fn()
print(json.dumps(out))
'''


def test_a_cpu_workers_filter_also_refuses_to_start_a_process_and_threads_still_start():
    """CPU workers (whose samples the parent times from outside: procfs.forgiven_ns) may start threads, never a process:
    a child that worked and was reaped within a sample would leave no CPU time the parent could see."""
    p = subprocess.run([sys.executable, "-c", _PROBE_PROCESSES], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r.pop("why") == ""
    assert r == {"fork": "refused", "subprocess": "refused", "posix_spawn": "refused", "raw clone": "refused",
                 "thread": "allowed", "more torch threads": "allowed"}, r


def test_the_process_rules_jump_where_they_say():
    """With `processes`, clone3 answers ENOSYS, clone is let through only with CLONE_THREAD in its flags, fork and
    vfork are refused; the listed calls still land on the deny."""
    for machine, (arch, refused, _) in seccomp._ARCH.items():
        prog = seccomp.program(machine, processes=True)
        assert prog[-1] == (0x06, 0, 0, 0x00050000 | 38) and prog[-2] == (0x06, 0, 0, 0x00050000 | 1)
        assert prog[-3] == (0x06, 0, 0, 0x7FFF0000)
        allow, deny, enosys = len(prog) - 3, len(prog) - 2, len(prog) - 1
        for i, (code, jt, jf, k) in enumerate(prog[4:], start=4):
            if code == 0x15 and k in refused + seccomp._FORKS[machine]:
                assert i + 1 + jt == deny, (machine, k)
            elif code == 0x15 and k == seccomp._CLONE[machine][1]:
                assert i + 1 + jt == enosys
            elif code == 0x15 and k == seccomp._CLONE[machine][0]:
                assert i + 1 + jf == allow and prog[i + 1] == (0x20, 0, 0, 16)
            elif code == 0x45:
                assert k == 0x10000 and i + 1 + jt == allow and i + 1 + jf == deny
        assert [k for c, _, _, k in prog if c == 0x15 and k in seccomp._FORKS[machine]] == list(seccomp._FORKS[machine])
