"""tilesmith.compile on CUDA (run on the GPU machine: `make gpu-test`): the same fixture as
tests/test_compile.py on the GPU. Whether the tuner finds a Triton win for this model is a property of
the chip, not of the API, so a win is not asserted; what is asserted holds either way: the callable's
outputs and gradients are right, every graph has a track that ended with a status, wins (if any) are
swapped in, and a second compile of the same model is an exact hit whenever the first installed one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.test_compile import drive  # noqa: E402
from tilesmith import runs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ENDED = {"done", "exhausted", "cached", "interrupted"}


def test_gpu_compile_inference_is_right_every_graph_gets_a_track_and_a_second_compile_reuses_wins():
    first = drive("inference", "cuda")
    assert first["max_error"] < 1e-5 and first["run_id"]
    tracks = runs.load_run(first["run_id"]).graphs
    assert tracks and all(t["status"] in ENDED for t in tracks.values()), tracks
    won = sorted(k for k, t in tracks.items() if t["loops_done"] >= 1)
    assert sorted(first["swapped"]) == won
    second = drive("inference", "cuda")
    assert second["max_error"] < 1e-5
    again = runs.load_run(second["run_id"]).graphs
    for k in won:  # an installed win is an exact hit: no optimizer, swapped in again
        assert again[k]["status"] == "cached" and again[k]["candidates"] == 0
    assert sorted(second["swapped"]) == won
    print(f"gpu compile: tracks {[(k[:12], t['status'], t.get('speedup')) for k, t in tracks.items()]}")


def test_gpu_compile_training_step_optimizes_forward_and_backward_and_gradients_stay_right():
    r = drive("training", "cuda")
    assert r["max_error"] < 1e-5
    kinds = sorted(g["kind"] for rid in r["runs"] for g in runs.load_run(rid).graphs.values())
    assert kinds == ["backward", "forward"]
    assert all(s in ENDED for s in r["statuses"])


def test_gpu_compile_background_mode_keeps_outputs_right_while_the_gate_works():
    r = drive("background", "cuda")
    assert r["max_error"] < 1e-5 and r["calls_while_optimizing"] >= 1 and r["run_id"]
