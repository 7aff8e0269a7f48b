"""Worker processes for the gate: a fresh interpreter per worker, a scrubbed environment, a private
result pipe, timeouts that kill the whole process group, and every failure turned into a reason. Workers started
ahead of need, and those kept between decisions: gate/spares.py."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tilesmith.launch import sandbox
from tilesmith.gate import marksock
from tilesmith.gate.clock import ARMED_MARK, HELLO_MARK, LAYOUT_MARK, LAYOUT_PART, VALUES_GO, WINDOW_MARK
from tilesmith.gate.freeze import supported as freeze_supported
from tilesmith.gate.worker import audit
from tilesmith.gate.procfs import tree_cpu_ns
from tilesmith.launch.secrets import redact

class WorkerFailure(Exception):
    """The worker crashed, hung, raised or answered nonsense; `code` is the gate's reason code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def worker_env(tmp: Path, device: str = "cpu") -> dict:
    """The parent's environment minus secrets (tilesmith.launch.sandbox.scrubbed_env) for a worker on `device`."""
    return sandbox.scrubbed_env(tmp, cpu_kernels=str(device).startswith("cpu"))


def openmp_wait(env: dict) -> dict:
    """env, with OpenMP threads that spin only briefly after a parallel region.

    Timed workers take turns on the same cores. After its sample a worker's OpenMP threads spin-wait
    (libgomp's default: GOMP_SPINCOUNT 300,000 pauses, milliseconds) on the cores the next worker's sample
    then needs: on 2 cores a baseline timed right after the candidate's worker ran 2.7x slower than one
    timed after itself, and a true 1.085x win read as 0.98-1.01x (benchmarks/RESULTS.md). 10,000 still
    spans the gaps between the kernels of one call. Intel's runtime: KMP_BLOCKTIME, in ms. The gate sets
    them whatever the user's environment says (OMP_WAIT_POLICY=active would spin for ever), except a
    passive policy, which never spins and is kept. A worker that stays busy between its requests is
    rejected (timing.py, IDLE_CPU_SHARE), so the gate's workers must go quiet when they are done."""
    if env.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
        return env
    out = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
    out.update(GOMP_SPINCOUNT="10000", KMP_BLOCKTIME="1")
    return out


MAX_LAYOUT_PARTS = 256  # a timed sample's outputs' layout, in LAYOUT_CHUNK datagrams, at most (4 MiB)


