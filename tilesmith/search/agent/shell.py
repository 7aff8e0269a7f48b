"""The agent's files and shell: a backend fenced to the track folder whose `execute` runs in that
folder, in the OS sandbox, with only the variables we pass (never the parent's: no API keys), kills
the whole process group on timeout, caps its output and redacts known secret values from it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from deepagents.backends import LocalShellBackend
from deepagents.backends.protocol import ExecuteResponse

from tilesmith.launch import sandbox
from tilesmith.launch.secrets import redact

# Variables the shell may inherit: what running Python/Triton/CUDA needs, nothing that can carry a secret.
PASS_THROUGH = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "LANG", "LC_ALL",
                "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "OMP_NUM_THREADS", "TMPDIR")


def shell_env(track_dir: Path, graph_dir: Path | None = None) -> dict[str, str]:
    """The shell's whole environment: PATH with this interpreter first, HOME in the scratch folder,
    PYTHONPATH holding this tilesmith (so `python -m tilesmith.search.kernel_bench` runs the same code
    as the host) and TILESMITH_GRAPH_DIR, the captured graph the harness loads."""
    bindirs = [str(Path(sys.executable).parent)]
    for tool in ("nvcc", "ncu", "nsys"):
        found = shutil.which(tool)
        if found:
            bindirs.append(str(Path(found).parent))
    home = Path(track_dir) / "scratch" / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": ":".join(dict.fromkeys(bindirs + ["/usr/local/bin", "/usr/bin", "/bin"])),
           "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    env.update({k: os.environ[k] for k in PASS_THROUGH if k in os.environ})
    import tilesmith

    env["PYTHONPATH"] = str(Path(tilesmith.__file__).resolve().parent.parent)  # the folder holding this package
    if graph_dir is not None:
        env["TILESMITH_GRAPH_DIR"] = str(graph_dir)
    return env


# A command that runs a program which may measure something (Python, a profiler, a built binary) waits
# for the run's timing lock; plain file commands (ls, grep, cat, sed) do not.
MEASURES = re.compile(r"(\bpython[\d.]*\b|\bncu\b|\bnsys\b|\btorchrun\b|(^|[;&|\s])\./)")


class GroupKillShellBackend(LocalShellBackend):
    """LocalShellBackend kills only /bin/sh on timeout; grandchildren and background jobs would
    outlive it (and hold stdout open). Run the command in its own session and kill the group.
    `timing_lock`: held while a command that may measure runs (see MEASURES)."""

    def __init__(self, *args, timing_lock=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._timing_lock = timing_lock

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: the command must be a non-empty string.", exit_code=1)
        lock = self._timing_lock if self._timing_lock is not None and MEASURES.search(command) else None
        with lock if lock is not None else contextlib.nullcontext():
            return self._execute(command, timeout)

    def _execute(self, command: str, timeout: int | None) -> ExecuteResponse:
        limit_s = timeout if timeout is not None else self._default_timeout
        # In the OS sandbox (tilesmith.launch.sandbox): the track folder is the only writable place, no network,
        # no view of other processes (the parent's /proc/PID/environ included), home and workspace hidden.
        # The captured graph stays readable (read-only): the shipped kernel harness loads it.
        graph = self._env.get("TILESMITH_GRAPH_DIR")
        spec = sandbox.Spec(scratch=str(Path(self.cwd) / "scratch"), writable=[str(self.cwd)],
                            readable=[graph] if graph else [])
        Path(spec.scratch).mkdir(parents=True, exist_ok=True)
        proc = sandbox.popen(["/bin/sh", "-c", command], spec, self._env, cwd=str(self.cwd), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            raw, _ = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            sandbox.kill(proc.pid)
            raw, _ = proc.communicate()
        else:
            # The command finished; anything it left running in the background goes too.
            sandbox.kill(proc.pid)
        out = redact((raw or b"").decode("utf-8", "replace"))  # defence in depth: no known secret leaves
        cap = self._max_output_bytes
        truncated = len(out.encode()) > cap
        if truncated:  # keep the end: errors and results are printed last
            out = "... (output truncated to its last %d bytes)\n" % cap + out.encode()[-cap:].decode("utf-8", "ignore")
        if timed_out:
            return ExecuteResponse(output=f"{out}\nError: the command timed out after {limit_s} s (process group killed).",
                                   exit_code=124, truncated=truncated)
        out = out or "<no output>"
        if proc.returncode:
            out = f"{out.rstrip()}\n\nExit code: {proc.returncode}"
        return ExecuteResponse(output=out, exit_code=proc.returncode, truncated=truncated)
