"""Worker processes for the gate: a fresh interpreter per worker, a scrubbed environment, a private
result pipe, timeouts that kill the whole process group, and every failure turned into a reason."""

from __future__ import annotations

import getpass
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT", re.I)


class WorkerFailure(Exception):
    """The worker crashed, hung, raised or answered nonsense; `code` is the gate's reason code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def worker_env(tmp: Path) -> dict:
    """The parent's environment minus secrets, with its own HOME/TMPDIR and the compile caches kept warm."""
    env = {k: v for k, v in os.environ.items() if not _SECRET.search(k)}
    # Resolved before HOME/TMPDIR move, so the worker finds the kernels the parent's run compiled.
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:
        user = f"uid_{os.getuid()}"
    default_dir = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", default_dir)
    # Inductor keeps precompiled C++ headers under the *temp* dir's default cache, whatever
    # TORCHINDUCTOR_CACHE_DIR says; the worker points there so it does not rebuild them (seconds each).
    env["TILESMITH_GATE_HEADER_DIR"] = os.path.join(default_dir, "precompiled_headers")
    env.setdefault("TRITON_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".triton", "cache"))
    for d in ("home", "tmp"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(tmp / "home"), TMPDIR=str(tmp / "tmp"), TILESMITH_HOME=str(tmp / "home" / "tilesmith"),
               TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    env.pop("TILESMITH_DEBUG", None)
    return env


class Worker:
    """One `python -m tilesmith.gate.worker` process; requests on stdin, replies on a private pipe."""

    def __init__(self, name: str, scratch: Path, device: str = "cpu"):
        self.name = name
        self.started = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))
        self.log_path = self.dir / "log.txt"
        r, w = os.pipe()
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "tilesmith.gate.worker", str(w)]
        env = {**worker_env(self.dir), "TILESMITH_GATE_DEVICE": device}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=self.dir, pass_fds=(w,), start_new_session=True)
        os.close(w)
        self._r = r
        self._buf = b""
        self._closed = False

    def request(self, msg: dict, timeout_s: float) -> dict:
        """Send one request and wait for its reply; raises WorkerFailure (and kills the worker) on any failure."""
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fail("crashed", "the worker exited before the request") from None
        reply = self._read_line(timeout_s)
        try:
            d = json.loads(reply)
        except ValueError:
            raise self._fail("protocol", "the worker answered something that is not JSON") from None
        if not isinstance(d, dict):
            raise self._fail("protocol", "the worker answered something that is not an object")
        if not d.get("ok"):
            self.close()
            raise WorkerFailure(str(d.get("code") or "raised")[:40], str(d.get("error") or "failed")[:800])
        return d

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
        return " | ".join(line.strip()[:200] for line in text[-lines:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers the candidate may have forked
        except (ProcessLookupError, PermissionError):
            pass
        for f in (self.proc.stdin, self._log):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self._r)
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
