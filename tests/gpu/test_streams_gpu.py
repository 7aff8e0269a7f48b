"""tilesmith.streams on CUDA: side chains run on a stream other than the caller's, the caller's stream
waits for them (results read right after are complete), inputs freed early by the caller are not
reused while a side chain reads them, and the fork/join is captured correctly into a CUDA graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilesmith.streams import side_by_side  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _slow_chain(x, w, reps=60):
    """Many dependent matmuls: long enough that a missing join would be read before it finishes."""
    y = x
    for _ in range(reps):
        y = torch.tanh(y @ w)
    return y


def test_side_chain_runs_on_its_own_stream_and_the_caller_waits_for_it():
    torch.manual_seed(0)
    x, w = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda") / 20
    seen = {}

    def side(a, b):
        seen["side"] = torch.cuda.current_stream().cuda_stream
        return _slow_chain(a, b)

    caller = torch.cuda.current_stream().cuda_stream
    main, out = side_by_side((lambda a: a * 2, (x,)), (side, (x, w)))
    total = out.sum()  # queued on the caller's stream right after the join
    assert seen["side"] != caller and torch.cuda.current_stream().cuda_stream == caller
    assert torch.equal(main, x * 2)
    assert torch.allclose(total, _slow_chain(x, w).sum(), rtol=1e-4, atol=1e-4)


def test_an_input_the_caller_frees_early_is_not_reused_while_a_side_chain_reads_it():
    torch.manual_seed(1)
    w = torch.randn(1024, 1024, device="cuda") / 30
    for _ in range(5):
        x = torch.randn(1024, 1024, device="cuda")
        expect = _slow_chain(x, w, 30)
        holder = [x.clone()]
        del x

        def main():
            holder.clear()  # the caller's last reference goes while the side chain still runs
            junk = [torch.full((1024, 1024), 7.0, device="cuda") for _ in range(8)]  # reuse pressure
            return sum(j.sum() for j in junk)

        inp = holder[0]
        _, got = side_by_side((main, ()), (lambda a, b: _slow_chain(a, b, 30), (inp, w)))
        del inp
        assert torch.allclose(got, expect, rtol=1e-4, atol=1e-5)  # a reused input reads as 7.0s


def test_side_by_side_is_captured_into_a_cuda_graph_with_the_fork_and_join():
    torch.manual_seed(2)
    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda") / 16

    def step(a):
        r, s = side_by_side((lambda t: t.relu() + 1, (a,)), (lambda t, v: _slow_chain(t, v, 20), (a, w)))
        return r + s

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(x)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(x)
    for seed in range(3):
        x.copy_(torch.randn(256, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        assert torch.allclose(out, x.relu() + 1 + _slow_chain(x, w, 20), rtol=1e-4, atol=1e-5)
