"""The parent's own read of a CPU candidate's outputs (tilesmith/gate/freeze.py, procfs.freeze): a real process tree
in the gate's sandbox namespaces stopped whole from outside, its memory read, and a layout the worker sends checked
before anything is read."""

from __future__ import annotations

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
    import os
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


@pytest.mark.parametrize("layout", [
    b"__import__('os')", b"([], )", b"[[], []]", b"([('t', 1, (2,), (1,), 'float32')], [])",
    b"([('t', True, (2,), (1,), 'float32', 4)], [])", b"([('t', 64, (2,), (-1,), 'float32', 4)], [])",
    b"([('x', 'y')], [])", b"([('t', 64, (2, 3), (1,), 'float32', 4)], [])", b"\xff\xfe",
])
def test_a_layout_that_is_not_two_lists_of_well_formed_entries_is_the_candidates_failure(layout):
    with pytest.raises(freeze.Unreadable):
        freeze.parse(layout)


def test_a_layout_naming_more_memory_than_the_gate_reads_is_refused():
    with pytest.raises(freeze.Unreadable, match="more than the gate reads"):
        freeze.parse(repr(([("t", 4096, (1 << 40,), (1,), "float32", 4)], [])).encode())


def test_outputs_rebuilt_from_another_process_digest_as_the_worker_digests_them():
    """The parent's digest of outputs it read equals the worker's digest of the same tensors (which the checks'
    copies are compared with), strided ones and non-tensors included; an address nothing is mapped at fails."""
    from tilesmith.gate.worker.tensors import outputs_digest

    import os

    kept = [torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), None, torch.tensor([1, 2], dtype=torch.int64)]
    last = [torch.randn(5, dtype=torch.bfloat16), torch.empty(0, 3)]
    entries = [[(("t", o.data_ptr() if o.numel() else 0, tuple(o.size()), tuple(o.stride()), str(o.dtype),
                  o.element_size()) if isinstance(o, torch.Tensor) else ("o", repr(o))) for o in outs]
               for outs in (kept, last)]
    layout = repr(tuple(entries)).encode()
    assert freeze.digest(os.getpid(), layout) == outputs_digest([kept, last])
    bad = repr(([("t", 4096, (2,), (1,), "torch.float32", 4)], [])).encode()
    with pytest.raises(freeze.Unreadable, match="could not be read"):
        freeze.digest(os.getpid(), bad)
