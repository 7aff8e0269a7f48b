"""Machine-wide leases on the CPUs a CPU graph's timing pins its workers to.

The gate pins both timed workers of a decision to the CPUs one worker's threads use (sizing.shared_cpus: the
highest-numbered first). Within one optimize process decisions never overlap (its timing lock); across processes
they can: every graph's track in its own process (`--ray`, where each CPU graph's task gets one CPU and so one
thread) would pin to the same last core, and sixteen one-CPU tasks of a 64-core node would time on that one core.
A lease is an exclusive `flock` on one file per CPU in a directory every process of this user on the machine
shares: a timing takes the n highest free CPUs of its affinity, all n or none (never holding some while waiting for
the rest, so two timings cannot block each other), and waits while fewer are free. The kernel drops a lease when its
holder exits, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path


def lease_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"tilesmith-cpu-leases-{os.getuid()}"


def _try(d: Path, n: int, cpus: list[int]) -> list:
    """n leases of `cpus` (in their order), or [] with none held."""
    held = []
    for c in cpus:
        if len(held) == n:
            break
        f = open(d / f"cpu{c}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        held.append((c, f))
    if len(held) < n:
        for _, f in held:
            f.close()
        return []
    return held


@contextlib.contextmanager
def leased(cpus: list[int], n: int, timeout_s: float = 600.0, poll_s: float = 0.05):
    """Hold leases on n of `cpus` (tried in their order) while the block runs; yields the leased CPUs, sorted.
    After `timeout_s` without n free, yields the first n unleased (the timing goes on, as before leases)."""
    n = max(1, min(n, len(cpus)))
    d = lease_dir()
    d.mkdir(mode=0o700, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    held = _try(d, n, cpus)
    while not held and time.monotonic() < deadline:
        time.sleep(poll_s)
        held = _try(d, n, cpus)
    try:
        yield sorted(c for c, _ in held) if held else list(cpus[:n])
    finally:
        for _, f in held:
            f.close()
