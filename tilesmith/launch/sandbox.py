"""The one launcher for every process tilesmith starts that runs code it did not write (gate workers, the
tuner's screening worker, the profile worker, replay, the agent's shell): a scrubbed environment and,
on Linux, an OS sandbox (secrets.py: what is secret, and its redaction).

The sandbox is the `unshare` tool (new user, PID, mount, network, IPC and UTS namespaces) followed by this module
run as a stage (stage.py, by path: `python -S -I stage.py SPEC -- ARGV`) that, inside the new namespaces, forks the
command as the PID namespace's first process, mounts a private /proc (only the sandbox's processes),
hides the user's home, TILESMITH_HOME, the system temp folder and any other hidden folders behind empty
private file systems, binds back what the command must read (the interpreter, its packages, the graph
folder) read-only and its scratch folder read-write, gives the compile caches a private writable layer
(overlay: reads hit the shared cache, writes stay in scratch), and makes every other mount read-only.
No network: the new network namespace has only a loopback device that is down. Its own System V IPC (shared
memory, semaphores, message queues) and POSIX message queues, freed with the namespace when its last process ends:
a segment made there never outlives the command (issue: a candidate's shared-memory segment outlived the gate); its
own host name, which it may change without changing the machine's.

TILESMITH_SANDBOX=auto (default) uses namespaces where they work and otherwise the scrubbed environment
alone with one warning; `require` refuses to run without them; `off` forces the environment-only level.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from tilesmith import settings
from tilesmith.launch.secrets import is_secret, redact

LEVELS = ("namespaces", "env-only")


# -- environment -----------------------------------------------------------------------------------

def shared_caches() -> dict[str, str]:
    """The compile caches a worker reads (kernels the user's run compiled): Inductor's and Triton's."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:
        user = f"uid_{os.getuid()}"
    default_dir = os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    return {"TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_dir,
            "TILESMITH_INDUCTOR_DEFAULT_DIR": default_dir,
            "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")
            or os.path.join(os.path.expanduser("~"), ".triton", "cache")}


