"""Shared fixtures: TILESMITH_HOME in a temp folder for every test; captured example workspaces."""

from __future__ import annotations

import os
import sys
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


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory):
    """One Inductor cache for the whole session, so each example compiles once."""
    d = tmp_path_factory.mktemp("inductor-cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    return d


def run_capture_subprocess(script: Path, ws: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """Capture in a fresh interpreter (Dynamo state never leaks between tests)."""
    import subprocess

    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(script), "-w", str(ws), "--force", "--json"]
    if args:
        cmd += ["--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


_CAPTURED: dict = {}  # (script, args) -> its workspace, captured once per test process: files share them


def captured_workspace(tmp_path_factory, name: str, script: Path, *args: str) -> Path:
    """Capture `script` with `args` once per test process (later asks, from any test file, get the same workspace:
    read-only, copy it to change it); fail loudly with the script's stderr."""
    key = (str(script), args)
    if key not in _CAPTURED:
        ws = tmp_path_factory.mktemp(name) / "ws"
        p = run_capture_subprocess(script, ws, *args)
        assert p.returncode == 0, p.stderr
        _CAPTURED[key] = ws
    return _CAPTURED[key]


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
    ws = tmp_path_factory.mktemp("ws-ineligible") / "ws"
    p = run_capture_subprocess(FIXTURES / "ineligible.py", ws, env={"OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    return ws, p.stdout


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
