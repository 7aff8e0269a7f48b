"""Capture, replay and the tuner on CUDA (Triton kernels): run on the GPU machine with `make gpu-test`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402
from tilesmith import workspace as wsmod  # noqa: E402
from tilesmith.capture.rerun import rerun  # noqa: E402
from tilesmith.search import kernels as K  # noqa: E402
from tilesmith.search.measure import screen  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def cuda_training(tmp_path_factory, inductor_cache):
    ws = tmp_path_factory.mktemp("gpu-train") / "ws"
    p = run_capture_subprocess(EXAMPLES / "training.py", ws, "--device", "cuda", "--steps", "1")
    assert p.returncode == 0, p.stderr
    return ws


@pytest.fixture(scope="module")
def cuda_reduce_overhead(tmp_path_factory, inductor_cache):
    ws = tmp_path_factory.mktemp("gpu-ro") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--mode", "reduce-overhead",
                               "--steps", "3")
    assert p.returncode == 0, p.stderr
    return ws


def test_gpu_training_capture_has_triton_forward_and_backward_graphs_that_replay(cuda_training):
    ws = wsmod.load(cuda_training)
    assert sorted(g.kind for g in ws.graphs) == ["backward", "backward", "forward", "forward"]
    assert ws.environment["gpu"] and ws.environment["triton"]
    for g in ws.graphs:
        assert g.eligible and g.data_stored and g.device == "cuda:0", g
        assert g.kernels["triton"] + g.kernels["extern"] >= 1
        r = rerun(ws.graph_dir(g.key), atol=1e-4)
        assert r.ok, r.problems


def test_gpu_reduce_overhead_graph_is_recorded_as_cuda_graphs_and_replays(cuda_reduce_overhead):
    (g,) = wsmod.load(cuda_reduce_overhead).graphs
    assert g.compile_mode == "cudagraphs" and g.eligible and g.kind == "inference"
    assert rerun(wsmod.graph_dir(cuda_reduce_overhead, g.key), atol=1e-4).ok


def test_gpu_capture_twice_gives_the_same_keys(tmp_path, cuda_training):
    ws = tmp_path / "again"
    assert run_capture_subprocess(EXAMPLES / "training.py", ws, "--device", "cuda", "--steps", "1").returncode == 0
    assert sorted(g.key for g in wsmod.load(ws).graphs) == sorted(g.key for g in wsmod.load(cuda_training).graphs)


def test_gpu_triton_variants_of_real_kernels_compile_run_and_get_timed(cuda_reduce_overhead):
    (g,) = wsmod.load(cuda_reduce_overhead).graphs
    gdir = wsmod.graph_dir(cuda_reduce_overhead, g.key)
    text = (gdir / "wrapper.py").read_text()
    from tilesmith.source import HEADER_END

    header, src = text.split(HEADER_END + "\n", 1)
    header += HEADER_END + "\n"
    tunable = [k for k in K.find_kernels(src) if k.kind == "triton" and K.triton_variants(k)]
    assert tunable, [(k.name, k.params) for k in K.find_kernels(src)]
    k = tunable[0]
    vs = K.triton_variants(k)[:4]
    results = screen(gdir, [("current", text)] + [(lab, header + K.replace_kernel(src, k, code)) for lab, code in vs],
                     budget_s=2.0)
    assert all(r.error == "" and r.median_ms and r.median_ms > 0 for r in results), [(r.label, r.error) for r in results]


def test_gpu_tuner_runs_a_whole_track_and_every_verdict_is_recorded(cuda_reduce_overhead):
    import json

    from tilesmith import optimize as opt
    from tilesmith import runs

    r = opt.optimize(cuda_reduce_overhead, opt.OptimizeSettings(optimizer="tuner", gate_time_budget_s=5.0, max_minutes=2))
    (t,) = r.tracks
    assert t.status in ("done", "exhausted", "interrupted") and t.status != "failed", t
    verdicts = sorted((runs.track_dir(r.run_id, t.key) / "profiles").glob("verdict_*.json"))
    assert len(verdicts) == t.candidates
    for f in verdicts:
        v = json.loads(f.read_text())
        assert v["stage"] in ("static", "load", "correctness", "timing", "confirmation")
        if v["accepted"]:
            assert v["confirmation"]["timing"]["mode"] == "graph"
