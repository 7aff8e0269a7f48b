"""The parent's own refill of a CPU worker's buffers (tilesmith/gate/refill.py): the values it writes into a process's
memory are, bit for bit, those the worker's own refill (worker.sample._set_content) gives the same buffers, which the
original's checks rebuild; and what it cannot write is the candidate's failure."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from tilesmith.capture.tensors import span_numel
from tilesmith.gate import refill
from tilesmith.gate.inputs import rescaled_parameters
from tilesmith.gate.worker.sample import _set_content
from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import _to_device

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/mem: Linux")

META = {"inputs": [{}, {}, {"range": {"min": 3, "max": 40}}, {}, {"parameter": True}, {"parameter": True}, {},
                   {"range": {"min": 0, "max": 1}}, {}],
        "mutated_inputs": [5]}


def _contents(k: int) -> list:
    g = torch.Generator().manual_seed(k)
    wide = torch.randn(6, 10, generator=g)
    return [torch.randn(4, 5, generator=g),
            wide[:, ::3],  # strided, with gaps in its span
            torch.randint(3, 41, (7,), generator=g),
            torch.randn(9, generator=g).to(torch.bfloat16),
            torch.randn(3, 3, generator=g),  # a parameter: one buffer in every set
            torch.randn(5, generator=g),  # a parameter the graph updates in place: set 0 gets its content back
            torch.randn(2, 2, generator=g, dtype=torch.complex64),
            torch.randint(0, 2, (6,), generator=g).bool(),
            torch.empty(0, 3)]


def _buffers(contents: list, shared: set, n: int) -> list:
    """The worker's buffer sets as its timing setup makes them (worker.setup.op_time_setup)."""
    bufs = []
    for b in range(n):
        bufs.append([bufs[0][i] if b and i in shared else _to_device(x, "cpu") for i, x in enumerate(contents[b % len(contents)])])
    return bufs


def _spans(bufs: list) -> list:
    return [[bytes(x.as_strided((span_numel(x),), (1,), 0).view(torch.uint8).numpy()) if span_numel(x) else b""
             for x in s] for s in bufs]


@pytest.mark.parametrize("perturb", [None, 12345678901])
def test_the_parent_writes_the_values_the_workers_own_refill_gives(perturb):
    contents = [_contents(k) for k in range(3)]
    shared = {4, 5}
    st = State()
    st.data, st.shared = SimpleNamespace(meta=META), shared
    st.rescaled = rescaled_parameters(META)  # as the worker's time_setup sets it: the updated parameter, 5
    assert st.rescaled == {5}
    st.pool["candidate"] = [[_to_device(x, "cpu") for x in c] for c in contents]
    theirs, ours = _buffers(contents, shared, 4), _buffers(contents, shared, 4)
    for s in ours:  # the parent's write must not lean on what a buffer held before
        for x in s:
            if span_numel(x):
                x.as_strided((span_numel(x),), (1,), 0).view(torch.uint8).fill_(0xAB)
    fill = [2, 0, 1, 2]
    for b, c in enumerate(fill):
        _set_content(st, theirs[b], st.pool["candidate"][c], perturb, b)
    addresses = [[x.data_ptr() if isinstance(x, torch.Tensor) else 0 for x in s] for s in ours]
    written = refill.Refill(contents, META).write(os.getpid(), addresses, fill, perturb)
    assert written > 0
    want, got = _spans(theirs), _spans(ours)
    for b in range(4):
        for i in range(len(contents[0])):
            if i in shared and b:  # one buffer: compared at set 0
                continue
            if i == 4:  # a parameter not updated: neither refill touches it
                continue
            assert got[b][i] == want[b][i], (b, i)
    if perturb is not None:  # new values, not the pool's: the perturbation was applied
        assert got[0][0] != _spans([[_to_device(contents[2][0], "cpu")]])[0][0]


def test_a_buffer_set_without_its_addresses_or_with_an_unmapped_one_is_unwritable():
    contents = [_contents(0)]
    r = refill.Refill(contents, META)
    with pytest.raises(refill.Unwritable, match="do not cover"):
        r.write(os.getpid(), [], [0], 1)
    with pytest.raises(refill.Unwritable, match="addresses for"):
        r.write(os.getpid(), [[1, 2]], [0], 1)
    with pytest.raises(refill.Unwritable, match="is not one"):
        r.write(os.getpid(), [[0] * len(contents[0])], [0], 1)
    with pytest.raises(refill.Unwritable, match="could not be written"):
        r.write(os.getpid(), [[4096] * len(contents[0])], [0], 1)


def _spinner(code: str, cpus: set | None = None):
    """A Python process running `code` (its main thread first pins itself to `cpus`, this process's first core
    where None)."""
    import subprocess

    cpus = cpus or {min(os.sched_getaffinity(0))}
    pre = f"import os, threading, time\nos.sched_setaffinity(0, {sorted(cpus)})\n"
    return subprocess.Popen([sys.executable, "-c", pre + code]), cpus


