"""Shared fixtures: TILESMITH_HOME in a temp folder for every test; captured example workspaces."""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures"

# rich fixes a console's width from COLUMNS when the console is made (tilesmith_cli.console, at import), and
# pytest-xdist's workers (make test runs two) start with COLUMNS=80: a test's COLUMNS=200 for one CLI call
# would then not widen the CLI's tables. Without it in the environment, rich reads COLUMNS at each call.
for _k in ("COLUMNS", "LINES"):
    os.environ.pop(_k, None)


@pytest.fixture(autouse=True)
def tilesmith_home(tmp_path, monkeypatch):
    home = tmp_path / "tilesmith-home"
    monkeypatch.setenv("TILESMITH_HOME", str(home))
    return home


def run_folder(tmp_path_factory) -> Path:
    """A folder every test process of this run shares: pytest-xdist gives each worker a basetemp inside one
    folder of the run (popen-gw0, popen-gw1); a run without xdist has its basetemp to itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def run_lock(tmp_path_factory, name: str):
    """An exclusive lock on `name` among this run's test processes (flock: released if a holder dies)."""
    with open(run_folder(tmp_path_factory) / f"{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory):
    """One Inductor cache for the whole run, shared by its test processes, so each example compiles once
    (Inductor locks its own cache entries: concurrent compiles of one kernel build it once)."""
    d = run_folder(tmp_path_factory) / "inductor-cache"
    d.mkdir(exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    return d


def run_capture_subprocess(script: Path, ws: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """Capture in a fresh interpreter (Dynamo state never leaks between tests)."""
    import subprocess

    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(script), "-w", str(ws), "--force", "--json"]
    if args:
        cmd += ["--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


_CAPTURED: dict = {}  # (script, args, env) -> (workspace, capture's stdout), in this test process


def captured_workspace(tmp_path_factory, name: str, script: Path, *args: str) -> Path:
    """Capture `script` with `args` once per run (later asks, from any test file and either test process, get the
    same workspace: read-only, copy it to change it); fail loudly with the script's stderr."""
    return captured(tmp_path_factory, name, script, *args)[0]


def captured(tmp_path_factory, name: str, script: Path, *args: str, env: dict | None = None) -> tuple[Path, str]:
    """captured_workspace's workspace and the capture's stdout, the capture run with `env` added. The first test
    process to ask captures under a lock; the other waits for it and reads the same folder (a failed capture
    leaves no mark, so the next ask captures again and fails with its own stderr). `name` says what the caller
    wants it for; the folder is named by the script and a digest of what was asked, since callers with different
    names ask for the same capture."""
    key = (str(script), args, tuple(sorted((env or {}).items())))
    if key not in _CAPTURED:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        d = run_folder(tmp_path_factory) / "captures" / f"{Path(script).stem}-{digest}"
        d.mkdir(parents=True, exist_ok=True)
        with run_lock(tmp_path_factory, f"capture-{d.name}"):
            if not (d / "stdout.txt").exists():
                p = run_capture_subprocess(script, d / "ws", *args, env=env)
                assert p.returncode == 0, p.stderr
                (d / "stdout.txt").write_text(p.stdout)  # written last: the mark of a finished capture
        _CAPTURED[key] = (d / "ws", (d / "stdout.txt").read_text())
    return _CAPTURED[key]


def finished_captures(tmp_path_factory) -> list[Path]:
    """The workspaces of every capture this run has finished so far, by either test process."""
    return sorted(d / "ws" for d in (run_folder(tmp_path_factory) / "captures").glob("*/") if (d / "stdout.txt").exists())


@pytest.fixture(scope="session")
def training_ws(tmp_path_factory, inductor_cache):
    return captured_workspace(tmp_path_factory, "ws-training", EXAMPLES / "training.py", "--steps", "1")


@pytest.fixture(scope="session")
def inference_ws(tmp_path_factory, inductor_cache):
    return captured_workspace(tmp_path_factory, "ws-inference", EXAMPLES / "inference.py", "--steps", "1")


@pytest.fixture(scope="session")
def slow_matmul_graph(tmp_path_factory, inductor_cache):
    """The one graph of tests/fixtures/slow_matmul.py (scalar loops on purpose): the gate's honest win
    (used by tests/test_gate_candidates.py and tests/test_gate_cli.py)."""
    ws = captured_workspace(tmp_path_factory, "ws-slow-matmul", FIXTURES / "slow_matmul.py")
    (graph,) = sorted((ws / "graphs").iterdir())
    return graph


@pytest.fixture(scope="session")
def two_matmuls_ws(tmp_path_factory, inductor_cache):
    """tests/fixtures/slow_two_matmuls.py: one scalar C++ kernel, the agent tests' graph (agent_helpers.py)."""
    return captured_workspace(tmp_path_factory, "ws-two-matmuls", FIXTURES / "slow_two_matmuls.py")


@pytest.fixture(scope="session")
def ineligible_capture(tmp_path_factory, inductor_cache):
    """tests/fixtures/ineligible.py captured once (two ineligible graphs, one plain), with one OpenMP thread
    (tests/test_report.py optimizes it on a small shared CPU box): the workspace and the capture's stdout.
    Read-only: copy the workspace to change it."""
    return captured(tmp_path_factory, "ws-ineligible", FIXTURES / "ineligible.py", env={"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="session")
def oversub_ws(tmp_path_factory, inductor_cache):
    """examples/oversubscribed.py: Inductor's OpenMP thread count is too high, a win the tuner finds."""
    return captured_workspace(tmp_path_factory, "ws-oversub", EXAMPLES / "oversubscribed.py", "--steps", "1")


def pytest_collection_modifyitems(items):
    """Every capture fixture (and every test that captures) uses `inductor_cache`: those tests are
    `slow`, like the ones marked by hand for starting workers, so `pytest -m "not slow"` is a fast lane."""
    for item in items:
        if "inductor_cache" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
    """With TILESMITH_TEST_STREAM_FAILURES=1 (the GPU calls), a failure's traceback is printed when it
    happens, so a call cut off by its time limit still shows why the earlier tests failed."""
    import os

    if report.failed and os.environ.get("TILESMITH_TEST_STREAM_FAILURES"):
        print(f"\n----- FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n-----", flush=True)
