"""tilesmith.streams on CPU: the screen lets `side_by_side` in (and nothing else from the module), and
without CUDA tensors the chains run one after another with the same results. The overlap, the join and
the memory marking are tested on the GPU (tests/gpu/test_streams_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from tests import gate_helpers as h
from tilesmith.gate.static import screen
from tilesmith.streams import side_by_side


def test_side_by_side_passes_the_static_screen_and_its_internals_do_not(inference_ws):
    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    assert screen(h.with_module_code(text, "from tilesmith.streams import side_by_side")) == []
    for bad in ("from tilesmith.streams import _side_streams", "import tilesmith.streams",
                "from tilesmith.streams import side_by_side, _streams"):
        assert "static-tilesmith" in {f.code for f in screen(h.with_module_code(text, bad))}, bad


def test_side_by_side_runs_cpu_chains_in_order_with_their_results():
    order = []
    x, w = torch.randn(8, 4), torch.randn(4, 4)

    def first(a, b):
        order.append("first")
        return a @ b

    def second(a):
        order.append("second")
        return a.relu(), a.sum()

    out = side_by_side((first, (x, w)), (second, (x,)))
    assert order == ["first", "second"]
    assert torch.equal(out[0], x @ w) and torch.equal(out[1][0], x.relu()) and torch.equal(out[1][1], x.sum())


def test_side_by_side_rejects_arguments_that_are_not_fn_input_pairs():
    with pytest.raises(TypeError):
        side_by_side(lambda: 1)
