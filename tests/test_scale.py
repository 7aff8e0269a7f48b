"""Many graphs, many GPUs (tilesmith/scale) on CPU: lanes pinned to fake GPU lists, the order and the
schedule of tracks, what a Ray task asks for, and real tracks in pinned processes of their own, one killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.scale_helpers import merged_workspace, placement, verdicts
from tilesmith import optimize as opt
from tilesmith import runs
from tilesmith.errors import TilesmithError
from tilesmith.scale import Lane, plan
from tilesmith.workspace import GraphInfo
from tilesmith_cli.app import app

runner = CliRunner()
TINY_GATE = dict(gate_time_budget_s=2.0)  # these tests are about where tracks run, not about the gate's power


def test_a_lane_pins_the_gpu_it_names_as_this_process_sees_it():
    lanes = plan.gpu_lanes(None, ["0", "1", "2"], None)
    assert [(x.name, x.env) for x in lanes] == [("gpu 0", {"CUDA_VISIBLE_DEVICES": "0"}),
                                                ("gpu 1", {"CUDA_VISIBLE_DEVICES": "1"}),
                                                ("gpu 2", {"CUDA_VISIBLE_DEVICES": "2"})]
    # this process already sees only physical GPUs 4 and 6: its GPU 1 is physical 6, the lane's device 0
    assert plan.gpu_lanes(["1"], ["0", "1"], "4,6") == [Lane("gpu 1", {"CUDA_VISIBLE_DEVICES": "6"})]
    uuids = "GPU-aaaa,GPU-bbbb"
    assert plan.gpu_lanes(["1", "0"], ["0", "1"], uuids)[0].env == {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}
    with pytest.raises(TilesmithError, match="GPU 3 is not visible here") as e:
        plan.gpu_lanes(["0", "3"], ["0", "1"], None)
    assert e.value.code == "usage"
    assert plan.gpu_lanes(None, [], None) == []  # no GPU: no lane, every track runs in the run's process


def test_gpus_option_takes_indices_separated_by_commas():
    assert plan.parse_gpus("0, 2,2,3") == ["0", "2", "3"]
    assert plan.parse_gpus(None) is None and plan.parse_gpus("") is None
    for bad in ("a", "0;1", "-1"):
        with pytest.raises(TilesmithError, match="give GPU indices"):
            plan.parse_gpus(bad)


def test_every_worker_a_pinned_track_process_starts_sees_only_its_gpu(tmp_path):
    """The lane's CUDA_VISIBLE_DEVICES is in the track process's environment from its start: the one launcher
    (sandbox: screening, profile, replay) and the gate's workers build their environments from it."""
    code = (
        "import json, sys\nfrom pathlib import Path\nfrom tilesmith.launch import sandbox\n"
        "from tilesmith.gate.proc import worker_env\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        "probe = [sys.executable, '-c', 'import os, json; print(json.dumps({\"cvd\": os.environ.get(\"CUDA_VISIBLE_DEVICES\")}))']\n"
        "res = sandbox.run_json(probe, sandbox.Spec(scratch=str(tmp)), 120)\n"
        "print(json.dumps({'sandboxed': res.reply, 'gate': worker_env(tmp / 'w', 'cuda:0').get('CUDA_VISIBLE_DEVICES')}))\n")
    (lane,) = plan.gpu_lanes(["1"], ["0", "1"], "3,5")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **lane.env})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == {"sandboxed": {"cvd": "5"}, "gate": "5"}


def test_a_free_lane_takes_the_next_graph_in_order_and_runs_one_at_a_time():
    seconds = {"a": 0.9, "b": 0.3, "c": 0.3, "d": 0.3}
    ran, lock = [], threading.Lock()

    def run_one(item, lane):
        t0 = time.monotonic()
        time.sleep(seconds[item])
        with lock:
            ran.append((item, lane.name, t0, time.monotonic()))

    plan.schedule(list(seconds), [Lane("gpu 0"), Lane("gpu 1")], run_one, lambda: False)
    by = {item: (lane, t0, t1) for item, lane, t0, t1 in ran}
    assert sorted(by) == ["a", "b", "c", "d"]
    assert sorted(by, key=lambda i: by[i][1]) == ["a", "b", "c", "d"]  # started in the given order
    # a holds its lane; the other lane, freed by b, takes c and then d
    assert by["b"][0] == by["c"][0] == by["d"][0] != by["a"][0]
    for lane in ("gpu 0", "gpu 1"):
        spans = sorted((t0, t1) for _, name, t0, t1 in ran if name == lane)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # never two at once
    assert by["d"][2] < by["a"][2] + 0.3  # all four done in about a's time, not the sum


