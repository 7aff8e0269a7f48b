"""What the kernel says about a gate worker from outside it (/proc): nothing the worker runs can change it."""

from __future__ import annotations

import os

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def process_tree(pid: int) -> list[int]:
    """Process `pid` and every process under it (children of any of its threads, recursively), as /proc lists them
    now; a process gone since it was listed is left out of the walk below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def tree_cpu_ns(pid: int) -> int:
    """CPU time (user and system, every thread, live or ended, and reaped children) of process `pid` and
    of every process under it, from /proc, in ns (the kernel's clock-tick resolution: 10 ms on Linux).
    Read from outside the process, so nothing the process runs can change it; 0 where /proc is absent.
    A child that detaches from the tree leaves it, but not the sandbox: in the sandbox's PID namespace
    an orphan's new parent is the worker itself."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                raw = f.read()
            fields = raw[raw.rindex(b")") + 2:].split()  # fields 3.. of proc(5); the name may hold spaces
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue  # gone since it was listed
    return int(total * _TICK_NS)
