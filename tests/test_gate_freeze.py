"""The parent's own read of a CPU candidate's outputs (tilesmith/gate/freeze.py, procfs.freeze): a real process tree
in the gate's sandbox namespaces stopped whole from outside, its memory read, and a layout the worker sends checked
before anything is read."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import time

import pytest
import torch

from tilesmith.gate import freeze, procfs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and SIGSTOP from outside: Linux")

_CHILD = r"""
import ctypes, os, sys, threading, time
buf = ctypes.create_string_buffer(b"values-the-parent-reads", 64)
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:  # a process under it, busy too
    spin()
print(ctypes.addressof(buf), flush=True)
spin()
"""


def _tree():
    argv = [sys.executable, "-c", _CHILD]
    if subprocess.run(["unshare", "-Urpfn", "--mount-proc", "true"], capture_output=True).returncode == 0:
        # The worker is its PID namespace's first process; it dies with unshare (--kill-child), and the rest with it.
        argv = ["unshare", "-Urpfn", "--mount-proc", "--kill-child", "--", *argv]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())


def _end(p) -> list[int]:
    """Kill the whole tree (spinning processes left behind would load the machine for every later test); the pids
    that still run a second later."""
    import signal

    tree = procfs.process_tree(p.pid)
    for q in tree:
        try:
            os.kill(q, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and [q for q in tree if procfs._states(q) not in ([], [b"Z"])]:
        time.sleep(0.05)
    return [q for q in tree if procfs._states(q) not in ([], [b"Z"])]


def test_a_busy_process_tree_is_stopped_whole_from_outside_read_and_let_run_again():
    p, addr = _tree()
    try:
        pids = procfs.freeze(p.pid)
        tree = procfs.process_tree(p.pid)
        assert set(tree) <= set(pids) and len(tree) >= 2
        assert all(s in (b"T", b"t") for q in tree for s in procfs._states(q))
        cpu = [procfs.tree_cpu_ns(q) for q in tree]
        time.sleep(0.3)  # stopped: no thread of any of them runs (a tick is 10 ms)
        assert [procfs.tree_cpu_ns(q) for q in tree] == cpu
        worker = next(q for q in tree if _reads(q, addr))
        assert procfs.read_memory(worker, addr, 23) == b"values-the-parent-reads"
        with pytest.raises(OSError):
            procfs.read_memory(worker, 4096, 8)  # nothing mapped there
        procfs.thaw(pids)
        time.sleep(0.3)
        assert procfs.tree_cpu_ns(worker) > cpu[tree.index(worker)]  # running again
    finally:
        assert _end(p) == []


def _reads(pid: int, addr: int) -> bool:
    try:
        return procfs.read_memory(pid, addr, 6) == b"values"
    except OSError:
        return False


def _layout(head: object, rows: list[list[int]]) -> bytes:
    return repr(head).encode() + b"\n" + array.array("Q", [a for r in rows for a in r]).tobytes()


@pytest.mark.parametrize("layout", [
    b"__import__('os')\n", b"((), 1)", _layout(((), 0), []), _layout([[], 1], []), _layout(((), 1, 2), []),
    _layout(((("t", 1, (2,), (1,), "float32"),), 1), [[1]]),
    _layout(((("t", True, (2,), (1,), "float32", 4),), 1), [[1]]),
    _layout(((("t", 64, (2,), (-1,), "float32", 4),), 1), [[64]]),
    _layout(((("x", "y"),), 1), [[0]]), _layout(((("t", 64, (2, 3), (1,), "float32", 4),), 1), [[64]]),
    _layout(((("t", 64, (2,), (1,), "float32", 4),), 2), [[64]]),  # fewer addresses than calls x outputs
    _layout(((("t", 64, (2,), (1,), "float32", 4),), 1), [[64, 64]]),  # more
    _layout(((), True), []), b"\xff\xfe\n",
])
def test_a_layout_that_is_not_a_calls_outputs_and_their_addresses_is_the_candidates_failure(layout):
    with pytest.raises(freeze.Unreadable):
        freeze.parse(layout)


def test_a_layout_naming_more_memory_than_the_gate_reads_is_refused():
    with pytest.raises(freeze.Unreadable, match="more than the gate reads"):
        freeze.parse(_layout(((("t", 4096, (1 << 40,), (1,), "float32", 4),), 1), [[4096]]))


def _sent_layout(held: list, go: int = 0) -> tuple[bytes, int]:
    """What the worker's _stop_for_the_parent sends for `held` (every call's outputs), and the call it returns when
    the parent's go names `go`."""
    from tilesmith.gate import clock
    from tilesmith.gate.worker import sample

    sent = []
    chosen = sample._stop_for_the_parent(lambda fd, b: sent.append(b), lambda fd, n: b"G" + go.to_bytes(4, "little"),
                                         -1, sample._LAYOUT, held, torch.Tensor, type, (list, tuple))
    assert all(b[:1] == clock.LAYOUT_PART for b in sent[:-1]) and sent[-1][:1] == clock.LAYOUT_MARK
    return b"".join(b[1:] for b in sent), chosen


def test_outputs_rebuilt_from_another_process_digest_as_the_worker_digests_them():
    """The parent's digest of the outputs it read of the call it chose and the last call equals the worker's digest of
    the same tensors (which the checks' copies are compared with), strided ones and non-tensors included; each call
    is read at its own addresses; an address nothing is mapped at fails."""
    from tilesmith.gate.worker.tensors import outputs_digest

    def call(i: int) -> list:
        return [torch.arange(12, dtype=torch.float32).reshape(3, 4).t() + i, None,
                torch.tensor([1, 2 + i], dtype=torch.int64), torch.randn(5, dtype=torch.bfloat16), torch.empty(0, 3)]

    held = [call(i) for i in range(3)] + [tuple(call(3))]
    data, chosen = _sent_layout(held, go=2)
    assert chosen == 2
    lay = freeze.parse(data)
    assert lay.calls == 4 and len(lay.last) == 5
    for i in range(4):
        assert freeze.digest(os.getpid(), lay, i) == outputs_digest([held[i], list(held[3])])
    assert freeze.digest(os.getpid(), lay, 0) != freeze.digest(os.getpid(), lay, 1)
    bad = _layout(((("t", 4096, (2,), (1,), "torch.float32", 4),), 1), [[4096]])
    with pytest.raises(freeze.Unreadable, match="could not be read"):
        freeze.digest(os.getpid(), freeze.parse(bad), 0)


def test_a_layout_of_many_calls_goes_in_several_datagrams_and_reads_back():
    """A backward graph's hundreds of outputs over many calls: the layout spans datagrams and parses whole."""
    held = [[torch.full((2,), float(i * 300 + j)) for j in range(300)] for i in range(40)]
    data, _ = _sent_layout(held)
    lay = freeze.parse(data)
    assert lay.calls == 40 and len(data) > 16384
    from tilesmith.gate.worker.tensors import outputs_digest

    assert freeze.digest(os.getpid(), lay, 17) == outputs_digest([held[17], held[39]])