def scrubbed_env(tmp: Path, cpu_kernels: bool = True) -> dict:
    """The parent's environment minus secrets, with its own HOME/TMPDIR and the compile caches kept warm.
    cpu_kernels=False: a worker that runs no graph on the CPU (CUDA graphs, the sandbox probe) is not told
    whether it may skip Inductor's CPU vector-ISA probe: finding that out builds a C++ program per ISA in
    this process, seconds on a warm cache and up to a minute on a cold one (an H200 host), for nothing
    such a worker uses (a C++ kernel it meets after all probes as usual)."""
    env = {k: v for k, v in os.environ.items() if not is_secret(k)}
    caches = shared_caches()
    env["TORCHINDUCTOR_CACHE_DIR"] = caches["TORCHINDUCTOR_CACHE_DIR"]
    # Inductor keeps precompiled C++ headers under the *temp* dir's default cache, whatever
    # TORCHINDUCTOR_CACHE_DIR says; the worker points there so it does not rebuild them (seconds each).
    env["TILESMITH_GATE_HEADER_DIR"] = os.path.join(caches["TILESMITH_INDUCTOR_DEFAULT_DIR"], "precompiled_headers")
    env["TRITON_CACHE_DIR"] = caches["TRITON_CACHE_DIR"]
    for d in ("home", "tmp"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(tmp / "home"), TMPDIR=str(tmp / "tmp"), TILESMITH_HOME=str(tmp / "home" / "tilesmith"),
               TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    env.pop("TILESMITH_DEBUG", None)
    if cpu_kernels and "TORCHINDUCTOR_VEC_ISA_OK" not in env and vec_isa_settled():
        env["TORCHINDUCTOR_VEC_ISA_OK"] = "1"  # the workers pick what the probe would, without probing
    return env


_ISA: dict = {}


def vec_isa_settled() -> bool:
    """Whether every CPU vector ISA this CPU's flags offer Inductor also builds and loads here (Inductor's
    probe, run once in this process). Then a worker may skip that probe (TORCHINDUCTOR_VEC_ISA_OK=1: about
    a second and three subprocesses in every interpreter that loads C++ kernels) and picks exactly what
    the probe would have; where the two lists differ, workers probe as usual."""
    if "ok" not in _ISA:
        try:
            from torch._inductor import config, cpu_vec_isa

            probed = [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]
            with config.patch({"cpp.vec_isa_ok": True}):  # what the flags alone offer, nothing built
                offered = [str(i) for i in cpu_vec_isa.valid_vec_isa_list.__wrapped__()]
            _ISA["ok"] = bool(probed) and probed == offered
        except Exception:  # noqa: BLE001 - another torch, another platform: workers probe as usual
            _ISA["ok"] = False
    return _ISA["ok"]


# -- the sandbox -----------------------------------------------------------------------------------

@dataclass
class Spec:
    """What one sandboxed command may see: paths are absolute, in the parent's view."""

    scratch: str  # read-write, the command's own folder
    readable: list[str] = field(default_factory=list)  # bound back read-only (e.g. the graph folder)
    writable: list[str] = field(default_factory=list)  # bound back read-write (the agent's track folder)
    hidden: list[str] = field(default_factory=list)  # beyond home, TILESMITH_HOME and the temp folder
    caches: list[str] = field(default_factory=list)  # shared caches given a private writable layer
    private_tmp: list[str] = field(default_factory=list)  # hidden, yet writable: private, empty, discarded
    # "all": the machine's /dev (GPU device nodes); "basic": a /dev of its own with null, zero, full,
    # random, urandom and tty only, for commands that need no device (CPU workers): no block devices.
    devices: str = "all"
    # The torch devices of the captured graphs the command runs ("unknown" for one whose graph.json cannot be
    # read); None for a command that runs none (the agent's shell). popen forks it from the zygote or not by them.
    graph_devices: list[str] | None = None

    @classmethod
    def for_graphs(cls, scratch, graph_devices: list[str], **kw) -> "Spec":
        """A worker that runs captured graphs on these torch devices: a /dev of its own without device nodes where
        all are the CPU (devices_for), forked from the zygote where forked.wanted_for says so (popen)."""
        return cls(scratch=str(scratch), devices=devices_for(*graph_devices), graph_devices=list(graph_devices), **kw)


_LEVEL: dict = {}


def mode() -> str:
    """TILESMITH_SANDBOX: auto | off | require (see the module's docstring)."""
    return settings.current().sandbox_mode


def level() -> str:
    """The sandbox level commands start with now: 'namespaces' or 'env-only' (probed once per process)."""
    m = mode()
    if m == "off":
        return "env-only"
    if "probe" not in _LEVEL:
        _LEVEL["probe"] = _probe()
    ok, why = _LEVEL["probe"]
    if ok:
        return "namespaces"
    if m == "require":
        from tilesmith.errors import TilesmithError

        raise TilesmithError(f"the OS sandbox is not available: {why}", code="no-sandbox",
                             hint="set TILESMITH_SANDBOX=auto to run with the scrubbed environment only")
    if not _LEVEL.get("warned"):
        _LEVEL["warned"] = True
        warnings.warn(f"tilesmith: no OS sandbox ({why}); workers run with a scrubbed environment only "
                      "(sandbox: env-only)", RuntimeWarning, stacklevel=2)
    return "env-only"


def _probe() -> tuple[bool, str]:
    if not sys.platform.startswith("linux") or not shutil.which("unshare"):
        return False, "needs Linux and the `unshare` tool"
    tmp = Path(tempfile.mkdtemp(prefix="tilesmith-sandbox-probe-"))
    try:
        argv = wrap([sys.executable, "-c", "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))"],
                    Spec(scratch=str(tmp)), force=True)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=scrubbed_env(tmp, cpu_kernels=False),
                           cwd=tmp)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"unshare failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if p.returncode != 0 or p.stdout.strip() != "1":
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-2:])
        return False, f"unshare failed (exit {p.returncode}): {tail[:300]}"
    return True, ""


def wrap(argv: list[str], spec: Spec, force: bool = False) -> list[str]:
    """argv run inside the sandbox described by spec (or argv itself at the env-only level)."""
    if not force and level() != "namespaces":
        return list(argv)
    full = _full_spec(spec)
    return ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts", "--propagation", "private", "--",
            sys.executable, "-S", "-I", str(Path(__file__).with_name("stage.py")), json.dumps(full.__dict__),
            "--", *argv]


def devices_for(*devices: str) -> str:
    """Spec.devices for a command that runs on these torch devices: "basic" when all are the CPU."""
    return "basic" if devices and all(str(d).startswith("cpu") for d in devices) else "all"


