"""The gate's worker: `python -m tilesmith.gate.worker RESULT_FD` runs main() here. Runs wrapper code, never decides.

Requests arrive as JSON lines on stdin; each reply is one JSON line on the private pipe RESULT_FD.
Bulk results (outputs, inputs after the call) go to torch.save files the deciding process reads with
weights_only=True. Timing replies carry raw nanosecond totals only. The clock and the device
synchronisation are bound at import (sample.py, setup.py: imported here), before any wrapper code can run.
The ops live by concern: setup.py (load, time_setup, pin), sample.py (warm, time), checks.py (original_checks,
checks), outputs.py (outputs, ref64).
"""

from __future__ import annotations

import gc
import os
import select
import sys
import time

_perf_ns = time.perf_counter_ns  # bound before candidate code exists in this process
_T0_NS = _perf_ns()
_STARTUP_S = 0.0  # seconds from this module's first line to the first request it can take

import torch  # noqa: E402

from tilesmith.gate import clock  # noqa: E402
from tilesmith.gate.worker import audit, guard, sample  # noqa: E402
from tilesmith.gate.worker.checks import _patched, op_checks, op_original_checks  # noqa: E402
from tilesmith.gate.worker.fingerprint import _state_change  # noqa: E402
from tilesmith.gate.worker.outputs import op_outputs, op_ref64  # noqa: E402
from tilesmith.gate.worker.sample import op_time, op_warm  # noqa: E402
from tilesmith.gate.worker.setup import op_load, op_pin, op_time_setup  # noqa: E402
from tilesmith.gate.worker.state import State  # noqa: E402
from tilesmith.gate.worker.warm import warm_device, warm_inductor  # noqa: E402

# A CUDA graph's worker serves from its main thread, as before, until `make gpu-smoke` has run it parked (main): no
# GPU run has judged the parked worker yet (CUDA contexts, CUDA graphs and Inductor's cudagraph trees on a thread
# other than the main one). Its CPU workers are parked.
PARK_ON_CUDA = False
WARM_WAIT_NS = 50_000_000  # after a warm-up, how long the worker waits for the sample's request awake (spinning)


def op_ready(st: State, req: dict) -> dict:
    """Answered once the imports (and the CUDA context) are up: the parent waits on it to know the worker is idle."""
    return {"pid": os.getpid(), "startup_s": _STARTUP_S}


OPS = {"ready": op_ready, "load": op_load, "outputs": op_outputs, "ref64": op_ref64, "time_setup": op_time_setup, "warm": op_warm, "time": op_time,
       "checks": op_checks, "original_checks": op_original_checks,
       "pin": op_pin}


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the deciding process dies, so no candidate code outlives it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() == 1:
        os._exit(1)


def _prepare_loads() -> None:
    """Import what loading a wrapper needs before the first request, so a worker spawned early is ready
    when its candidate arrives (no wrapper code has run yet: the process is still fresh)."""
    import importlib

    import torch._inductor.codecache as codecache

    importlib.import_module("tilesmith.capture.loading")  # the torch pieces the first load needs

    header_dir = os.environ.get("TILESMITH_GATE_HEADER_DIR")
    if header_dir and hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = header_dir
        codecache._HEADER_LOCK_DIR = os.path.join(header_dir, "locks")
    device = os.environ.get("TILESMITH_GATE_DEVICE", "cpu")
    warm_inductor(device)
    warm_device(device)