def test_no_graph_starts_on_any_lane_once_the_run_is_stopped():
    started, stop = [], threading.Event()

    def run_one(item, lane):
        started.append(item)
        stop.set()  # e.g. --max-minutes spent while the first track ran

    plan.schedule(["a", "b", "c"], [Lane("gpu 0")], run_one, stop.is_set)
    assert started == ["a"]


def _graph(tmp_path: Path, key: str, kernels: int, wrapper_bytes: int, seen: int = 1) -> GraphInfo:
    d = tmp_path / "graphs" / key
    d.mkdir(parents=True)
    (d / "wrapper.py").write_text("#" * wrapper_bytes)
    return GraphInfo(key=key, kind="inference", device="cuda:0", compile_mode="plain",
                     kernels={"triton": kernels, "cpp": 0, "template": 0, "extern": 0}, eligible=True, seen=seen)


def test_tracks_go_longest_expected_work_first_profile_headroom_else_graph_size(tmp_path):
    gs = [_graph(tmp_path, "small", 2, 100), _graph(tmp_path, "many-kernels", 9, 50),
          _graph(tmp_path, "same-kernels-longer", 9, 900)]
    where = lambda key: tmp_path / "graphs" / key  # noqa: E731
    track = lambda key: tmp_path / "run" / key  # noqa: E731
    # no profile yet (a fresh run): kernel count, then the wrapper's size
    assert [g.key for g in plan.order(gs, where, track)] == ["same-kernels-longer", "many-kernels", "small"]
    # a resumed run has baseline profiles: headroom x calls per step first, whatever the size
    for key, headroom, wall in (("small", 3.0, 5.0), ("many-kernels", 0.0, 0.5)):
        (track(key) / "profiles").mkdir(parents=True)
        (track(key) / "profiles" / "baseline.json").write_text(json.dumps({"headroom_ms": headroom, "wall_ms": wall}))
    assert [g.key for g in plan.order(gs, where, track)] == ["small", "many-kernels", "same-kernels-longer"]
    gs[1].seen = 10  # called 10 times per step: 10 x 0.5 ms of wall time (no roofline headroom) beats 3 ms
    assert [g.key for g in plan.order(gs, where, track)][0] == "many-kernels"


def test_a_ray_task_asks_for_a_gpu_of_the_capture_type_or_for_cpus_and_says_why_no_node_fits(tmp_path):
    pytest.importorskip("ray")
    from tilesmith.scale.ray_run import resources

    g = _graph(tmp_path, "k", 1, 10)
    (tmp_path / "graphs" / "k" / "graph.json").write_text(json.dumps({"environment": {"gpu": "NVIDIA H100 80GB HBM3"}}))
    h100 = {"CPU": 32.0, "GPU": 8.0, "accelerator_type:H100": 1.0}
    opts, why = resources(g, tmp_path / "graphs" / "k", 1.0, [{"CPU": 4.0}, h100])
    assert opts == {"num_gpus": 1, "num_cpus": 1, "accelerator_type": "H100"} and why == ""
    _, why = resources(g, tmp_path / "graphs" / "k", 1.0, [{"CPU": 4.0}, {"CPU": 8.0, "GPU": 8.0, "accelerator_type:A100": 1.0}])
    assert why == "not started: no node of the Ray cluster has a free H100 GPU (the graph was captured on NVIDIA H100 80GB HBM3)"
    g.device = "cpu"
    opts, why = resources(g, tmp_path / "graphs" / "k", 4.0, [{"CPU": 2.0}, h100])
    assert opts == {"num_cpus": 4.0, "num_gpus": 0} and why == ""
    assert "has 4 CPU(s)" in resources(g, tmp_path / "graphs" / "k", 4.0, [{"CPU": 2.0}])[1]