def _full_spec(spec: Spec) -> Spec:
    """spec with what every sandbox adds: the interpreter's paths, the default hidden folders, the caches."""
    base = [os.path.realpath(p) for p in _default_hidden()]
    full = Spec(scratch=os.path.realpath(spec.scratch), readable=_needed_paths() + [os.path.realpath(p) for p in spec.readable],
                writable=[os.path.realpath(p) for p in spec.writable],
                hidden=base + [os.path.realpath(p) for p in spec.hidden],
                caches=[os.path.realpath(p) for p in (spec.caches or _cache_dirs())],
                private_tmp=[os.path.realpath(p) for p in (tempfile.gettempdir(), "/dev/shm")], devices=spec.devices)
    for c in full.caches:
        os.makedirs(c, exist_ok=True)  # a cache made inside the sandbox would be lost, and a hidden one unwritable
    return full


def _default_hidden() -> list[str]:
    from tilesmith.paths import home as tilesmith_home

    out = [os.path.expanduser("~"), tempfile.gettempdir(), "/dev/shm"]
    try:
        out.append(str(tilesmith_home()))
    except Exception:
        pass
    return [p for p in out if os.path.isdir(p)]


def _cache_dirs() -> list[str]:
    c = shared_caches()
    return list(dict.fromkeys([c["TORCHINDUCTOR_CACHE_DIR"], c["TILESMITH_INDUCTOR_DEFAULT_DIR"], c["TRITON_CACHE_DIR"]]))


def _needed_paths() -> list[str]:
    """What the interpreter and its packages live in: bound back read-only where a hidden folder covers them."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[2])}  # holds tilesmith/
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    paths.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


# -- starting commands -----------------------------------------------------------------------------

def popen(argv: list[str], spec: Spec, env: dict | None = None, fork: bool | None = None, **kw):
    """Start argv in the sandbox, in its scratch folder, with `env` (default: the scrubbed environment).

    Forked: a `python -m MODULE ...` argv is forked from the zygote (zygote.py) into the same sandbox
    instead of a new interpreter importing torch again; the result then has the part of subprocess.Popen's
    interface a gate worker uses (pid, stdin, poll, wait, returncode). Where the zygote cannot serve it
    (another argv, other standard streams, no zygote), it starts the usual way. Whether to fork is the
    spec's: a command that runs captured graphs on devices forked.wanted_for accepts (spec.graph_devices);
    `fork` True or False decides it instead."""
    scratch = Path(spec.scratch)
    env = scrubbed_env(scratch, spec.devices == "basic") if env is None else env
    kw.setdefault("cwd", scratch)
    if fork is None:
        fork = bool(spec.graph_devices) and _forked().wanted_for(spec.graph_devices)
    if fork:
        forked = _forked()
        full = _full_spec(spec).__dict__ if level() == "namespaces" else None
        p = forked.popen(argv, full, env, **kw)
        if p is not None:
            return p
    return subprocess.Popen(wrap(argv, spec), env=env, start_new_session=True, **kw)


def _forked():
    from tilesmith.launch import forked  # on first use: its import registers at-fork and exit handlers

    return forked


@dataclass
class Result:
    returncode: int | None  # None: killed at the timeout
    reply: dict | None  # the last line of stdout that parses as a JSON object
    tail: str  # the last lines of stderr (else stdout), redacted, for error messages
    level: str  # the sandbox level it ran at
    spawned: float = 0.0  # time.time() right before the process was started (its environment made)


def run_json(argv: list[str], spec: Spec, timeout_s: float, env_extra: dict | None = None,
             fork: bool | None = None) -> Result:
    """Run a worker that prints its answer as one JSON line last: "start a worker, parse its last JSON line"
    (fork: see popen)."""
    lvl = level()
    env = {**scrubbed_env(Path(spec.scratch), spec.devices == "basic"), **(env_extra or {})}
    spawned = time.time()
    p = popen(argv, spec, env, fork=fork, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              text=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        return Result(None, None, f"killed after {timeout_s:.0f} s", lvl, spawned)
    _kill_group(p)  # anything it left running goes too
    reply = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if isinstance(reply, dict):
                break
            reply = None
    tail = " | ".join((err or out).strip().splitlines()[-3:])
    return Result(p.returncode, reply, redact(tail), lvl, spawned)


def kill(pid: int) -> None:
    """SIGKILL everything a command started with popen() runs: the first process of its sandbox (the
    child of `pid`, the stage or the keeper; the kernel then kills every process in its PID namespace),
    then `pid`'s process group. The group alone is not enough: the command can leave it (setsid) and
    clear its PR_SET_PDEATHSIG, and then outlives the stage and the keeper killed with the group."""
    import signal

    kids = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        pass
    for k in kids:  # still children of the live `pid`: not reaped, so not reused
        try:
            os.kill(k, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(p: subprocess.Popen) -> None:
    kill(p.pid)
    try:
        p.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        pass
