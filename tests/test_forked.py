"""Workers forked from the zygote (tilesmith/launch/zygote.py, tilesmith/launch/forked.py): the same sandbox, environment,
descriptors and exit statuses as a worker started as a new interpreter, and none outlives its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tilesmith.launch import forked, sandbox
from tilesmith.errors import TilesmithError

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = sandbox.level() == "namespaces"


def _start(tmp: Path, *args: str, fork: bool = True, devices: str = "all", **env_extra):
    scratch = tmp / f"w{len(list(tmp.iterdir()))}"
    scratch.mkdir()
    env = {**sandbox.scrubbed_env(scratch), "PYTHONPATH": str(ROOT), **env_extra}
    log = open(scratch / "out.txt", "wb")
    p = sandbox.popen([sys.executable, "-m", "tests.fakes.probe", *args], sandbox.Spec(scratch=str(scratch), devices=devices), env,
                      fork=fork, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return p, scratch, env


def _report(p, scratch: Path) -> dict:
    assert p.wait(timeout=120) == 0, (scratch / "out.txt").read_text()
    return json.loads((scratch / "out.txt").read_text().strip().splitlines()[-1])


def test_a_forked_worker_sees_its_own_environment_folder_and_descriptors_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-forked-worker-must-not-see-this")
    p, scratch, env = _start(tmp_path, "report", "x y")
    q, scratch2, _ = _start(tmp_path, "report")
    assert isinstance(p, forked.Forked) and isinstance(q, forked.Forked)  # not a new interpreter
    a, b = _report(p, scratch), _report(q, scratch2)
    assert a["env"] == env  # exactly what it was given: its own HOME, TMPDIR, TILESMITH_HOME
    assert a["tmp"] == env["TMPDIR"] and a["cwd"] == str(scratch.resolve()) and a["path0"] == str(scratch.resolve())
    assert a["argv"] == ["report", "x y"]
    assert a["fds"] == [0, 1, 2]  # not the zygote's socket, not the lifeline
    assert a["random"] != b["random"]  # seeded afresh, as a new interpreter is
    for r in (a, b):
        assert "sk-forked-worker-must-not-see-this" not in json.dumps(r)  # neither given nor inherited
    if NAMESPACES:
        assert a["pid"] == 1 and a["procs"] == [1]  # its own PID namespace: no zygote, no deciding process
        assert a["net"] != "reached"


def test_exit_status_raise_and_kill_reach_the_parent(tmp_path):
    p, scratch, _ = _start(tmp_path, "exit", "3")
    assert p.wait(timeout=120) == 3
    p, scratch, _ = _start(tmp_path, "raise")
    assert p.wait(timeout=120) == 1
    assert "the probe raised on purpose" in (scratch / "out.txt").read_text()
    p, scratch, _ = _start(tmp_path, "sleep")
    deadline = time.monotonic() + 120
    while not (scratch / "out.txt").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.1)
    os.killpg(p.pid, signal.SIGKILL)  # what Worker.kill does: the keeper's group, the worker in it
    assert p.wait(timeout=30) == -signal.SIGKILL


def test_workers_do_not_outlive_the_process_that_started_them(tmp_path):
    """The deciding process is killed outright (no atexit, no cleanup): its workers go with it, and the
    zygote removes its own folder (the suite had left dozens of them in /tmp)."""
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from pathlib import Path
        from tilesmith.launch import forked, sandbox
        scratch = Path({str(tmp_path)!r}) / "w"; scratch.mkdir()
        env = {{**sandbox.scrubbed_env(scratch), "PYTHONPATH": {str(ROOT)!r}}}
        log = open(scratch / "out.txt", "wb")
        p = sandbox.popen([sys.executable, "-m", "tests.fakes.probe", "sleep"], sandbox.Spec(scratch=str(scratch)),
                          env, fork=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        print(type(p).__name__, p.pid, *[z.dir for z in forked._zygotes.values()], flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    kind, keeper, zygote_dir = proc.stdout.readline().split()
    assert kind == "Forked" and Path(zygote_dir).is_dir()
    out = tmp_path / "w" / "out.txt"
    deadline = time.monotonic() + 120
    while not out.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = _children(int(keeper))
    assert len(worker) == 1 and _alive(int(keeper)) and _alive(worker[0])
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while (_alive(int(keeper)) or _alive(worker[0]) or Path(zygote_dir).exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(int(keeper)) and not _alive(worker[0])
    assert not Path(zygote_dir).exists()


def _children(pid: int) -> list[int]:
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        out += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_one_zygote_per_environment_torch_reads_at_import(tmp_path):
    p, scratch, _ = _start(tmp_path, "report", OMP_NUM_THREADS="1")
    one = _report(p, scratch)
    zygotes = len(forked._zygotes)
    p, scratch, _ = _start(tmp_path, "report", OMP_NUM_THREADS="1", PYTEST_CURRENT_TEST="another test (call)")
    _report(p, scratch)
    assert len(forked._zygotes) == zygotes  # its own folders and the test's name: the same zygote
    p, scratch, _ = _start(tmp_path, "report", OMP_NUM_THREADS="2")
    two = _report(p, scratch)
    assert (one["threads"], two["threads"]) == (1, 2)  # what the zygote's torch read at import


def test_the_zygote_reports_the_cuda_driver_state_and_only_an_initialised_driver_stops_forking(tmp_path, monkeypatch):
    from tilesmith.launch import zygote

    # This machine has no CUDA driver: torch's import maps none, and workers fork.
    assert zygote.cuda_driver_state() == "absent"
    p, scratch, _ = _start(tmp_path, "report")
    assert isinstance(p, forked.Forked), forked._failed
    _report(p, scratch)

    # A mapped driver: cuCtxGetCurrent's answer says whether cuInit ran (3: CUDA_ERROR_NOT_INITIALIZED).
    class Driver:
        def __init__(self, rc):
            self.rc = rc

        def cuCtxGetCurrent(self, ptr):
            return self.rc

    monkeypatch.setattr(zygote, "_libcuda_mapped", lambda: True)
    for rc, state in ((3, "loaded"), (0, "initialised"), (34, "initialised")):
        monkeypatch.setattr(zygote.ctypes, "CDLL", lambda name, mode=0, rc=rc: Driver(rc))
        assert zygote.cuda_driver_state() == state

    def missing(name, mode=0):
        raise OSError("not mapped under that name")

    monkeypatch.setattr(zygote.ctypes, "CDLL", missing)
    assert zygote.cuda_driver_state() == "initialised"  # cannot tell: the careful answer
    # Only an initialised driver (or no start at all) rules the zygote out, and the reason names the import.
    assert forked.unusable({"ready": True, "cuda_driver": "absent"}) is None
    assert forked.unusable({"ready": True, "cuda_driver": "loaded"}) is None
    why = forked.unusable({"ready": True, "cuda_driver": "initialised", "cuda_driver_by": "some.module"})
    assert "some.module" in why and "new interpreters" in why
    assert "did not start" in forked.unusable({"error": "boom"})


def test_the_zygotes_imports_make_no_call_that_initialises_cuda():
    """What the zygote imports must not run cuInit on a GPU machine (its children could not use CUDA):
    torch.cuda.is_available() does (cudaGetDeviceCount), device_count() asks NVML. The H200 found two of
    tilesmith's own modules calling is_available() at import. Checked here by recording the calls."""
    code = textwrap.dedent("""
        import importlib, json, torch, torch.cuda as tc
        seen = []
        for name in ("is_available", "_lazy_init", "init", "current_device", "get_device_properties",
                     "get_device_capability", "synchronize", "set_device"):
            def spy(*a, _o=getattr(tc, name), _n=name, **k):
                seen.append(_n)
                return _o(*a, **k)
            setattr(tc, name, spy)
        from tilesmith.launch import zygote
        for m in zygote.PRELOAD:
            try:
                importlib.import_module(m)
            except ImportError:
                pass
        print(json.dumps(seen))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_fork_workers_off_starts_a_new_interpreter_and_a_bad_value_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "off")
    assert not forked.wanted("cpu")
    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "auto")
    assert forked.wanted("cpu") and not forked.wanted("cuda:0")  # CUDA: not the default yet
    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "on")
    assert forked.wanted("cuda:0")
    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "sometimes")
    with pytest.raises(TilesmithError) as e:
        forked.wanted("cpu")
    assert e.value.code == "usage"
    p, scratch, _ = _start(tmp_path, "report", fork=False)
    assert isinstance(p, subprocess.Popen) and _report(p, scratch)["fds"] == [0, 1, 2]


def test_what_torch_computes_at_import_is_what_a_new_interpreter_computes(tmp_path):
    """The zygote imported torch under its own TMPDIR: a forked worker must see its own, as a new
    interpreter would (Inductor's precompiled-header folder is computed at import from it)."""
    seen = []
    for fork in (True, False):
        p, scratch, env = _start(tmp_path, "report", fork=fork)
        assert isinstance(p, forked.Forked) == fork
        r = _report(p, scratch)
        assert r["header_dir"].startswith(env["TMPDIR"] + os.sep)
        seen.append(json.loads(json.dumps(r).replace(str(scratch.resolve()), "<scratch>").replace(str(scratch), "<scratch>")))
    for k in ("header_dir", "inductor_config", "threads", "path0", "tmp", "fds", "argv"):
        assert seen[0][k] == seen[1][k], k


def test_threads_that_poll_and_wait_at_once_all_see_one_exit_status(tmp_path):
    """A spare's start-up thread and the pool's closing thread both wait on the same worker."""
    import threading

    for _ in range(4):
        p, scratch, _ = _start(tmp_path, "sleep")
        seen, errors = [], []

        def waiter():
            try:
                while p.poll() is None:
                    try:
                        seen.append(p.wait(timeout=0.01))
                    except subprocess.TimeoutExpired:
                        pass
                seen.append(p.wait(timeout=1))
            except Exception as e:  # noqa: BLE001 - the test's point: nothing is raised
                errors.append(e)

        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        os.killpg(p.pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert not errors and set(seen) == {-signal.SIGKILL}, (errors, seen)


def test_a_program_that_forks_after_tilesmith_started_workers_gets_its_own_zygote(tmp_path):
    """A user's program running tilesmith.compile may fork (data loaders): the child never talks on its
    parent's zygote socket, and the parent's workers still start afterwards."""
    p, scratch, _ = _start(tmp_path, "report")
    _report(p, scratch)
    parents = {id(z) for z in forked._zygotes.values()}
    lifeline = f"pipe:[{os.fstat(forked._LIFE[1]).st_ino}]"  # held only by this process
    assert parents
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a worker of its own, from a zygote of its own
        code = 1
        try:
            os.close(r)
            q, s2, _ = _start(tmp_path, "report")
            ok = isinstance(q, forked.Forked) and _report(q, s2)["fds"] == [0, 1, 2]
            fresh = all(id(z) not in parents for z in forked._zygotes.values())
            held = [n for n in os.listdir("/proc/self/fd") if _link(f"/proc/self/fd/{n}") == lifeline]
            fresh = fresh and not held  # the parent's workers do not live as long as this child
            os.write(w, b"ok" if ok and fresh else b"bad")
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    assert os.waitpid(pid, 0)[1] == 0 and said == b"ok"
    p, scratch, _ = _start(tmp_path, "report")  # the parent's zygote still answers
    assert isinstance(p, forked.Forked) and _report(p, scratch)["fds"] == [0, 1, 2]


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


@pytest.mark.skipif(not NAMESPACES, reason="needs user namespaces")
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_the_sandboxed_command_cannot_unmount_what_hides_the_home_and_temp_folders_or_remount_them_writable(
        tmp_path, fork):
    """The command is root in the sandbox's user namespace: had that namespace owned its mounts, it could
    unmount the file systems that hide the home and temp folders (the deciding process's files, other
    workers' folders, the user's credentials) and remount / read-write."""
    import tempfile

    marker = tmp_path / "marker.txt"  # in the hidden temp folder, outside the command's scratch folder
    marker.write_text("hidden")
    outside = ROOT / f".escape-probe-{os.getpid()}"  # bound back read-only (the project's own code)
    hidden = [os.path.expanduser("~"), tempfile.gettempdir()]
    try:
        p, scratch, _ = _start(tmp_path, "escape", str(marker), str(outside), *hidden, fork=fork)
        assert isinstance(p, forked.Forked) == fork
        got = _report(p, scratch)
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    assert got == {**{"umount " + h: False for h in hidden}, "sees marker": False, "remount /": False,
                   "remount " + str(ROOT): False, "wrote": False}, got


def _beating(scratch: Path, for_s: float = 1.0) -> bool:
    beat = scratch / "beat"
    first = beat.read_text()
    time.sleep(for_s)
    return beat.read_text() != first


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_a_command_that_leaves_its_process_group_still_dies_when_it_is_killed(tmp_path, fork):
    """Candidate code can setsid() and clear its PR_SET_PDEATHSIG: killing the group alone then killed the
    keeper (or the stage) and left the worker running, unwatched, beside the next measurements."""
    p, scratch, _ = _start(tmp_path, "detach", fork=fork)
    assert isinstance(p, forked.Forked) == fork
    deadline = time.monotonic() + 120
    while not (scratch / "beat").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _beating(scratch)
    sandbox.kill(p.pid)  # what Worker.kill and Worker.close do
    p.wait(timeout=30)
    time.sleep(0.5)
    assert not _beating(scratch)


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_a_command_that_leaves_its_process_group_does_not_outlive_the_process_that_started_it(tmp_path, fork):
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from pathlib import Path
        from tilesmith.launch import forked, sandbox
        scratch = Path({str(tmp_path)!r}) / "w"; scratch.mkdir()
        env = {{**sandbox.scrubbed_env(scratch), "PYTHONPATH": {str(ROOT)!r}}}
        p = sandbox.popen([sys.executable, "-m", "tests.fakes.probe", "detach"], sandbox.Spec(scratch=str(scratch)),
                          env, fork={fork}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(type(p).__name__, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout.readline().strip() == ("Forked" if fork else "Popen")
    scratch = tmp_path / "w"
    deadline = time.monotonic() + 120
    while not (scratch / "beat").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _beating(scratch)
    proc.kill()
    proc.wait()
    time.sleep(1.0)
    assert not _beating(scratch)


@pytest.mark.skipif(not NAMESPACES, reason="needs user namespaces")
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_kernel_controls_are_read_only_and_block_devices_absent_even_for_the_real_root(tmp_path, fork):
    """Run by the real root, the sandbox's root is uid 0 outside: file permissions alone would let the
    command open /proc/sys/kernel/core_pattern or a loop device for writing. The probe opens each for
    writing and closes it at once; nothing is ever written."""
    p, scratch, _ = _start(tmp_path, "kernel_controls", fork=fork, devices="basic")  # what a CPU worker gets
    got = _report(p, scratch)
    assert got.pop("sys_read_only") is True
    assert got.pop("block_devices") == [] and got.pop("urandom") == 16  # its own /dev: no loop, zram or disk
    refused = {"EROFS", "EACCES", "EPERM", "ENOENT"}
    assert all(v in refused for v in got.values()), got
    if os.geteuid() == 0:  # where file permissions would have allowed it, the read-only mount refuses
        assert set(got.values()) <= {"EROFS", "ENOENT"} and "EROFS" in got.values(), got


@pytest.mark.skipif(not NAMESPACES, reason="needs user namespaces")
@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new-interpreter"])
def test_a_shared_memory_segment_made_in_the_sandbox_does_not_outlive_it_and_the_host_name_stays(tmp_path, fork):
    """The sandbox has IPC and UTS namespaces of its own: a candidate's System V segment (made at import, to outlive
    the gate) is freed with the namespace, and the machine's host name is out of its reach."""
    key = 0x7153_0000 + os.getpid() % 0xFFFF
    p, scratch, _ = _start(tmp_path, "ipc", str(key), fork=fork, devices="basic")
    got = _report(p, scratch)
    assert got["shmid"] >= 0  # made, inside
    assert got["hostname"] == ("candidate" if got["renamed"] else os.uname().nodename)  # refused where the sandbox nests
    keys = {int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]}
    assert key not in keys  # gone with its namespace
    assert os.uname().nodename != "candidate"
