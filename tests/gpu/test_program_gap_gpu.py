"""The program's host time between a graph's calls on CUDA: capture measures it and profiles one gap for GPU
work of the program's own (capture/gaps.py); the gate spends it before each timed call of both roles."""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

EAGER_BETWEEN = """
    import torch
    f = torch.compile(lambda x, w: torch.relu(x @ w) + 1)
    x, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    acc = torch.zeros(64, 64, device="cuda")
    for _ in range(30):
        y = f(x, w)
        acc.add_(y)  # GPU work of the program's own, between the graph's calls
    print(float(acc.sum()))
"""

WAIT_BETWEEN = """
    import torch
    f = torch.compile(lambda x, w: torch.relu(x @ w) + 1)
    x, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    for _ in range(30):
        y = f(x, w)
        torch.cuda.synchronize()  # the program waits for the GPU after each step
"""


@pytest.fixture(scope="module")
def ro_loop(tmp_path_factory, inductor_cache):
    ws = tmp_path_factory.mktemp("ws-ro-gap") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "30", "--mode",
                               "reduce-overhead")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws)


def test_gpu_capture_measures_a_usable_gap_for_a_graph_called_alone_with_no_gpu_work_between(ro_loop):
    gap = json.loads((ro_loop / "graph.json").read_text())["program_gap"]
    assert gap["device"].startswith("cuda") and gap["calls"] == 30 and gap["interleaved"] == 0
    assert len(gap["profiled"]) == 3 and all(o["kernels"] == 0 and o["syncs"] == 0 for o in gap["profiled"]), gap
    assert gap["usable"] is True and gap["host_us"] > 0 and gap["gaps"] >= 8 and gap["threads"] == 1, gap


def _gap_of(tmp_path, body: str) -> dict:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    p = run_capture_subprocess(script, tmp_path / "ws")
    assert p.returncode == 0, p.stderr
    return json.loads((h.graph_of(tmp_path / "ws") / "graph.json").read_text())["program_gap"]


def test_gpu_capture_finds_the_programs_own_gpu_work_between_calls_and_keeps_the_gap_out(tmp_path, inductor_cache):
    gap = _gap_of(tmp_path, EAGER_BETWEEN)
    assert all(o["kernels"] >= 1 for o in gap["profiled"]), gap
    assert gap["usable"] is False and "GPU work of its own" in gap["why"], gap


def test_gpu_capture_finds_the_program_waiting_for_the_gpu_between_calls(tmp_path, inductor_cache):
    gap = _gap_of(tmp_path, WAIT_BETWEEN)
    assert all(o["kernels"] == 0 and o["syncs"] >= 1 for o in gap["profiled"]), gap
    assert gap["usable"] is False and "waits for the GPU" in gap["why"], gap


def test_gpu_gate_spends_the_programs_gap_before_each_timed_call_of_both_roles(ro_loop, tmp_path):
    """Our replay of the reduce-overhead graph against Inductor's trees, timed as the program runs them: the
    verdict says how much host time it spent per call, the graph.json's, and decides on timing."""
    from tilesmith.gate import Policy, judge
    from tilesmith.search.graphed import graphed_text

    meta = json.loads((ro_loop / "graph.json").read_text())
    cand = tmp_path / "graphed.py"
    cand.write_text(graphed_text((ro_loop / "wrapper.py").read_text()))
    v = judge(ro_loop, cand, Policy(time_budget_s=5.0))
    t = v.first.timing
    assert t is not None and t.gap_us == pytest.approx(meta["program_gap"]["host_us"], rel=1e-6), t
    assert t.baseline_ms * 1e3 >= t.gap_us  # the gap is inside each timed call's share
    assert v.accepted or v.codes == ["not-faster"], v.reasons
    off = judge(ro_loop, cand, Policy(time_budget_s=3.0, program_gap=False, confirm=False))
    assert off.first.timing is not None and off.first.timing.gap_us == 0.0
