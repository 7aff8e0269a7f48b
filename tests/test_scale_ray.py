"""`tilesmith optimize --ray` on a real Ray cluster on loopback (a head and two worker nodes started here with
`ray start`), running captured CPU graphs as tasks; a worker node killed mid-track, and the resume.

Opt-in (they take minutes on 2 cores): `make test-ray`, or `pytest -m ray tests/test_scale_ray.py` with
`pip install 'tilesmith[ray]'`. Skipped where Ray is not installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.scale_helpers import merged_workspace, placement, verdicts
from tilesmith import paths, runs
from tilesmith_cli.app import app

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]
runner = CliRunner()
RAY = str(Path(sys.executable).with_name("ray"))


def _ports(n: int) -> list[int]:
    """n distinct free ports (all bound at once: one bound and closed at a time can come back twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    """A head (no CPUs: it runs no task) and worker nodes of one CPU each, every one a `ray start --block`
    process of this test: SIGTERM to it stops every process it started."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="tsray-", dir="/tmp")  # Ray's socket paths must stay short
        self.address = ""  # the head's, once started
        self.head, self.workers = None, []

    def up(self, workers: int) -> "Cluster":
        """Start the head, then each worker node in turn (nodes started at once on one host picked the same
        free port and one's raylet died: every port here is chosen, and each node is up before the next)."""
        self.head = self._start(["--head", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={self.tmp}"], "head")
        self._wait(0)
        for i in range(workers):
            self.workers.append(self._start([f"--address={self.address}", "--num-cpus=1"], f"worker{i}"))
            self._wait(i + 1)
        return self

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        flags = [f"--{x}-port" for x in ("node-manager", "object-manager", "metrics-export", "runtime-env-agent",
                                         "dashboard-agent-listen", "dashboard-agent-grpc")]
        flags += ["--ray-client-server-port", "--port"] if "--head" in args else []
        ports = dict(zip(flags, _ports(len(flags))))
        if "--head" in args:
            self.address = f"127.0.0.1:{ports['--port']}"
        log = open(Path(self.tmp) / f"{name}.log", "wb")
        return subprocess.Popen([RAY, "start", *args, "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                                 "--object-store-memory=200000000", *(f"{k}={v}" for k, v in ports.items())],
                                stdout=log, stderr=subprocess.STDOUT)

    def _wait(self, cpus: int, timeout_s: float = 180) -> None:
        """Until the cluster answers with `cpus` CPUs (asked from a child process: this one connects per run;
        a head not listening yet is asked again)."""
        code = (f"import ray, time; ray.init(address={self.address!r}, logging_level='ERROR')\n"
                f"while ray.cluster_resources().get('CPU', 0) < {cpus}: time.sleep(0.5)")
        deadline, why = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            try:
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
                if p.returncode == 0:
                    return
                why = p.stderr[-1500:]
            except subprocess.TimeoutExpired:
                why = "no answer in 60 s"
            time.sleep(2)
        pytest.fail(f"the Ray cluster did not reach {cpus} CPUs: {why}")

    def raylet_of(self, ray_worker_pid: int) -> int:
        """The raylet that started a task's Ray worker process: a child of one of this cluster's nodes."""
        raylet = int(Path(f"/proc/{ray_worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        parent = int(Path(f"/proc/{raylet}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert parent in [w.pid for w in self.workers], "not a raylet of this test's worker nodes"
        return raylet

    def stop(self) -> None:
        started = [p for p in [*self.workers, self.head] if p is not None]
        for p in started:
            p.send_signal(signal.SIGTERM)
        for p in started:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_ray_token(monkeypatch):
    """Ray (2.5x) turns token authentication on for a new local instance and writes the token into ~/.ray, which
    every later `ray start` on the machine then requires: these tests' clusters are loopback ones, without."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def cluster():
    c = Cluster()
    try:
        yield c.up(workers=2)
    finally:
        c.stop()


@pytest.fixture(scope="module")
def two_graphs_ws(tmp_path_factory, two_matmuls_ws, oversub_ws):
    return merged_workspace(tmp_path_factory.mktemp("two-graphs-ray") / "ws", two_matmuls_ws, oversub_ws)


def _kill_first_node_with_a_profiled_track(c: Cluster, killed: dict, done: threading.Event) -> None:
    """Watch the run folder; once a track's baseline profile is back from its node, kill that node's raylet."""
    while not done.is_set() and not killed:
        for f in paths.runs_dir().glob("*/*/placement.json") if paths.runs_dir().is_dir() else []:
            where = json.loads(f.read_text())
            if where.get("ray_pid") and (f.parent / "profiles" / "baseline.json").exists():
                raylet = c.raylet_of(where["ray_pid"])
                os.kill(raylet, signal.SIGKILL)
                killed.update(key=f.parent.name, node=where["node_id"], raylet=raylet)
                return
        time.sleep(0.2)


def test_a_ray_cluster_runs_each_graph_as_a_task_a_dead_node_loses_only_its_track_and_resume_reruns_it(
        cluster, two_graphs_ws):
    killed, done = {}, threading.Event()
    watcher = threading.Thread(target=_kill_first_node_with_a_profiled_track, args=(cluster, killed, done))
    watcher.start()
    try:
        r = runner.invoke(app, ["optimize", "-w", str(two_graphs_ws), "--optimizer", "tuner", "--ray",
                                cluster.address, "--max-minutes", "8"])
    finally:
        done.set()
        watcher.join()
    (rid,) = [p.name for p in paths.runs_dir().iterdir()]
    assert killed, r.output
    assert r.exit_code == 1, r.output
    lost_key = killed["key"]
    (other,) = [k for k in runs.load_run(rid)["graphs"] if k != lost_key]
    rows = runs.load_run(rid)["graphs"]
    assert rows[lost_key]["status"] == "lost" and "Ray task died on node" in rows[lost_key]["reason"], rows[lost_key]
    assert rows[other]["status"] in ("done", "exhausted"), rows[other]
    assert placement(rid, other)["node_id"] != killed["node"]
    assert "1 graph(s) lost: their track's process or node died" in r.stderr
    assert f"`tilesmith optimize --resume {rid}` runs exactly the unfinished graphs again" in r.stderr
    before = (placement(rid, other), verdicts(rid, other))

    # the resume goes back to the run's cluster (one worker node left) with the lost graph only
    again = runner.invoke(app, ["optimize", "--resume", rid, "--json"])
    assert again.exit_code == 0, again.output
    out = {t["key"]: t for t in json.loads(again.stdout)["tracks"]}
    assert json.loads(again.stdout)["status"] == "complete"
    assert out[lost_key]["status"] in ("done", "exhausted") and out[other] == rows[other]
    assert (placement(rid, other), verdicts(rid, other)) == before  # finished on its node: not run again
    assert placement(rid, lost_key)["node_id"] == placement(rid, other)["node_id"]  # the node left
    assert runner.invoke(app, ["report", rid]).exit_code == 0
    assert not ray.is_initialized()  # the run's driver left the cluster


def test_ray_local_starts_a_ray_instance_for_the_run_and_stops_it_at_the_end(oversub_ws, tilesmith_home):
    r = runner.invoke(app, ["optimize", "-w", str(oversub_ws), "--optimizer", "tuner", "--ray", "local", "--json"])
    assert r.exit_code == 0, r.output
    (t,) = json.loads(r.stdout)["tracks"]
    rid = json.loads(r.stdout)["run_id"]
    assert t["status"] in ("done", "exhausted") and t["baseline_ms"], t
    assert placement(rid, t["key"])["where"].startswith("ray node ")
    assert not ray.is_initialized()
    if t["status"] == "done":  # an accepted win installs from the run as from any other
        assert runner.invoke(app, ["install", rid]).exit_code == 0