def main(fd: int, mark_fd: int = -1) -> None:
    """Serve requests from a thread of the worker's own, and park the main thread in a system call for good, every
    signal blocked on it. The interpreter runs a callback queued with Py_AddPendingCall (from ctypes, no import
    needed) only on its main thread, between two bytecodes, wherever that thread is: a candidate's, queued in a
    warm-up call, read the next request's values at op_time's entry and computed the whole sample before its
    window (accepted at 11.9x), and another filled the checked outputs right after the closing mark (3.4-4.0x):
    tests/redteam_late.py. With no bytecode ever run on the main thread again, such a callback never runs. Nothing
    wakes it: it waits on no descriptor, no signal can interrupt its wait (blocked here; a stop and continue restarts
    the call), SIGINT is ignored, and the serving thread ends the process itself (os._exit)."""
    import signal
    import threading

    if not os.environ.get("TILESMITH_GATE_DEVICE", "cpu").startswith("cpu") and not PARK_ON_CUDA:
        return _serve_then_exit(fd, mark_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Python's handler runs on the main thread: none to run
    server = threading.Thread(target=_serve_then_exit, args=(fd, mark_fd), name="tilesmith-gate-worker", daemon=True)
    server.start()  # before the mask below: the serving thread keeps the default one
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    while True:  # no descriptor to wake it (a pipe's other end, left open, was written to and woke it: a red team's)
        select.select([], [], [])  # only a signal could end this wait, and every one is blocked here


def _serve_then_exit(fd: int, mark_fd: int) -> None:
    code = 1
    try:
        _serve(fd, mark_fd)
        code = 0
    except BaseException:  # noqa: BLE001  shown in the worker's log, as an uncaught one would be
        import traceback

        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _serve(fd: int, mark_fd: int = -1) -> None:
    st = State()
    _die_with_parent()
    _prepare_loads()
    global _STARTUP_S
    _STARTUP_S = (_perf_ns() - _T0_NS) / 1e9
    # The timed sample's module globals (sample.py), set here before the worker guard records that module.
    if mark_fd >= 0:
        st_ = os.fstat(mark_fd)
        sample._MARK_FD, sample._MARK_ID = mark_fd, (st_.st_dev, st_.st_ino)
        # The first datagram, before any candidate code exists here: the kernel tells the parent this process's pid
        # as it sees it, the one whose memory it writes a sample's values into (gate/refill.py).
        if os.environ.get("TILESMITH_GATE_DEVICE", "cpu").startswith("cpu"):
            os.write(mark_fd, clock.HELLO_MARK)
    # Before any candidate code: the worker's own code and state, and what checks and sends (guard.py),
    # held in this frame. Each reply goes out only if nothing of it moved; else a failure made beforehand.
    sample._DISPATCH = guard.dispatch_state()
    g = guard.build([OPS])
    all_, map_, getattr_, is_, getitem, len_, tuple_ = g.bound
    objs, names, vals, dicts, keys, dvals, tables, sizes = g.objs, g.names, g.vals, g.dicts, g.keys, g.dvals, g.tables, g.sizes
    decode, write, failed, chunks, join_ = g.decode, g.write, g.failed, g.chunks, "".join
    ddump, dtable, dnames, dtables, dstate = g.dispatch
    # A profile or trace function runs Python at every call the worker makes, the reading of the next request
    # included (a red-team cheat's, set in a warm-up call, computed a sample's outputs as its request was decoded):
    # the audit hook refuses to set one, and none may be left set when a request ends (one set before the hook, or
    # through the C API, is still seen). The cyclic collector is off from each reply until the next
    # request is under way, and for a timed one until its window closed: a finalizer it ran there would be
    # candidate code (and its pauses would blur the span before the window: gate/windows.py).
    gettrace, getprofile, gc_off, gc_on = sys.gettrace, sys.getprofile, gc.disable, gc.enable
    readable, stdin_fd, perf = select.select, sys.stdin.fileno(), _perf_ns
    hooks0 = (gettrace(), getprofile())
    # From here on, for good: no code of the worker's own functions replaced in place (its modules', and every
    # function the guard records), no heap walk, no profile or trace function, no other audit hook; each refusal
    # also reported to the parent on the mark socket (gate/worker/audit.py).
    own = [m for n, m in list(sys.modules.items()) if n == "__main__" or n.startswith("tilesmith.")]
    audit.install(sample._MARK_FD, audit.own_functions(own, vals + dvals))
    del g, own
    for line in sys.stdin:
        req = decode(line)
        if req.get("op") == "exit":
            break
        if req.get("op") != "time":
            gc_on()
        # After a warm-up only the cheap checks: the heavy ones (the process's settings, the patches, the dispatcher's
        # tables: ~1.5 ms on the VM) would run between the warm-up calls and the window and leave the caches they
        # warmed cold (a 1-call sample on the VM came out 60 us slower and a real 1.35x win read as 1.04x). What the
        # warm-up changed they still find: after the sample's request, before its reply, comparing with the state
        # before any candidate code ran.
        full, data = req.get("op") != "warm", None
        try:
            reply = {"ok": True, **OPS[req["op"]](st, req)}
            # The reply's bytes before the checks below run Python that candidate code could reach (a class attribute
            # replaced and put back by then): what the op measured cannot be rewritten after this line.
            data = (join_(chunks(reply, 0)) + "\n").encode()
            changed = full and (_state_change(st) or _patched(st))
            if changed:  # checked after every request that ran candidate code, before any answer
                reply = {"ok": False, "code": "process-state", "error": "the candidate changes process state: " + changed}
                data = None
        except Exception as e:  # the candidate raised (or could not load): the parent decides what it means
            data = None
            from tilesmith.errors import TilesmithError

            code = e.code if isinstance(e, TilesmithError) else "raised"
            if isinstance(e, torch.cuda.OutOfMemoryError):
                code = "out-of-memory"
            reply = {"ok": False, "code": code, "error": f"{type(e).__name__}: {e}"}
        try:  # a recorded global deleted, a closure cell emptied: moved, as a replaced one is
            intact = (all_(map_(is_, map_(getattr_, objs, names), vals))
                      and all_(map_(is_, map_(getitem, dicts, keys), dvals)) and tuple_(map_(len_, tables)) == sizes
                      and (not full or tuple_(map_(ddump, dnames)) + tuple_(map_(dtable, dtables)) == dstate)
                      and (gettrace(), getprofile()) == hooks0)
        except Exception:  # noqa: BLE001
            intact = False
        if data is None:
            data = (join_(chunks(reply, 0)) + "\n").encode()
        data = data if intact else failed
        gc_off()
        while data:
            data = data[write(fd, data):]
        if not full:  # the sample's request follows at once: wait for it awake, as the warm-up left the core
            until = perf() + WARM_WAIT_NS
            while not readable([stdin_fd], (), (), 0)[0] and perf() < until:
                pass
