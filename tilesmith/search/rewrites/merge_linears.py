"""Rewrite "merge-linears": parallel linears that read one input become one GEMM on concatenated weights.

Precondition, read from the aten graph: two or more GEMMs of one kind that read the same left operand (the same
node, or views of one node to one shape, as each nn.Linear of a 3-d input views it again), with right operands of
one dtype: `aten.mm(x, B_i)`, or `aten.addmm(b_i, x, B_i)` with a 1-d bias over the columns and alpha = beta = 1.
q/k/v and gate/up projections are this. A group whose outputs are used before all its operands exist (one
projection feeding another's weights) is not parallel and is left alone.

After: one `mm(x, cat(B_i, 1))` (one `addmm` with `cat(b_i)`), each former output a column slice of it (copied
to its own contiguous buffer where it, or a view of it, is a graph output: a training forward returns q, k and v
for the backward, and an output's layout is part of the graph's ABI). Where
B_i is `permute(W_i, [1, 0])` of an nn.Linear weight W_i [n_i, k], the weights are concatenated as they are
stored (`cat(W_i, 0)`, a contiguous copy) and transposed after, as before.

Cost: the weights are graph inputs, so the concatenation runs inside every call; nothing is kept between calls
(a cache keyed on an input's identity is what stale-result cheats are made of, and the gate changes parameters
between samples). It copies sum(n_i) * k elements per call: 2 * sum(n_i) * k * itemsize bytes of traffic on top of
the GEMM's own read of the weights, so the weight traffic about triples. It wins where the GEMMs are bound by
compute or launches, not by reading weights: many rows m (prefill, training, a ViT's tokens; with m in the
hundreds the 2 * m * k * sum(n_i) FLOPs dwarf the copy), where one wider GEMM runs nearer peak than several
narrow ones and k - 1 launches go. It loses on few rows (decoding, m of 1 to 16), where each GEMM is a read of
its weights. The gate decides on the measured whole call. Rounding: each output column is the same dot product,
but a wider GEMM may block the reduction otherwise; the gate's tolerance judges it.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_TRANSPOSES = (aten.permute.default, aten.t.default)
_VIEW_OPS = {*_VIEWS, *_TRANSPOSES, aten.transpose.int, aten.slice.Tensor, aten.select.int, aten.unsqueeze.default,
             aten.squeeze.dim, aten.squeeze.default, aten.expand.default, aten.alias.default, aten.split.Tensor,
             aten.split_with_sizes.default, aten.unbind.int}


def _val(n):
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _gemm(n):
    """(kind, left, right, bias) of an aten.mm, or of an addmm with a 1-d bias over its columns and alpha =
    beta = 1; None for anything else."""
    if n.op != "call_function":
        return None
    if n.target is aten.mm.default and len(n.args) == 2 and not n.kwargs:
        return "mm", n.args[0], n.args[1], None
    if n.target is aten.addmm.default and len(n.args) == 3 and set(n.kwargs) <= {"alpha", "beta"} \
            and all(n.kwargs.get(k, 1) == 1 for k in ("alpha", "beta")):
        bias, left, right = n.args
        b, out = _val(bias), _val(n)
        if b is not None and out is not None and b.dim() == 1 and b.shape[0] == out.shape[1] and b.dtype == out.dtype:
            return "addmm", left, right, bias
    return None


def _input_key(left):
    """What a GEMM's left operand reads: views of one node to one shape are one input."""
    if left.op == "call_function" and left.target in _VIEWS:
        return left.args[0], tuple(left.args[1])
    return left, None


