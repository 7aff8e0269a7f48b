"""Each graph rewrite's precondition and result on small aten graphs traced as the re-lowering worker traces a
repro (make_fx, real tensors): the cases a captured graph of the tests does not show (biases, weights not stored
transposed, dependent GEMMs, convolutions that are not patch embeddings, a remainder past the last patch), each
compared with the original graph's outputs."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tilesmith.search import rewrites
from tilesmith.search.rewrites import merge_linears, patchify_conv

aten = torch.ops.aten


def _traced(f, *args):
    with torch.no_grad():
        return make_fx(f, tracing_mode="real")(*args)


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _rewritten_matches(name: str, f, *args):
    gm = _traced(f, *args)
    new = rewrites.apply(name, gm, args)
    want, got = f(*args), new(*args)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    return new


def _linears(x, wq, bq, wk, bk, wv, bv):  # x: [b, s, d]; w*: [n, d]; b*: [n] -> three [b, s, n]
    return tuple(torch.nn.functional.linear(x, w, b) for w, b in ((wq, bq), (wk, bk), (wv, bv)))


def test_linears_with_biases_on_one_input_become_one_addmm_on_concatenated_weights_and_biases():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    args = (x, torch.randn(8, 8), torch.randn(8), torch.randn(4, 8), torch.randn(4), torch.randn(4, 8), torch.randn(4))
    before = _traced(_linears, *args)
    assert _targets(before).count("aten.addmm.default") == 3 and merge_linears.precondition(before) == ""
    after = _rewritten_matches("merge-linears", _linears, *args)
    assert _targets(after).count("aten.addmm.default") == 1 and _targets(after).count("aten.cat.default") == 2


def test_matmuls_with_weights_not_stored_transposed_are_merged_along_columns():
    def f(x, w1, w2):  # x: [m, k], w*: [k, n*]
        return torch.relu(x @ w1), x @ w2

    new = _rewritten_matches("merge-linears", f, torch.randn(6, 4), torch.randn(4, 3), torch.randn(4, 5))
    assert _targets(new).count("aten.mm.default") == 1


def test_a_merged_gemms_output_that_is_a_graph_output_keeps_the_layout_of_the_original():
    def f(x, w1, w2):  # x: [m, k]; w*: [n, k]; the first output returned as a view, as a forward saves q
        return torch.nn.functional.linear(x, w1).t(), torch.nn.functional.linear(x, w2).relu()

    args = (torch.randn(6, 4), torch.randn(3, 4), torch.randn(5, 4))
    new = _rewritten_matches("merge-linears", f, *args)
    assert [o.stride() for o in new(*args)] == [o.stride() for o in f(*args)] == [(1, 3), (5, 1)]
    assert _targets(new).count("aten.mm.default") == 1 and _targets(new).count("aten.clone.default") == 1


def test_a_gemm_whose_weights_come_from_another_on_the_same_input_is_not_merged():
    def f(x, w):  # x: [4, 4], w: [4, 4]: the second GEMM's weight is the first one's output
        y = x @ w
        return (x @ y,)

    gm = _traced(f, torch.randn(4, 4), torch.randn(4, 4))
    assert "not parallel" in merge_linears.precondition(gm)
    with pytest.raises(rewrites.NotApplicable, match="not parallel"):
        rewrites.apply("merge-linears", gm, (torch.randn(4, 4), torch.randn(4, 4)))


def test_gemms_on_different_inputs_or_of_different_kinds_are_not_merged():
    def f(x, y, w1, w2, b):
        return x @ w1, y @ w2, torch.addmm(b, x, w2)

    gm = _traced(f, torch.randn(3, 4), torch.randn(3, 4), torch.randn(4, 2), torch.randn(4, 2), torch.randn(2))
    assert merge_linears.precondition(gm) == "no two of its 3 GEMMs (mm, addmm) of one kind read the same input"
    assert merge_linears.precondition(_traced(lambda x: (x.relu(),), torch.randn(2))) == \
        "the graph calls no aten.mm or plain aten.addmm"


def _conv(stride, padding=0, dilation=1, groups=1, bias=True):
    def f(x, w, b):
        return (torch.nn.functional.conv2d(x, w, b if bias else None, stride, padding, dilation, groups),)
    return f


@pytest.mark.parametrize("image,bias", [((16, 16), True), ((18, 21), True), ((16, 16), False)],
                         ids=["whole-patches", "a-remainder-dropped", "no-bias"])
def test_a_convolution_whose_stride_is_its_kernel_becomes_patches_times_a_gemm(image, bias):
    torch.manual_seed(0)
    args = (torch.randn(2, 3, *image), torch.randn(6, 3, 4, 4), torch.randn(6))
    new = _rewritten_matches("patchify-conv", _conv(4, bias=bias), *args)
    assert "aten.convolution.default" not in _targets(new)
    assert ("aten.addmm.default" if bias else "aten.mm.default") in _targets(new)
    assert new(*args)[0].is_contiguous()  # a graph output keeps the convolution's layout


@pytest.mark.parametrize("kw,why", [
    (dict(stride=1), "stride [1, 1] is not its kernel [4, 4]"),
    (dict(stride=4, padding=1), "padding [1, 1] or dilation [1, 1]"),
    (dict(stride=4, groups=3), "transposed or grouped"),
])
def test_a_convolution_that_is_not_a_patch_embedding_is_left_alone_with_the_reason(kw, why):
    w = torch.randn(6, 1 if kw.get("groups") else 3, 4, 4)
    gm = _traced(_conv(**kw), torch.randn(1, 3, 16, 16), w, torch.randn(6))
    assert patchify_conv.precondition(gm) == f"no convolution is a patch embedding: {why}"
    assert patchify_conv.precondition(_traced(lambda x: (x.relu(),), torch.randn(2))) == \
        "the graph calls no aten.convolution"
