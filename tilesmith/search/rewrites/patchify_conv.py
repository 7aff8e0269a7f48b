"""Rewrite "patchify-conv": a 2-d convolution whose stride equals its kernel (a ViT's patch embedding) as a
reshape of the image into patches and one GEMM.

Precondition, read from the aten graph: an `aten.convolution` on a 4-d input [b, c, h, w] with a 4-d weight
[o, c, kh, kw] of the input's floating dtype, stride == (kh, kw), no padding, dilation 1, not transposed, one
group, and h >= kh, w >= kw. Rows and columns past the last whole patch are dropped, as the convolution drops them.

After: the input cut into patches, [b, c, ho, kh, wo, kw] -> [b, ho, wo, c, kh, kw] -> [b*ho*wo, c*kh*kw] (one
copy of the input, a pointwise kernel Inductor can fuse with what made the input), times the weight viewed as
[o, c*kh*kw] and transposed, plus the bias (addmm): [b*ho*wo, o], returned as [b, o, ho, wo] with channels-last
strides (a view; made contiguous only where the convolution's output is a graph output, whose layout is part of
the graph's ABI). Nothing is prepared ahead: the weight's view is free. Inductor's profile of a timm ViT on the H100
(issue 37) had the patch embedding at 2 % of memory bandwidth as a convolution; as a GEMM it is one of the shapes
the GEMM libraries are tuned for. Rounding: the GEMM sums the c*kh*kw products in another order than the
convolution's algorithm; the gate's tolerance judges it.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _val(n):
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _why_not(n) -> str:
    """Why the aten.convolution node `n` is not a patch embedding this rewrite handles; "" when it is."""
    if len(n.args) != 9 or n.kwargs:
        return "arguments not as aten.convolution.default spells them"
    x, w, _, stride, padding, dilation, transposed, _, groups = n.args
    xv, wv = _val(x), _val(w)
    if xv is None or wv is None or xv.dim() != 4 or wv.dim() != 4:
        return "not a 2-d convolution with a batch dimension"
    kernel = list(wv.shape[2:])
    if transposed or groups != 1:
        return "transposed or grouped"
    if list(stride) != kernel:
        return f"stride {list(stride)} is not its kernel {kernel}"
    if any(padding) or any(d != 1 for d in dilation):
        return f"padding {list(padding)} or dilation {list(dilation)}"
    if not xv.dtype.is_floating_point or xv.dtype != wv.dtype:
        return f"input {xv.dtype}, weight {wv.dtype}"
    if xv.shape[2] < kernel[0] or xv.shape[3] < kernel[1]:
        return "an input smaller than one patch"
    return ""


def _convolutions(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.convolution.default]


def precondition(gm) -> str:
    """"" when the graph has a convolution this rewrite turns into a GEMM; else why not."""
    convs = _convolutions(gm)
    if not convs:
        return "the graph calls no aten.convolution"
    whys = [_why_not(n) for n in convs]
    if all(whys):
        return "no convolution is a patch embedding: " + "; ".join(dict.fromkeys(whys))
    return ""


def apply(gm) -> int:
    """Every patch-embedding convolution as patches times a GEMM; the number rewritten."""
    done = 0
    for n in _convolutions(gm):
        if not _why_not(n):
            _patchify(gm.graph, n)
            done += 1
    return done


def _patchify(graph, conv) -> None:
    x, w, bias = conv.args[:3]
    b, c, h, wd = _val(x).shape
    o, _, kh, kw = _val(w).shape
    ho, wo = h // kh, wd // kw
    out = _val(conv)
    call = graph.call_function
    with graph.inserting_before(conv):
        if (ho * kh, wo * kw) != (h, wd):  # the convolution drops what is past the last whole patch
            x = call(aten.slice.Tensor, (call(aten.slice.Tensor, (x, 2, 0, ho * kh)), 3, 0, wo * kw))
        p = call(aten.reshape.default, (x, [b, c, ho, kh, wo, kw]))
        p = call(aten.permute.default, (p, [0, 2, 4, 1, 3, 5]))  # [b, ho, wo, c, kh, kw]
        p = call(aten.reshape.default, (p, [b * ho * wo, c * kh * kw]))  # a copy: one row per patch
        wt = call(aten.permute.default, (call(aten.reshape.default, (w, [o, c * kh * kw])), [1, 0]))  # [c*kh*kw, o]
        y = call(aten.addmm.default, (bias, p, wt)) if bias is not None else call(aten.mm.default, (p, wt))
        y = call(aten.permute.default, (call(aten.view.default, (y, [b, ho, wo, o])), [0, 3, 1, 2]))  # [b, o, ho, wo]
        if any(u.op == "output" for u in conv.users) and out is not None and out.is_contiguous():
            y = call(aten.clone.default, (y,), {"memory_format": torch.contiguous_format})
    conv.replace_all_uses_with(y)
    graph.erase_node(conv)
