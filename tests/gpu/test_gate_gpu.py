"""The gate on CUDA (run on the GPU machine: `make gpu-test`): Triton wrappers pass the static screen,
the original is not faster than itself in launch and CUDA-graph mode, a real win is accepted in both,
side-stream work is stopped (by the screen, and by the dynamic check when the screen is off), and bf16 accumulation is caught against the float64 reference."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests.conftest import EXAMPLES, ROOT, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _policy(**kw):
    from tilesmith.gate import Policy

    return Policy(**{"time_budget_s": 8.0, **kw})


@pytest.fixture(scope="module", params=["default", "reduce-overhead"])
def cuda_graph(request, tmp_path_factory, inductor_cache) -> tuple[Path, str]:
    ws = tmp_path_factory.mktemp(f"ws-cuda-{request.param}") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--mode", request.param, "--steps", "3")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws), "graph" if request.param == "reduce-overhead" else "launch"


def _judge(graph: Path, text: str, tmp_path: Path, **kw):
    from tilesmith.gate import judge

    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    return judge(graph, cand, _policy(**kw))


def test_gpu_triton_wrappers_pass_the_static_screen(cuda_graph):
    from tilesmith.gate.static import screen

    graph, _ = cuda_graph
    assert screen((graph / "wrapper.py").read_text()) == []


def test_gpu_gate_rejects_the_original_as_not_faster_in_its_production_mode(cuda_graph, tmp_path):
    graph, mode = cuda_graph
    v = _judge(graph, (graph / "wrapper.py").read_text(), tmp_path)
    assert not v.accepted and v.stage == "timing" and v.codes == ["not-faster"], v.reasons
    assert v.first.timing.mode == mode
    assert all(c.ok for c in v.first.correctness)


def test_gpu_gate_accepts_the_original_against_a_copy_slowed_by_redundant_kernels(cuda_graph, tmp_path):
    graph, mode = cuda_graph
    slow = h.slowed_graph_copy(graph, tmp_path / "slow", reps=40)
    v = _judge(slow, (graph / "wrapper.py").read_text(), tmp_path)
    assert v.accepted, v.reasons
    assert v.first.timing.mode == mode and v.first.timing.speedup_low > 1.02
    assert v.confirmation.timing.speedup_low > 1.02


def test_gpu_gate_stops_work_on_a_side_stream(cuda_graph, tmp_path):
    graph, _ = cuda_graph
    text = (graph / "wrapper.py").read_text()
    cheat = text.replace("        args.clear()\n", "        args.clear()\n        _side = torch.cuda.Stream()\n"
                         "        torch.cuda.set_stream(_side)\n", 1)
    v = _judge(graph, cheat, tmp_path)
    assert not v.accepted and v.stage == "static" and "static-streams" in v.codes


@pytest.mark.parametrize("restores", [False, True], ids=["left-switched", "switched-back"])
def test_gpu_gate_dynamic_check_stops_unjoined_side_stream_work_the_screen_missed(cuda_graph, tmp_path, monkeypatch,
                                                                                   restores):
    """The static screen is switched off here, so only the worker's dynamic check can stop the cheat:
    every kernel goes to a new stream behind a ~50 ms spin and is never joined. The worker runs the call
    under its own current stream, synchronises only that one and reads the outputs there: too early.
    A call that leaves the current stream switched is stopped outright (reading on the stream it
    chose would wait for its work: the hole this test found on the H200)."""
    import re

    import tilesmith.gate.static as static

    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call
    graph, _ = cuda_graph
    text = (graph / "wrapper.py").read_text()
    cheat = h._after_clear(text, "_prev = torch.cuda.current_stream()\n_side = torch.cuda.Stream()\n"
                                 "_side.wait_stream(_prev)\ntorch.cuda.set_stream(_side)\ntorch.cuda._sleep(100_000_000)")
    if restores:  # switch back before returning, never join _side
        cheat = re.sub(r"^(        return .*)$", r"        torch.cuda.set_stream(_prev)\n\1", cheat, count=1, flags=re.M)
    assert cheat.count("set_stream(") == 1 + restores
    v = _judge(graph, cheat, tmp_path)
    assert not v.accepted and v.stage == "correctness", v.reasons
    assert v.codes and not any(c.startswith("static") for c in v.codes), v.reasons
    if not restores:
        assert "did not switch it back" in " ".join(r.message for r in v.reasons), v.reasons


def test_gpu_gate_rejects_bf16_accumulation_without_fp32(tmp_path, inductor_cache):
    ws = tmp_path / "ws"
    p = run_capture_subprocess(ROOT / "tests" / "fixtures" / "bf16_matmul.py", ws, "--device", "cuda")
    assert p.returncode == 0, p.stderr
    graph = h.graph_of(ws)
    v = _judge(graph, h.mm_accumulating_in_bfloat16((graph / "wrapper.py").read_text()), tmp_path)
    assert not v.accepted and v.stage == "correctness"
    assert v.reference64 and "precision" in v.codes, v.reasons