def _sched_over(p, seconds: float):
    """procfs.sched of process p, stopped, at the start and the end of `seconds` of running, and the ns between."""
    import time

    from tilesmith.gate import procfs

    time.sleep(0.6)  # its threads (and child) started
    pids = procfs.freeze(p.pid)
    a = procfs.sched(pids, p.pid)
    t0 = time.time_ns()
    procfs.thaw(pids)
    time.sleep(seconds)
    pids = procfs.freeze(p.pid)
    span = time.time_ns() - t0
    b = procfs.sched(pids, p.pid)
    procfs.thaw(pids)
    return a, b, span


_SPIN = "t = time.time()\nwhile time.time() - t < 30: pass\n"


def _ran(a, b) -> dict:
    """Each thread's CPU time and wait for a CPU between a and b, in ns."""
    before = {t: (r, d) for t, r, d in a.threads}
    return {t: (r - before[t][0], d - before[t][1]) for t, r, d in b.threads if t in before}


def test_a_wait_for_the_core_made_by_another_process_is_forgiven_one_made_by_the_workers_own_thread_is_not():
    """procfs.forgiven_ns on real processes pinned to one core: the serving thread's wait behind a process outside its
    tree is forgiven; behind a thread of its own (or a child of its own) it is not, the two being counted over the one
    core they may use; and nothing is forgiven where the tree's threads changed."""
    from tilesmith.gate import procfs

    ready = "time.sleep(0.3)\n"
    hog, cpu = _spinner(_SPIN)
    worker, _ = _spinner(ready + _SPIN)
    try:
        a, b, span = _sched_over(worker, 1.0)
        assert a and b and b.waited_ns - a.waited_ns > 200e6, (a, b)  # it shared its core with the hog
        assert procfs.forgiven_ns(a, b, span) > 0.8 * (b.waited_ns - a.waited_ns)
    finally:
        hog.kill(), worker.kill()
    # Its own thread, and its own child, spinning on its core.
    own = "threading.Thread(target=lambda: exec(" + repr(_SPIN) + "), daemon=True).start()\n"
    child = "if os.fork() == 0:\n    " + _SPIN.replace("\n", "\n    ") + "\n"
    for extra in (own, child):
        worker, _ = _spinner(extra + ready + _SPIN)
        try:
            a, b, span = _sched_over(worker, 1.0)
            assert a and b and b.waited_ns - a.waited_ns > 50e6, (a, b)  # (run_delay counts less than half here)
            mine, others = b.own_ns - a.own_ns, (b.cpu_ns - a.cpu_ns) - (b.own_ns - a.own_ns)
            assert others > 0.7 * mine, (extra, a, b)  # the other spinner's time is counted: it spun as long
            assert b.cpus == 1
            # Not more than the span less the two spinners' time on their one core: the time something outside the tree
            # had the core (on a quiet machine, what the stops themselves took), however long each spinner waited.
            assert procfs.forgiven_ns(a, b, span) <= max(0, span - (b.cpu_ns - a.cpu_ns)), (extra, a, b, span)
        finally:
            worker.kill()
    # A thread started (or ended) between the two: nothing forgiven.
    more = procfs.Sched(b.waited_ns + 10**9, b.own_ns, b.cpu_ns, b.reaped, b.tasks | {(1, 1)}, b.threads, b.cpus)
    assert procfs.forgiven_ns(a, more, span) == 0
    reaped = procfs.Sched(b.waited_ns + 10**9, b.own_ns, b.cpu_ns, b.reaped + 1, b.tasks, b.threads, b.cpus)
    assert procfs.forgiven_ns(a, reaped, span) == 0
    assert procfs.forgiven_ns(None, b, span) == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_two_threads_that_both_wait_behind_other_processes_have_their_common_wait_forgiven():
    """A worker of two threads on two cores, each core shared with a process outside its tree (as two OpenMP threads
    beside two hogs): both threads wait, and the wait they share is taken out, no more than leaves the sample its
    work over its two cores. (The allowance before read one thread's wait less the other's CPU time: 0 here.)"""
    from tilesmith.gate import procfs

    two = set(sorted(os.sched_getaffinity(0))[:2])
    ready = "time.sleep(0.3)\n"
    hogs = [_spinner(_SPIN, {c})[0] for c in two]
    own = "threading.Thread(target=lambda: exec(" + repr(_SPIN) + "), daemon=True).start()\n"
    worker, _ = _spinner(own + ready + _SPIN, two)
    try:
        a, b, span = _sched_over(worker, 1.0)
        ran = _ran(a, b)
        # Each ran a share of its core: beside another test suite as well as the hogs, 90 ms of the second (2026-12-07).
        spun = [x for x in ran.values() if x[0] > 20e6]
        assert len(spun) == 2 and b.cpus == 2, (ran, b.cpus)
        got = procfs.forgiven_ns(a, b, span)
        assert got >= 0.5 * min(d for _, d in spun), (got, ran, span)  # the common wait, stops and all
        assert got <= min(d for _, d in spun) and span - got >= (b.cpu_ns - a.cpu_ns) / 2, (got, ran, span)
    finally:
        worker.kill()
        for h in hogs:
            h.kill()
