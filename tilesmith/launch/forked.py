"""The deciding process's side of zygote.py: workers forked from an interpreter that has already
imported torch, into the same sandbox sandbox.py builds (see sandbox.popen(..., fork=True)).

TILESMITH_FORK_WORKERS: auto (default) forks CPU gate workers on Linux; on also forks CUDA ones (the
zygote never initialises CUDA, and each worker creates its own context; not yet the default until the
GPU suite has run it); off starts every worker as a new interpreter.

One zygote serves every worker whose environment is the same apart from its own folders (HOME, TMPDIR,
TILESMITH_HOME) and device: what torch reads when it is imported (OMP_NUM_THREADS, GOMP_SPINCOUNT, the
cache folders...) is then what the zygote read. Another environment gets its own zygote.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tilesmith import settings

# Set in each worker's own environment, never read by what the zygote imports: they do not pick the zygote.
# (pytest names the running test in PYTEST_CURRENT_TEST: without it here every test would start its own.)
PER_WORKER = ("HOME", "TMPDIR", "TILESMITH_HOME", "TILESMITH_GATE_DEVICE", "PYTEST_CURRENT_TEST")
_KEEP = 2  # zygotes kept (different environments); the oldest goes beyond it
_START_S = 300.0

_lock = threading.Lock()
_zygotes: dict[str, "_Zygote"] = {}
_failed: dict[str, str] = {}  # environment key -> why its zygote could not start (then never retried)


def mode() -> str:
    """TILESMITH_FORK_WORKERS: auto | on | off (see the module's docstring)."""
    return settings.current().fork_mode


def wanted(device: str) -> bool:
    """Whether a worker for `device` is forked from the zygote (see the module's docstring)."""
    m = mode()
    if m == "off" or not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    return m == "on" or not str(device).startswith("cuda")


def wanted_for(devices: list[str]) -> bool:
    """wanted() for a worker that runs captured graphs on these devices (workspace.graph_devices)."""
    return "unknown" not in devices and all(wanted(d) for d in devices)  # unreadable: started the usual way


def unusable(reply: dict) -> str | None:
    """Why a zygote's first reply rules it out (then workers start as new interpreters), or None."""
    if not reply.get("ready"):
        return f"the zygote did not start: {reply}"
    if reply.get("cuda_driver") not in ("absent", "loaded"):  # see zygote.cuda_driver_state
        return (f"the zygote's import of {reply.get('cuda_driver_by') or 'its modules'} initialised the CUDA driver "
                f"({reply.get('cuda_driver')}): its children could not use CUDA; workers start as new interpreters")
    return None


class Forked:
    """A worker forked by the zygote: pid is its keeper's (the process group to kill), returncode the
    worker's (negative: killed by that signal; -9 where the keeper itself was killed)."""

    def __init__(self, pid: int, stdin, status_fd: int, stdout_fd: int | None = None, stderr_fd: int | None = None,
                 text: bool = False):
        self.pid = pid
        self.stdin = stdin
        self.returncode: int | None = None
        self._status = status_fd  # open until this object goes: threads may poll and wait at once
        self._status_lock = threading.Lock()
        self._pipes = {"out": stdout_fd, "err": stderr_fd}  # our read ends of stdout=PIPE / stderr=PIPE
        self._got = {"out": b"", "err": b""}  # what communicate() read so far
        self._text = text
        self.args = ["<forked>"]

    def communicate(self, timeout: float | None = None):
        """subprocess.Popen.communicate for stdout/stderr pipes (no input): reads both to the end, then waits;
        raises subprocess.TimeoutExpired, and may be called again after it (what was read is kept)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(fd is not None for fd in self._pipes.values()):
            live = {fd: k for k, fd in self._pipes.items() if fd is not None}
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            ready, _, _ = select.select(list(live), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self._got[live[fd]] += chunk
                else:
                    os.close(fd)
                    self._pipes[live[fd]] = None
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out, err = self._got["out"], self._got["err"]
        if self._text:
            return out.decode(errors="replace"), err.decode(errors="replace")
        return out, err

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], 0)
            if ready:
                self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._collect()
        return self.returncode

    def _collect(self) -> None:
        """Read the status once it is there (select said so); another thread may have read it first."""
        with self._status_lock:
            if self.returncode is not None:
                return
            try:
                data = os.read(self._status, 4)
            except OSError:
                data = b""
            self.returncode = struct.unpack("i", data)[0] if len(data) == 4 else -int(signal.SIGKILL)

    def __del__(self):
        for fd in [self._status, *self._pipes.values()]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


class _Zygote:
    def __init__(self, env: dict):
        self.dir = Path(tempfile.mkdtemp(prefix="tilesmith-zygote-"))
        for d in ("home", "tmp"):
            (self.dir / d).mkdir()
        env = {**env, "HOME": str(self.dir / "home"), "TMPDIR": str(self.dir / "tmp"),
               "TILESMITH_HOME": str(self.dir / "home" / "tilesmith")}
        env.pop("TILESMITH_GATE_DEVICE", None)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        life_r = _lifeline()
        self._log = open(self.dir / "log.txt", "wb")
        self.sock = mine
        self.lock = threading.Lock()
        self.ready = False
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "tilesmith.launch.zygote", str(theirs.fileno()), str(life_r)],
                                         env=env, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(), life_r),
                                         start_new_session=True)
        finally:
            theirs.close()

    def _await_ready(self) -> None:
        if self.ready:
            return
        why = unusable(self._recv(_START_S))
        if why:
            raise OSError(why)
        self.ready = True

    def _recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], max(0.0, min(left, 1.0)))
            if ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise OSError("the zygote exited: " + self.log_tail())
                return json.loads(data)
            if self.proc.poll() is not None:
                raise OSError(f"the zygote exited with status {self.proc.returncode}: " + self.log_tail())
            if left <= 0:
                raise OSError(f"the zygote did not answer within {timeout_s:.0f} s")

    def log_tail(self) -> str:
        try:
            return " | ".join((self.dir / "log.txt").read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return ""

    def spawn(self, req: dict, fds: list[int]) -> int:
        with self.lock:
            self._await_ready()
            socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
            reply = self._recv(60.0)
        if "pid" not in reply:
            raise OSError(f"the zygote could not fork: {reply.get('error')}")
        return int(reply["pid"])

    def close(self) -> None:
        for f in (self.sock, self._log):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.kill()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _key(env: dict) -> str:
    items = sorted((k, v) for k, v in env.items() if k not in PER_WORKER)
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _zygote(env: dict, key: str) -> "_Zygote | None":
    with _lock:
        if key in _failed:
            return None
        z = _zygotes.get(key)
        if z is not None and z.proc.poll() is None:
            return z
        try:
            z = _zygotes[key] = _Zygote(env)
        except OSError as e:
            _failed[key] = str(e)
            return None
        retired = [_zygotes.pop(k) for k in list(_zygotes)[:-_KEEP]]
    for r in retired:  # the workers it forked live on: their keepers watch this process's lifeline
        r.close()
    return z


_LIFE: list[int] = []


def _lifeline() -> int:
    """The read end of a pipe whose write end only this process holds, for its whole life: a keeper sees
    it close (EOF) when this process ends, however it ends, and then kills its worker."""
    with _life_lock:
        if not _LIFE:
            r, w = os.pipe()
            _LIFE.extend([r, w])
        return _LIFE[0]


_life_lock = threading.Lock()


def _stdio(value, default: int | None) -> tuple[int | None, bool]:
    """(fd, ours) for a Popen-style stdin/stdout/stderr value; (None, False) when not supported here."""
    if value is None:
        return default, False
    if value == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), True
    if isinstance(value, int) and value >= 0:
        return value, False
    if hasattr(value, "fileno"):
        return value.fileno(), False
    return None, False


def _output(value, default: int, name: str, reads: dict, opened: list) -> int:
    """The worker's end of its stdout or stderr: a new pipe (our read end in reads[name]) or _stdio's."""
    if value == subprocess.PIPE:
        reads[name], fd = os.pipe()
        opened.append(fd)
        return fd
    fd, ours = _stdio(value, default)
    opened += [fd] if ours else []
    return fd


def popen(argv: list[str], sandbox_spec: dict | None, env: dict, cwd, stdin=None, stdout=None, stderr=None,
          pass_fds: tuple = (), text: bool = False, **rest) -> "Forked | None":
    """argv forked from the zygote into the sandbox `sandbox_spec` describes (sandbox.py's full spec, as its stage
    reads it; None at the env-only level), in `cwd`, or None where it cannot be (the caller then starts it the usual
    way): argv must be `sys.executable -m MODULE ...`; stdin a pipe, DEVNULL or a descriptor; stdout a pipe, a file
    or DEVNULL; stderr a pipe, STDOUT, a file or DEVNULL."""
    if rest or len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return None
    key = _key(env)
    z = _zygote(env, key)
    if z is None:
        return None
    opened: list[int] = []
    pipe_w = None
    try:
        if stdin == subprocess.PIPE:
            fd_in, pipe_w = os.pipe()
            opened.append(fd_in)
        else:
            fd_in, ours = _stdio(stdin, None)
            if fd_in is None:
                fd_in, ours = os.open(os.devnull, os.O_RDONLY), True
            opened += [fd_in] if ours else []
        reads: dict = {}  # "out"/"err" -> our read end, for stdout=PIPE / stderr=PIPE
        fd_out = _output(stdout, 1, "out", reads, opened)
        fd_err = fd_out if stderr == subprocess.STDOUT else _output(stderr, 2, "err", reads, opened)
        status_r, status_w = os.pipe()
        opened.append(status_w)
        req = {"module": argv[2], "args": list(argv[3:]), "env": env, "cwd": os.path.realpath(str(cwd)),
               "spec": sandbox_spec, "targets": [0, 1, 2, *pass_fds]}
        try:
            pid = z.spawn(req, [fd_in, fd_out, fd_err, *pass_fds, status_w])
        except (OSError, ValueError) as e:
            for fd in [status_r, pipe_w, *reads.values()]:
                if fd is not None:
                    os.close(fd)
            with _lock:
                _failed[key] = str(e)
                gone = _zygotes.pop(key, None)
            if gone is not None:
                gone.close()
            return None
        return Forked(pid, os.fdopen(pipe_w, "wb") if pipe_w is not None else None, status_r, reads.get("out"),
                      reads.get("err"), text)
    finally:
        for fd in opened:
            os.close(fd)


def _forget_in_child() -> None:
    """After os.fork() in a process that has zygotes (a user's program that forks): the child must not
    talk on its parent's sockets, nor hold its parent's lifeline open. It starts its own when it needs one."""
    global _lock, _life_lock
    _lock, _life_lock = threading.Lock(), threading.Lock()
    for z in _zygotes.values():
        try:
            z.sock.close()  # this process's copy only; the parent's zygote keeps serving the parent
        except OSError:
            pass
    _zygotes.clear()
    _failed.clear()
    for fd in _LIFE:  # the parent's write end above all: its workers must not live as long as this child
        try:
            os.close(fd)
        except OSError:
            pass
    _LIFE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _close_all() -> None:
    with _lock:
        zs = list(_zygotes.values())
        _zygotes.clear()
    for z in zs:
        z.close()