class Worker:
    """One `python -m tilesmith.gate.worker` process; requests on stdin, replies on a private pipe, timed windows
    marked on a timestamped socket."""

    def __init__(self, name: str, scratch: Path, device: str = "cpu", readable: tuple = ()):
        """readable: folders the worker may read besides its own (the graph folder); everything it
        writes goes in its own folder, self.dir, the only writable place in its sandbox."""
        self.name = name
        self.device = device
        self.started = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))
        self.log_path = self.dir / "log.txt"
        self.sandbox = sandbox.level()
        r, w = os.pipe()
        self._log = open(self.log_path, "wb")
        # Window marks (clock.WINDOW_MARK) come on a datagram socket the kernel timestamps as each is sent.
        self._marks_sock, theirs = marksock.pair()
        # Where samples stop for the parent's read (gate/freeze.py), each datagram comes with its sender's pid: asked
        # for before the worker starts, so its first one (clock.HELLO_MARK, sent before it loads anything) has it.
        stops = self._marks_sock is not None and freeze_supported(device) and marksock.passes_creds(self._marks_sock)
        fds = (w,) + ((theirs.fileno(),) if theirs is not None else ())
        cmd = [sys.executable, "-m", "tilesmith.gate.worker", *map(str, fds)]
        env = openmp_wait({**worker_env(self.dir, device), "TILESMITH_GATE_DEVICE": device})
        spec = sandbox.Spec.for_graphs(self.dir, [device], readable=[str(p) for p in readable])
        self.proc = sandbox.popen(cmd, spec, env, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                  pass_fds=fds)
        os.close(w)
        if theirs is not None:
            theirs.close()
        self._r = r
        self._buf = b""
        self._closed = False
        # When the last request's window marks were sent (kernel time, ns); None where marks cannot be timestamped.
        self.marks: list[int] | None = [] if self._marks_sock is not None else None
        self.sent_ns = 0  # when the last request was written (time.time_ns: the clock the kernel stamps marks with)
        # A sample that stops for the parent's read (gate/freeze.py): when the stop was sent (None: it did not stop),
        # what the parent's read returned, or why it failed.
        self.stop_ns: int | None = None
        # The scheduler's account of the stopped tree as a filled sample started and as it ended (procfs.sched): the
        # serving thread's wait for a CPU in between that nothing of the worker's caused is not the sample's.
        self.sched: tuple = (None, None)
        self._armed: int | None = 0  # None while a filled request waits for clock.ARMED_MARK, then the sender's pid
        self._serving_tid: int | None = None  # the thread that sent it: the one whose wait for a CPU is read
        self.frozen: object = None
        self.freeze_error = ""
        self.chosen: int | None = None  # the call the parent chose to check, with the worker stopped
        self._layout: tuple[int, bytes] | None = None  # (sender's pid, layout) from the last layout datagrams
        self._parts: list[bytes] = []  # the layout's datagrams so far
        self.stops = stops
        # The worker's pid as the kernel named it in its first datagram, and its buffers' addresses by role (its
        # timing setup's answer): where the parent writes a sample's values with the worker stopped (gate/refill.py).
        self.pid: int | None = None
        self.addresses: dict = {}
        self.values = None  # a refill.Refill, where the parent writes them
        self.refused: list[str] = []  # what the worker's audit hook refused, as it reported on the mark socket

    def request(self, msg: dict, timeout_s: float, read=None, fill=None) -> dict:
        """Send one request and wait for its reply; raises WorkerFailure (and kills the worker) on any failure.
        The window marks a timed request sends before its reply (clock.WINDOW_MARK) are then taken off the mark
        socket; `self.marks` holds the kernel's send times, the parent's own measure of the window.
        read: for a request with "freeze", what to do with the stopped worker (gate/freeze.py): `read(pid, layout,
        call)` with the call the parent chose (self.chosen), its result in self.frozen (an exception's text in
        self.freeze_error); self.stop_ns when the stop was sent.
        fill: where samples stop (self.stops), `fill(pid)` writes the sample's values into the worker with its tree
        stopped, before the request is written; self.sent_ns is then when the tree was let run again, the sample's
        start (gate/refill.py). A failure to write is the candidate's: WorkerFailure `inputs-unwritable`."""
        self.stop_ns, self.frozen, self.freeze_error, self._layout, self._parts = None, None, "", None, []
        self.sched = (None, None)
        self.chosen = None
        early: list[int] = []
        if self.marks is not None:
            self._drain_marks()  # none should be left from earlier requests: they would not be this one's
            self.marks = []
        line = (json.dumps(msg) + "\n").encode()
        if fill is not None and self.stops:
            early = self._filled_request(line, fill, timeout_s)
        else:
            try:
                self.sent_ns = time.time_ns()
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._fail("crashed", "the worker exited before the request") from None
        if msg.get("freeze") and self.marks is not None:
            early += self._stop_at_window_end(timeout_s, read)
        reply = self._read_line(timeout_s)
        if self.marks is not None:
            self.marks = early + self._drain_marks()  # sent before the reply, so queued before it arrived
        if self.refused:  # whatever the reply says: the candidate may have caught the refusal and gone on
            self.close()
            raise WorkerFailure("process-state", "the candidate tried what the gate worker refuses (its audit hook): "
                                + ", ".join(dict.fromkeys(self.refused)) + " (code replaced in place, the heap walked, "
                                "a profile or trace function set, or another audit hook added)")
        try:
            d = json.loads(reply)
        except ValueError:
            raise self._fail("protocol", "the worker answered something that is not JSON") from None
        if not isinstance(d, dict):
            raise self._fail("protocol", "the worker answered something that is not an object")
        if not d.get("ok"):
            self.close()
            raise WorkerFailure(str(d.get("code") or "raised")[:40], redact(str(d.get("error") or "failed"))[:800])
        if msg.get("op") == "time_setup" and isinstance(d.get("addresses"), dict):
            self.addresses.update(d["addresses"])
        return d

    def _filled_request(self, line: bytes, fill, timeout_s: float) -> list[int]:
        """Write the request and wait for the worker to be ready for its values (clock.ARMED_MARK: everything before
        the window done); then stop its tree, write the sample's values into it (`fill`), queue the go and let it
        run: self.sent_ns, the sample's start, is taken right before (gate/refill.py). Returns the marks taken off the
        socket meanwhile; returns early where the reply comes first (a request the worker refused)."""
        from tilesmith.gate import procfs, refill

        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fail("crashed", "the worker exited before the request") from None
        got: list[int] = []
        self._armed = None
        deadline = time.monotonic() + timeout_s
        while self._armed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return got  # _read_line's own timeout then fails the request
            ready, _, _ = select.select([self._marks_sock, self._r], [], [], min(left, 1.0))
            if self._marks_sock in ready:
                got += self._drain_marks()
            elif self._r in ready:
                return got
        pids: list[int] = []
        error = ""
        try:
            pids = procfs.freeze(self.proc.pid)
            if self.pid not in pids or self._armed != self.pid:
                raise refill.Unwritable("the worker's own pid is not known, not in its process tree, or not the one "
                                        "that asked for the values")
            fill(self.pid)
            self._marks_sock.send(VALUES_GO)
            self.sched = (procfs.sched(pids, self.pid, self._serving_tid), None)
        except OSError as e:
            error = f"the worker's mark socket is gone ({e})"
        except refill.Unwritable as e:
            error = str(e)
        finally:
            self.sent_ns = time.time_ns()
            procfs.thaw(pids)
        if error:
            self.close()
            raise WorkerFailure("inputs-unwritable", "the parent could not write the sample's input values into the "
                                                     f"stopped worker: {error}"[:800])
        return got

    def _stop_at_window_end(self, timeout_s: float, read) -> list[int]:
        """Wait for the layout the worker sends right after its window's closing mark, then stop its tree, choose the
        call that is checked, hand both to `read`, let the tree run again and send the go with that call
        (gate/freeze.py). Returns the marks taken off the socket meanwhile. Returns without a stop where the reply
        comes first (the caller finds stop_ns None)."""
        from tilesmith.gate import freeze

        got: list[int] = []
        deadline = time.monotonic() + timeout_s
        while self._layout is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return got  # _read_line's own timeout then fails the request
            ready, _, _ = select.select([self._marks_sock, self._r], [], [], min(left, 1.0))
            if self._marks_sock in ready:
                got += self._drain_marks()
                continue
            if self._r in ready:
                return got
        pid, layout = self._layout
        pids: list[int] = []
        call = 0
        try:
            # Stopped before anything else: the sample ends there.
            pids, self.stop_ns = freeze.stop(pid, self.proc.pid)
            if self.sched[0] is not None:  # a filled sample: the scheduler's account at its end too
                from tilesmith.gate import procfs

                self.sched = (self.sched[0], procfs.sched(pids, pid, self._serving_tid))
            parsed = freeze.parse(layout)
            # Drawn here, in the parent, once the calls have run and the worker is stopped: every call equally
            # likely, and no code in the worker's process saw the draw or could steer it.
            call = self.chosen = secrets.randbelow(parsed.calls)
            self.frozen = read(pid, parsed, call) if read is not None else None
        except Exception as e:  # noqa: BLE001  the candidate's failure to be read, or the tree's to stop
            self.freeze_error = f"{type(e).__name__}: {e}"[:400]
        finally:
            from tilesmith.gate.procfs import thaw

            thaw(pids)
        with contextlib.suppress(OSError):
            self._marks_sock.send(b"G" + call.to_bytes(4, "little"))
        return got

    def cpu_ns(self) -> int:
        """CPU time the worker and every process it started have used so far (tree_cpu_ns)."""
        return tree_cpu_ns(self.proc.pid)

    def _read_line(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("timeout", f"no answer within {timeout_s:.0f} s (killed)")
            ready, _, _ = select.select([self._r], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise self._fail("crashed", "the worker died")
                self._buf += chunk
                if len(self._buf) > 64 << 20:
                    raise self._fail("protocol", "the worker's answer is too long")
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _drain_marks(self) -> list[int]:
        """The kernel's send times (ns) of the window marks queued on the mark socket, oldest first; anything
        else on it (a datagram that is not a mark, or one without a timestamp) counts as -1, which no window has.
        The audit hook's refusals go to `self.refused` instead."""
        out = []
        while True:
            try:
                data, ts, pid = marksock.receive(self._marks_sock)
            except (BlockingIOError, InterruptedError):
                return out
            except OSError:
                return out + [-1]
            if data[:1] in (LAYOUT_MARK, LAYOUT_PART):  # the outputs' layout, sent as the worker waits to be stopped
                self._parts.append(data[1:])
                if self._layout is not None or not pid or len(self._parts) > MAX_LAYOUT_PARTS:
                    out.append(-1)  # a second one, one without its sender, or too long: no window check can hold
                elif data[:1] == LAYOUT_MARK:
                    self._layout, self._parts = (pid, b"".join(self._parts)), []
                continue
            if data == HELLO_MARK:  # the worker's first datagram, before it loaded anything: its pid
                if self.pid is None and pid:
                    self.pid = pid
                continue
            if data[:1] == ARMED_MARK and len(data) == 5:  # ready for the parent's values (_filled_request), with the
                if self._armed is None:  # serving thread's id; a second one is not a window's (the sample is forged)
                    self._armed, self._serving_tid = pid or -1, int.from_bytes(data[1:], "little")
                    continue
            if data.startswith(audit.REFUSAL):  # the worker's audit hook refused something (gate/worker/audit.py)
                self.refused += audit.refusals([data])
                continue
            out.append(ts if data == WINDOW_MARK else -1)
            if len(out) > 64:  # a worker flooding the socket: no window check can hold
                return out

    def _fail(self, code: str, message: str) -> WorkerFailure:
        self.kill()
        rc = self.proc.returncode
        if code == "crashed" and rc is not None and rc < 0:
            try:
                message = f"the worker was killed by {signal.Signals(-rc).name}"
            except ValueError:
                message = f"the worker was killed by signal {-rc}"
        elif code == "crashed" and rc is not None:
            message = f"the worker exited with status {rc}"
        tail = self.log_tail()
        return WorkerFailure(code, message + (f"; last output: {tail}" if tail else ""))

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return redact(" | ".join(line.strip()[:200] for line in text[-lines:]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            sandbox.kill(self.proc.pid)  # the sandbox's first process too: the group alone can be left
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Kill the worker's whole process group and remove its folder. No graceful exit: a worker keeps
        nothing worth saving (compiled kernels are cached as they are built), and an interpreter with
        torch loaded takes a second to shut down."""
        if self._closed:
            return
        self._closed = True
        self.kill()
        sandbox.kill(self.proc.pid)  # leftovers the candidate may have forked
        for f in (self.proc.stdin, self._log):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self._r)
        except OSError:
            pass
        if self._marks_sock is not None:
            self._marks_sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