def _stored_weight(right):
    """W where the right operand is W transposed ([n, k] -> [k, n]): an nn.Linear weight as the graph reads it."""
    if right.op == "call_function" and right.target in _TRANSPOSES and isinstance(right.args[0], torch.fx.Node):
        if right.target is aten.t.default or list(right.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
            w = _val(right.args[0])
            if w is not None and w.dim() == 2:
                return right.args[0]
    return None


def _groups(gm):
    """[(kind, members)]: GEMMs of one kind on one input, two or more, in graph order."""
    by: dict = {}
    for n in gm.graph.nodes:
        g = _gemm(n)
        if g is None or not isinstance(g[1], torch.fx.Node) or not isinstance(g[2], torch.fx.Node):
            continue
        r = _val(g[2])
        if r is None or _val(n) is None:
            continue
        by.setdefault((g[0], _input_key(g[1]), r.dtype, r.device), []).append(n)
    return [(key[0], ms) for key, ms in by.items() if len(ms) >= 2]


def _operands(members) -> list:
    """The nodes the merged GEMM reads: the first member's left operand, each weight as stored (or the right
    operand itself), each bias."""
    out = [members[0].args[0] if members[0].target is aten.mm.default else members[0].args[1]]
    for m in members:
        _, _, right, bias = _gemm(m)
        out.append(_stored_weight(right) or right)
        if bias is not None:
            out.append(bias)
    return out


def _anchor(gm, members):
    """The node after which the merged GEMM can go (after all its operands and the placeholders), or None when a
    member's output is used before that point."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    operands = _operands(members)
    anchor = max(operands + places[-1:], key=lambda n: order[n])
    # An operand made from a member's output has a user of that member at or before it (or is the member).
    if any(m in operands for m in members) or any(order[u] <= order[anchor] for m in members for u in m.users):
        return None
    return anchor


def precondition(gm) -> str:
    """"" when the graph has a group of parallel GEMMs this rewrite merges; else why not."""
    gemms = [n for n in gm.graph.nodes if _gemm(n) is not None]
    if not gemms:
        return "the graph calls no aten.mm or plain aten.addmm"
    groups = _groups(gm)
    if not groups:
        return f"no two of its {len(gemms)} GEMMs (mm, addmm) of one kind read the same input"
    if not any(_anchor(gm, ms) is not None for _, ms in groups):
        return "each group of GEMMs on one input has an output used before all its operands exist (not parallel)"
    return ""


def apply(gm) -> int:
    """Merge every group of parallel GEMMs into one; the number of GEMMs removed."""
    removed = 0
    for kind, members in _groups(gm):
        anchor = _anchor(gm, members)
        if anchor is not None:
            _merge(gm.graph, kind, members, anchor)
            removed += len(members) - 1
    return removed


def _feeds_output(node) -> bool:
    """Whether `node`, or a view of it, is a graph output (itself, or an item of a view op's list)."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        for u in n.users:
            if u.op == "output":
                return True
            if u not in seen and ((u.op == "call_function" and u.target in _VIEW_OPS)
                                  or (u.op == "call_function" and getattr(u.target, "__name__", "") == "getitem")):
                seen.add(u)
                todo.append(u)
    return False


def _merge(graph, kind: str, members: list, anchor) -> None:
    gemms = [_gemm(m) for m in members]
    outputs = [_feeds_output(m) for m in members]
    widths = [int(_val(m).shape[1]) for m in members]
    stored = [_stored_weight(g[2]) for g in gemms]
    with graph.inserting_before(anchor.next):
        left = gemms[0][1]
        if all(w is not None for w in stored):  # [sum n, k] as the weights are kept, then [k, sum n]
            right = graph.call_function(aten.permute.default,
                                        (graph.call_function(aten.cat.default, (stored, 0)), [1, 0]))
        else:  # [k, sum n]
            right = graph.call_function(aten.cat.default, ([g[2] for g in gemms], 1))
        if kind == "addmm":
            bias = graph.call_function(aten.cat.default, ([g[3] for g in gemms], 0))
            merged = graph.call_function(aten.addmm.default, (bias, left, right))
        else:
            merged = graph.call_function(aten.mm.default, (left, right))  # [m, sum n]
        start = 0
        for m, width, out in zip(members, widths, outputs):
            part = graph.call_function(aten.slice.Tensor, (merged, 1, start, start + width))  # [m, n_i]
            if out:  # the original's layout: [m, n_i] contiguous
                part = graph.call_function(aten.clone.default, (part,), {"memory_format": torch.contiguous_format})
            m.replace_all_uses_with(part)
            start += width
    for m in members:
        graph.erase_node(m)
