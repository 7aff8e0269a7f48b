"""`tilesmith validate` through the real typer app: exit codes 0 accepted / 1 rejected / 2 usage, JSON."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests import gate_helpers as h
from tilesmith.gate import Verdict
from tilesmith_cli.app import app


@pytest.fixture(autouse=True)
def one_thread_workers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _run(*args: str):
    return CliRunner().invoke(app, ["validate", *map(str, args)])


def test_validate_exits_1_with_a_json_verdict_for_a_cheat(inference_ws, tmp_path):
    g = h.graph_of(inference_ws)
    cand = tmp_path / "cheat.py"
    cand.write_text(h.with_module_code((g / "wrapper.py").read_text(), "import threading"))
    r = _run(g, cand, "--json")
    assert r.exit_code == 1, r.output
    v = Verdict.from_dict(json.loads(r.stdout))
    assert not v.accepted and v.stage == "static" and v.codes == ["static-threads"]
    assert v.graph_key == g.name


def test_validate_prints_the_stage_and_reasons_when_rejected(inference_ws, tmp_path):
    g = h.graph_of(inference_ws)
    cand = tmp_path / "cheat.py"
    cand.write_text(h.with_module_code((g / "wrapper.py").read_text(), "_k = os.environ['OPENAI_API_KEY']"))
    r = _run(g, cand)
    assert r.exit_code == 1
    assert "REJECTED at static" in r.stdout and "static-environment" in r.stdout


def test_validate_exits_2_on_usage_errors(inference_ws, tmp_path):
    g = h.graph_of(inference_ws)
    assert _run(g, tmp_path / "missing.py").exit_code == 2
    assert _run(g, g / "wrapper.py", "--mode", "fast").exit_code == 2
    r = _run(g, g / "wrapper.py", "--mode", "graph")  # a CPU graph has no CUDA graph to replay
    assert r.exit_code == 2 and "graph mode needs a CUDA graph" in r.stderr
    r = _run(tmp_path, g / "wrapper.py", "--json")  # a folder that is not a captured graph
    assert r.exit_code == 2 and json.loads(r.stdout)["code"] == "no-graph"


def test_validate_exits_0_and_shows_timing_when_the_candidate_is_faster(slow_matmul_graph, tmp_path):
    cand = tmp_path / "fast.py"
    cand.write_text(h.mm_instead_of_loops((slow_matmul_graph / "wrapper.py").read_text()))
    r = _run(slow_matmul_graph, cand, "--min-improvement", "0.05")
    assert r.exit_code == 0, r.output
    assert "ACCEPTED" in r.stdout and "timing" in r.stdout and "confirmation" in r.stdout
    assert "idle CPU" in r.stdout  # the candidate's worker, watched while the original was timed apart
    assert "sandbox: namespaces" in r.stdout  # the machines this runs on have user namespaces