def test_ray_without_ray_installed_is_an_error_that_says_what_to_install_and_starts_no_run(tmp_path, tilesmith_home):
    cli = "import sys; sys.modules['ray'] = None; from tilesmith_cli.app import main; sys.argv[0] = 'tilesmith'; main()"
    p = subprocess.run([sys.executable, "-c", cli, "optimize", "-w", str(tmp_path), "--ray", "local"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 1, p.stderr
    assert "error: --ray needs Ray, which is not installed here" in p.stderr
    assert "hint: pip install 'tilesmith[ray]'" in p.stderr
    assert not (tilesmith_home / "runs").exists()


@pytest.mark.parametrize("args, said", [(["--gpus", "0", "--ray", "local"], "--gpus and --ray do not go together"),
                                        (["--gpus", "0;1"], "give GPU indices separated by commas")])
def test_placement_options_that_cannot_work_are_errors_before_any_run(tmp_path, tilesmith_home, args, said):
    r = runner.invoke(app, ["optimize", "-w", str(tmp_path), *args])
    assert r.exit_code == 1 and said in r.stderr, r.output
    assert not (tilesmith_home / "runs").exists()


@pytest.fixture(scope="module")
def two_graphs_ws(tmp_path_factory, two_matmuls_ws, oversub_ws):
    return merged_workspace(tmp_path_factory.mktemp("two-graphs") / "ws", two_matmuls_ws, oversub_ws)


FAKE_GPUS = [Lane("gpu 0", {"CUDA_VISIBLE_DEVICES": "0"}), Lane("gpu 1", {"CUDA_VISIBLE_DEVICES": "1"})]


def test_tracks_on_fake_gpus_run_in_pinned_processes_a_killed_one_is_lost_and_resume_reruns_only_it(two_graphs_ws):
    """Two CPU graphs on two fake GPUs: each track in a process of its own with its lane's
    CUDA_VISIBLE_DEVICES; the first to have its baseline profile back is killed (SIGKILL). It is lost, the other
    finishes; --resume runs the lost one only, on its kept profile, and the run reads as one run."""
    rid, killed = {}, {}

    def on_event(kind, **kw):
        if kind == "run":
            rid["id"] = kw["run_id"]
        elif kind == "track" and kw["track"].status == "running" and not killed:  # its profile is back
            killed[kw["key"]] = placement(rid["id"], kw["key"])["pid"]
            os.kill(killed[kw["key"]], signal.SIGKILL)

    r = opt.optimize(two_graphs_ws, opt.OptimizeSettings(optimizer="tuner", **TINY_GATE), on_event=on_event,
                     lanes=FAKE_GPUS)
    ((lost_key, pid),) = killed.items()
    by = {t.key: t for t in r.tracks}
    (other,) = [k for k in by if k != lost_key]
    assert r.status == "interrupted" and r.lost() == [by[lost_key]] and r.failed() == []
    assert "killed by SIGKILL" in by[lost_key].reason and f"--resume {r.run_id}" in by[lost_key].reason
    assert by[other].status in ("done", "exhausted"), by[other]
    pinned = {placement(r.run_id, k)["where"]: placement(r.run_id, k)["env"] for k in by}
    assert pinned == {"gpu 0": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu 1": {"CUDA_VISIBLE_DEVICES": "1"}}
    assert (runs.track_dir(r.run_id, lost_key) / "profiles" / "baseline.json").exists()  # came back before the kill
    before = (placement(r.run_id, other), verdicts(r.run_id, other))

    again = opt.optimize(resume=r.run_id, lanes=FAKE_GPUS)
    by = {t.key: t for t in again.tracks}
    assert again.status == "complete" and by[lost_key].status in ("done", "exhausted"), by[lost_key]
    assert (placement(r.run_id, other), verdicts(r.run_id, other)) == before  # finished: not run again
    assert placement(r.run_id, lost_key)["pid"] != pid and verdicts(r.run_id, lost_key)
    assert json.loads((runs.track_dir(r.run_id, lost_key) / "profiles" / "baseline.json").read_text())["phases_s"]
    for key in by:  # an accepted source names the run's own graph folder, as install reads it
        best = runs.track_dir(r.run_id, key) / "best.json"
        if best.exists():
            assert json.loads(best.read_text())["graph_dir"] == str(two_graphs_ws / "graphs" / key)
    rep = runner.invoke(app, ["report", r.run_id, "--json"])
    assert rep.exit_code == 0, rep.output
    assert runs.load_run(r.run_id)["status"] == "complete"
