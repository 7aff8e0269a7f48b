"""The parent's own read of a CPU candidate's checked outputs, with its worker stopped (issue: judge from outside
the candidate's process).

Until now the kept outputs of a timed sample were copied and digested inside the worker, after the window's closing
mark, by code in the same process as the candidate's: whatever that process did there (a native thread finishing the
outputs, memory filled only as it is read, the digest's own primitives rewritten through ctypes) was off the clock
and inside the check. Where the worker runs on the CPU and Linux lets the parent read its memory, a timed sample now
ends like this:

1. the worker sends the closing mark, then the layout of every timed call's outputs (the last call's in full:
   address, size, stride, dtype; then each call's addresses: every call's outputs are kept alive until the stop), and
   waits for the parent's word, running nothing;
2. the parent, woken by the layout, sends SIGSTOP to the worker and to every process under it (from outside its PID
   namespace it cannot be caught, blocked or ignored), notes the time, and waits until every thread of every one of
   them is stopped: the sample ends at that SIGSTOP, so whatever any thread did after the closing mark is timed;
3. with nothing of the candidate's able to run, the parent chooses the call it checks (its own CSPRNG, drawn now:
   nothing in the worker knew it while the calls ran, so a candidate that computes only some calls' outputs is
   caught on the others), reads that call's and the last call's outputs out of the worker's memory (/proc/PID/mem,
   the pid the kernel attached to the layout's datagram), rebuilds the tensors and takes the digest; a layout that
   does not parse, an address that cannot be read, or too much of it is the candidate's failure;
4. it lets the tree run again and sends its word with the chosen call; the worker's later copy of those outputs (the
   checks' files) must name that call and match this digest, and they are compared with the original's on the same
   inputs (gate/timed.py).

The original's samples stop the same way (nothing is read): both sides pay the same stop.
"""

from __future__ import annotations

import array
import ast
import time
from dataclasses import dataclass

from tilesmith.gate import procfs

MAX_BYTES = 8 << 30  # outputs the parent reads per sample, at most
MAX_ENTRIES = 4096  # outputs of a call
MAX_CALLS = 1 << 16  # calls of a sample


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


@dataclass
class Layout:
    """A timed sample's outputs as the worker laid them out: the last call's entries (("t", address, size, stride,
    dtype, element size) or ("o", repr)) and every call's addresses, `calls` rows of len(last) each."""

    last: list[tuple]
    calls: int
    ptrs: array.array

    def call(self, i: int) -> list[tuple]:
        """Call i's entries: the last call's layout at call i's addresses (the worker's later copy of that call's
        outputs must match what is read here, layout included, so a call laid out otherwise fails there)."""
        n = len(self.last)
        return [("t", self.ptrs[i * n + j], *e[2:]) if e[0] == "t" else e for j, e in enumerate(self.last)]


def parse(layout: bytes) -> Layout:
    """The layout the worker sent (repr((last call's entries, calls)), a newline, then calls x entries addresses as
    native unsigned 64-bit integers), validated; Unreadable where it is anything else."""
    head, sep, raw = layout.partition(b"\n")
    try:
        entries, calls = ast.literal_eval(head.decode("ascii"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError, TypeError):
        raise Unreadable("the outputs' layout the worker sent does not parse") from None
    if (not sep or not isinstance(entries, tuple) or not isinstance(calls, int) or isinstance(calls, bool)
            or not 1 <= calls <= MAX_CALLS):
        raise Unreadable("the outputs' layout the worker sent is not its last call's outputs and a count of calls")
    total = 0
    for e in entries:
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
    if len(entries) > MAX_ENTRIES or 2 * total > MAX_BYTES:
        raise Unreadable(f"the outputs' layout names {len(entries)} outputs, {total} bytes a call: more than the gate "
                         "reads")
    ptrs = array.array("Q")
    if len(raw) != calls * len(entries) * ptrs.itemsize:
        raise Unreadable(f"the outputs' layout has {len(raw)} bytes of addresses, not {calls} calls of "
                         f"{len(entries)} outputs")
    ptrs.frombytes(raw)
    return Layout(list(entries), calls, ptrs)


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


def digest(pid: int, layout: Layout, call: int) -> int:
    """The digest (worker.tensors.outputs_digest) of call `call`'s and the last call's outputs, as `layout` lays them
    out, read from stopped process `pid`."""
    from tilesmith.gate.worker.tensors import outputs_digest

    return outputs_digest(read_outputs(pid, [layout.call(call), layout.last]))
