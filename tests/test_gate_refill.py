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


def _spinner(code: str):
    """A Python process running `code` (its main thread first pins itself to this process's first core)."""
    import subprocess

    cpu = min(os.sched_getaffinity(0))
    pre = f"import os, threading, time\nos.sched_setaffinity(0, {{{cpu}}})\n"
    return subprocess.Popen([sys.executable, "-c", pre + code]), cpu


def _sched_over(p, seconds: float):
    """procfs.sched of process p, stopped, at the start and the end of `seconds` of running."""
    import time

    from tilesmith.gate import procfs

    time.sleep(0.6)  # its threads (and child) started
    pids = procfs.freeze(p.pid)
    a = procfs.sched(pids, p.pid)
    procfs.thaw(pids)
    time.sleep(seconds)
    pids = procfs.freeze(p.pid)
    b = procfs.sched(pids, p.pid)
    procfs.thaw(pids)
    return a, b


_SPIN = "t = time.time()\nwhile time.time() - t < 30: pass\n"


def test_a_wait_for_the_core_made_by_another_process_is_forgiven_one_made_by_the_workers_own_thread_is_not():
    """procfs.forgiven_ns on real processes pinned to one core: the serving thread's wait behind a process outside its
    tree is forgiven; behind a thread of its own (or a child of its own) it is charged, that thread's CPU time being
    counted against it; and nothing is forgiven where the tree's threads changed."""
    from tilesmith.gate import procfs

    ready = "time.sleep(0.3)\n"
    hog, cpu = _spinner(_SPIN)
    worker, _ = _spinner(ready + _SPIN)
    try:
        a, b = _sched_over(worker, 1.0)
        assert a and b and b.waited_ns - a.waited_ns > 200e6, (a, b)  # it shared its core with the hog
        assert procfs.forgiven_ns(a, b) > 0.8 * (b.waited_ns - a.waited_ns)
    finally:
        hog.kill(), worker.kill()
    # Its own thread, and its own child, spinning on its core.
    own = "threading.Thread(target=lambda: exec(" + repr(_SPIN) + "), daemon=True).start()\n"
    child = "if os.fork() == 0:\n    " + _SPIN.replace("\n", "\n    ") + "\n"
    for extra in (own, child):
        worker, _ = _spinner(extra + ready + _SPIN)
        try:
            a, b = _sched_over(worker, 1.0)
            assert a and b and b.waited_ns - a.waited_ns > 50e6, (a, b)  # (run_delay counts less than half here)
            mine, others = b.own_ns - a.own_ns, (b.cpu_ns - a.cpu_ns) - (b.own_ns - a.own_ns)
            assert others > 0.7 * mine, (extra, a, b)  # the other spinner's time is counted: it spun as long
            assert procfs.forgiven_ns(a, b) <= max(0, (b.waited_ns - a.waited_ns) - others), (extra, a, b)
        finally:
            worker.kill()
    # A thread started (or ended) between the two: nothing forgiven.
    assert procfs.forgiven_ns(a, procfs.Sched(b.waited_ns + 10**9, b.own_ns, b.cpu_ns, b.reaped,
                                              b.tasks | {(1, 1)})) == 0
    assert procfs.forgiven_ns(a, procfs.Sched(b.waited_ns + 10**9, b.own_ns, b.cpu_ns, b.reaped + 1, b.tasks)) == 0
    assert procfs.forgiven_ns(None, b) == 0
