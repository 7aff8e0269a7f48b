"""The parent's own read of a CPU candidate's checked outputs, with its worker stopped (issue: judge from outside
the candidate's process).

Until now the kept outputs of a timed sample were copied and digested inside the worker, after the window's closing
mark, by code in the same process as the candidate's: whatever that process did there (a native thread finishing the
outputs, memory filled only as it is read, the digest's own primitives rewritten through ctypes) was off the clock
and inside the check. Where the worker runs on the CPU and Linux lets the parent read its memory, a timed sample now
ends like this:

1. the worker sends the closing mark, then the layout of the outputs that may be checked (the kept call's and the
   last call's: address, size, stride, dtype), and waits for the parent's word, running nothing;
2. the parent, woken by the layout, sends SIGSTOP to the worker and to every process under it (from outside its PID
   namespace it cannot be caught, blocked or ignored), notes the time, and waits until every thread of every one of
   them is stopped: the sample ends at that SIGSTOP, so whatever any thread did after the closing mark is timed;
3. with nothing of the candidate's able to run, the parent reads each output's bytes out of the worker's memory
   (/proc/PID/mem, the pid the kernel attached to the layout's datagram), rebuilds the tensors and takes the digest;
   a layout that does not parse, an address that cannot be read, or too much of it is the candidate's failure;
4. it lets the tree run again and sends its word; the worker's later copy of those outputs (the checks' files) must
   match this digest, and they are compared with the original's on the same inputs (gate/timed.py).

The original's samples stop the same way (nothing is read): both sides pay the same stop.
"""

from __future__ import annotations

import ast
import time

from tilesmith.gate import procfs

MAX_BYTES = 8 << 30  # outputs the parent reads per sample, at most
MAX_ENTRIES = 4096


class Unreadable(Exception):
    """The candidate's outputs could not be read as its layout says."""


def supported(device: str) -> bool:
    """Whether samples on `device` stop for the parent's read: CPU outputs, on Linux, with /proc."""
    import os
    import sys

    return str(device).startswith("cpu") and sys.platform.startswith("linux") and os.path.isdir("/proc/self/task")


def stop(pid: int, tree_root: int) -> tuple[list[int], int]:
    """Stop `pid` first, then the tree under `tree_root` (procfs.freeze): (pids stopped, time.time_ns() right after
    the first SIGSTOP, the sample's end on the clock the kernel stamps the marks with)."""
    import os
    import signal

    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    end_ns = time.time_ns()
    pids = procfs.freeze(tree_root)
    if pid not in pids:  # the kernel names the sender as seen from here: only the worker's root could name another
        procfs.thaw([pid])
        procfs.thaw(pids)
        raise Unreadable(f"the outputs' layout came from process {pid}, not one of the worker's")
    return pids, end_ns


def parse(layout: bytes) -> list[list[tuple]]:
    """The layout the worker sent ([kept call's outputs, last call's outputs], each entry ("t", address, size,
    stride, dtype, element size) or ("o", repr)), validated; Unreadable where it is anything else."""
    try:
        lists = ast.literal_eval(layout.decode("ascii"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise Unreadable("the outputs' layout the worker sent does not parse") from None
    if not isinstance(lists, tuple) or len(lists) != 2 or not all(isinstance(x, list) for x in lists):
        raise Unreadable("the outputs' layout the worker sent is not two lists")
    total, n = 0, 0
    for outs in lists:
        for e in outs:
            n += 1
            if not isinstance(e, tuple) or not e or e[0] not in ("t", "o"):
                raise Unreadable("an entry of the outputs' layout is malformed")
            if e[0] == "o":
                if len(e) != 2 or not isinstance(e[1], str):
                    raise Unreadable("an entry of the outputs' layout is malformed")
                continue
            if (len(e) != 6 or not all(isinstance(v, int) and not isinstance(v, bool) for v in (e[1], e[5]))
                    or not all(isinstance(t, tuple) and all(isinstance(v, int) and v >= 0 for v in t) for t in e[2:4])
                    or len(e[2]) != len(e[3]) or not isinstance(e[4], str) or e[1] < 0 or e[5] <= 0):
                raise Unreadable("an entry of the outputs' layout is malformed")
            total += _span(e[2], e[3]) * e[5]
    if n > MAX_ENTRIES or total > MAX_BYTES:
        raise Unreadable(f"the outputs' layout names {n} outputs, {total} bytes: more than the gate reads")
    return [list(x) for x in lists]


def _span(size: tuple, stride: tuple) -> int:
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(size, stride))


def read_outputs(pid: int, lists: list[list[tuple]]) -> list[list]:
    """The outputs as CPU tensors rebuilt from the stopped process's memory (non-tensors as their repr, which the
    digest reads as it reads a repr)."""
    import torch

    out = []
    for outs in lists:
        got = []
        for e in outs:
            if e[0] == "o":
                got.append(_Repr(e[1]))
                continue
            _, addr, size, stride, dtype_name, esize = e
            dtype = getattr(torch, dtype_name.removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype) or torch.empty((), dtype=dtype).element_size() != esize:
                raise Unreadable(f"an output's dtype {dtype_name[:40]!r} is not one the gate reads")
            n = _span(size, stride)
            if n and addr == 0:
                raise Unreadable("an output's address is 0")
            try:
                raw = procfs.read_memory(pid, addr, n * esize)
            except OSError as ex:
                raise Unreadable(f"an output's {n * esize} bytes at {addr:#x} could not be read from the stopped "
                                 f"worker ({ex.strerror or ex})") from None
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) if n else torch.empty(0, dtype=dtype)
            got.append(flat.as_strided(size, stride, 0) if n else torch.empty_strided(size, stride, dtype=dtype))
        out.append(got)
    return out


class _Repr:
    """A non-tensor output as the worker's digest reads it: its repr."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def digest(pid: int, layout: bytes) -> int:
    """The digest (worker.tensors.outputs_digest) of the outputs `layout` names, read from stopped process `pid`."""
    from tilesmith.gate.worker.tensors import outputs_digest

    return outputs_digest(read_outputs(pid, parse(layout)))
