"""Workers forked from the zygote on the GPU machine (TILESMITH_FORK_WORKERS=on; auto forks only CPU
workers until this file has passed there): a forked worker makes its own CUDA context and graphs, and
the gate decides with forked workers as it does with new interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests.conftest import EXAMPLES, ROOT, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gpu_a_forked_worker_runs_kernels_and_cuda_graphs(tmp_path, monkeypatch):
    from tilesmith.launch import forked, sandbox

    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "on")
    assert forked.wanted("cuda:0")
    env = {**sandbox.scrubbed_env(tmp_path), "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "out.txt", "wb")
    p = sandbox.popen([sys.executable, "-m", "tests.fakes.probe", "cuda"], sandbox.Spec(scratch=str(tmp_path)), env,
                      fork=True, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    assert isinstance(p, forked.Forked), forked._failed
    assert p.wait(timeout=300) == 0, (tmp_path / "out.txt").read_text()
    r = json.loads((tmp_path / "out.txt").read_text().strip().splitlines()[-1])
    assert r["sum"] == 12.0


def test_gpu_the_driver_probe_tells_a_mapped_driver_from_an_initialised_one():
    code = ("import json, torch, triton\n"
            "from tilesmith.launch import zygote\n"
            "before = zygote.cuda_driver_state()\n"
            "torch.cuda.init()\n"
            "print(json.dumps([before, zygote.cuda_driver_state()]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    before, after = json.loads(p.stdout.strip().splitlines()[-1])
    assert before in ("absent", "loaded") and after == "initialised"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_gate_with_forked_workers_accepts_a_real_win_and_not_the_original(mode, tmp_path, monkeypatch,
                                                                                 inductor_cache):
    from tilesmith.launch import forked
    from tilesmith.gate import Policy, judge

    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "on")
    ws = tmp_path / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--mode", mode, "--steps", "3")
    assert p.returncode == 0, p.stderr
    graph = h.graph_of(ws)
    text = (graph / "wrapper.py").read_text()
    (tmp_path / "candidate.py").write_text(text)
    slow = h.slowed_graph_copy(graph, tmp_path / "slow", reps=40)
    v = judge(slow, tmp_path / "candidate.py", Policy(time_budget_s=8.0))
    assert v.accepted, v.reasons
    assert forked._zygotes and not forked._failed, forked._failed  # the workers were forked
    v = judge(graph, tmp_path / "candidate.py", Policy(time_budget_s=8.0))
    assert not v.accepted and v.codes == ["not-faster"], v.reasons


def test_gpu_the_optimize_flow_with_forked_workers_profiles_and_screens(tmp_path):
    """What the gate test above does not cover and the H200 model run of session 11 failed: the optimize
    flow's own workers (the baseline profile and the tuner's screens, started through sandbox.run_json)
    forked for CUDA. That run ended 'exhausted' with no baseline and no candidate; the track now names
    both failures, and this test shows them."""
    import os

    ws = tmp_path / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3")
    assert p.returncode == 0, p.stderr
    env = {**os.environ, "TILESMITH_FORK_WORKERS": "on", "TILESMITH_HOME": str(tmp_path / "home")}
    p = subprocess.run([sys.executable, "-m", "tilesmith_cli.app", "optimize", "-w", str(ws), "--json",
                        "--max-minutes", "3"], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    run = json.loads(p.stdout[p.stdout.index("{"):])
    (track,) = run["tracks"]
    tdir = tmp_path / "home" / "runs" / run["run_id"] / track["key"] / "profiles"
    variants = [json.loads(line) for line in (tdir / "tuner_variants.jsonl").read_text().splitlines()] \
        if (tdir / "tuner_variants.jsonl").exists() else []
    base = tdir / "baseline.json"  # where the profile's seconds went (1.5 minutes were spent before the track began)
    phases = json.loads(base.read_text()).get("phases_s") if base.exists() else None
    assert not track["profile_error"] and track["baseline_ms"], (track, phases)
    # The launch-bound example's replay goes to the gate unscreened (tuner._screen_graphed); whatever the
    # tuner screened ran, and the track judged a candidate. The screen worker forked alone: the test below.
    assert all(v.get("median_ms") for v in variants), (track, variants[:3])
    assert track["candidates"] >= 1, track


def test_gpu_forked_profile_and_screen_workers_run_a_captured_graph(tmp_path, monkeypatch):
    """The two workers of the optimize flow that failed when forked for CUDA on the H200 (session 11),
    called directly, so a failure shows the worker's own last lines (the flow test above shows the track)."""
    from tilesmith.launch import forked
    from tilesmith.errors import TilesmithError
    from tilesmith.profile.baseline import profile_graphs
    from tilesmith.search.measure import screen

    monkeypatch.setenv("TILESMITH_FORK_WORKERS", "on")
    ws = tmp_path / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3")
    assert p.returncode == 0, p.stderr
    graph = h.graph_of(ws)
    (prof,) = profile_graphs([graph], timeout_s=300)
    assert not isinstance(prof, TilesmithError), str(prof)
    assert forked._zygotes and not forked._failed, forked._failed  # it was forked
    text = (graph / "wrapper.py").read_text()
    (r,) = screen(graph, [("original", text)], budget_s=1.0, timeout_s=300)
    assert r.median_ms and not r.error, r.error
