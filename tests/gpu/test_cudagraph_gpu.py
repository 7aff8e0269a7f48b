"""tilesmith.cudagraph on CUDA: a real Inductor wrapper replayed from a CUDA graph gives the plain
call's outputs on new inputs, never hands out its own buffers, keeps to the caller's stream, steps
aside inside the caller's own capture, and the gate accepts it as faster for a launch-bound graph."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def launch_graph(tmp_path_factory, inductor_cache) -> Path:
    ws = tmp_path_factory.mktemp("ws-graphed") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws)


def _modules(graph: Path):
    from tilesmith import loading
    from tilesmith.search.tuner import graphed_text

    data = loading.load_graph_data(graph)
    text = (graph / "wrapper.py").read_text()
    return data, loading.load_module(text, data.constants), loading.load_module(graphed_text(text), data.constants)


def _fresh(inputs, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(x.shape, generator=g, device=x.device).to(x.dtype).as_strided(x.shape, x.stride())
            if isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.is_contiguous() else
            (x.clone() if isinstance(x, torch.Tensor) else x) for x in inputs]


def test_gpu_graphed_replays_give_the_plain_outputs_and_fresh_buffers(launch_graph):
    from tilesmith import loading

    data, plain, wrapped = _modules(launch_graph)
    kept = []
    for seed in range(4):
        inputs = _fresh(data.inputs, seed) if seed else data.inputs
        got = wrapped.call(loading.clone_args(inputs))
        want = plain.call(loading.clone_args(inputs))
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        kept.append(([a.clone() for a in got], got))
    for copies, outs in kept:  # later calls did not write into what earlier calls returned
        assert all(torch.equal(c, o) for c, o in zip(copies, outs))
    assert wrapped.call.replays == 4 and wrapped.call.plain_calls == 0, wrapped.call.plain_reasons()
    ptrs = {o.untyped_storage().data_ptr() for _, outs in kept for o in outs}
    assert len(ptrs) >= 4  # every call returned new memory


def test_gpu_graphed_keeps_to_the_callers_stream(launch_graph):
    from tilesmith import loading

    data, plain, wrapped = _modules(launch_graph)
    wrapped.call(loading.clone_args(data.inputs))  # capture on the default stream
    want = plain.call(loading.clone_args(data.inputs))
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        args = loading.clone_args(data.inputs)
        torch.cuda._sleep(50_000_000)  # the copy-in must wait behind this, on s
        got = wrapped.call(args)
        s.synchronize()  # only s: anything left on another stream would not be finished
        res = [g.cpu() for g in got]
    for a, b in zip(res, want):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-5)


def test_gpu_graphed_steps_aside_inside_the_callers_own_capture(launch_graph):
    from tilesmith import loading

    data, plain, wrapped = _modules(launch_graph)
    static = loading.clone_args(data.inputs)
    plain.call(loading.clone_args(data.inputs))  # warm
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = wrapped.call(list(static))
    g.replay()
    torch.cuda.synchronize()
    want = plain.call(loading.clone_args(data.inputs))
    for a, b in zip(outs, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert wrapped.call.plain_calls == 1 and wrapped.call.replays == 0
    wrapped.call(loading.clone_args(data.inputs))  # outside the capture: its own graph, nothing remembered
    assert wrapped.call.replays == 1 and wrapped.call.plain_reasons() == []


def test_gpu_gate_accepts_the_graphed_wrapper_of_a_launch_bound_graph(launch_graph, tmp_path):
    from tilesmith.gate import Policy, judge
    from tilesmith.search.tuner import graphed_text

    cand = tmp_path / "graphed.py"
    cand.write_text(graphed_text((launch_graph / "wrapper.py").read_text()))
    v = judge(launch_graph, cand, Policy(time_budget_s=8.0))
    assert v.accepted, v.reasons
    assert v.first.timing.mode == "launch" and v.first.timing.speedup_low > 1.02
    assert all(c.ok for c in v.first.correctness) and v.confirmation.timing.speedup_low > 1.02
