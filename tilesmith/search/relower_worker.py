"""Worker for tilesmith.search.relower: lowers one captured graph again under one Inductor config patch.

Runs Inductor's own compiler on the stored repro (no candidate code), in its own process so variants
compile in parallel. Prints one JSON line: ok, reason, the wrapper file it wrote, and the checks that
the new wrapper keeps the graph's ABI (inputs, outputs, constants bound by name, partitions).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import torch

from tilesmith import source
from tilesmith.capture import loading
from tilesmith.capture import repro
from tilesmith.search import rewrites
from tilesmith.workspace import WRAPPER_FILE

_CONST_DECL = re.compile(r"^(\w+) = None  # device\(", re.M)
_GRAPH_INPUT = re.compile(r"^(arg\d+_\d+|primals_\d+|tangents_\d+)$")


def _partition_args(src: str) -> dict[str, tuple[list[str], int, int | None]]:
    """Per `partition_N` function: the names its first statement unpacks from `args` (in order), how many outputs
    it returns, and the line of that statement (1-based; None where there is none)."""
    import ast

    out = {}
    for node in ast.parse(src).body:
        if not (isinstance(node, ast.FunctionDef) and re.fullmatch(r"partition_\d+", node.name)):
            continue
        names, n_out, line = [], 0, None
        for st in ast.walk(node):
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name) and st.value.id == "args" and line is None:
                t = st.targets[0]
                names = [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
                line = st.lineno if st.end_lineno == st.lineno else None
            if isinstance(st, ast.Return) and st.value is not None:
                n_out = len(st.value.elts) if isinstance(st.value, (ast.Tuple, ast.List)) else 1
        out[node.name] = (names, n_out, line)
    return out


def _partitions(src: str) -> list[tuple]:
    """Per `partition_N` function: (the graph inputs it unpacks, how many other inputs, how many outputs)."""
    import ast

    out = []
    for node in ast.parse(src).body:
        if not (isinstance(node, ast.FunctionDef) and re.fullmatch(r"partition_\d+", node.name)):
            continue
        names, n_out = [], 0
        for st in ast.walk(node):
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name) and st.value.id == "args" and not names:
                t = st.targets[0]
                names = [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
            if isinstance(st, ast.Return) and st.value is not None:
                n_out = len(st.value.elts) if isinstance(st.value, (ast.Tuple, ast.List)) else 1
        graph = tuple(n for n in names if _GRAPH_INPUT.match(n))
        out.append((node.name, graph, len(names) - len(graph), n_out))
    return out


def partition_difference(new_src: str, orig_src: str) -> str:
    """How `new_src`'s graph partitions differ from the original's, in a few words ("" where they do not): which
    partition, and whether the same graph inputs come in another order, other ones, or other counts."""
    new, orig = dict((p[0], p[1:]) for p in _partitions(new_src)), dict((p[0], p[1:]) for p in _partitions(orig_src))
    if list(new) != list(orig):
        return f"partitions {', '.join(new) or 'none'}, the original {', '.join(orig) or 'none'}"
    for name, (graph, others, n_out) in new.items():
        g0, o0, n0 = orig[name]
        if set(graph) != set(g0):
            extra, missing = sorted(set(graph) - set(g0)), sorted(set(g0) - set(graph))
            return (f"{name} takes graph inputs {', '.join(extra[:4]) or 'none'} the original's does not, and not "
                    f"{', '.join(missing[:4]) or 'none'}")
        if (others, n_out) != (o0, n0):
            return f"{name}: {others} other inputs and {n_out} outputs, the original {o0} and {n0}"
        if graph != g0:
            i = next(i for i, (a, b) in enumerate(zip(graph, g0)) if a != b)
            return (f"{name} takes the same {len(graph)} graph inputs in another order (at position {i}: {graph[i]}, "
                    f"the original {g0[i]})")
    return ""


def in_original_order(new_src: str, orig_src: str) -> str:
    """`new_src` with each graph partition's inputs in the original's order, where its partitions take the same graph
    inputs as the original's, as many other inputs (buffers from partitions before it, sizes) and outputs, in another
    order: both the partition's unpacking of `args` and the `partitionN_args = [...]` list its caller builds are
    permuted alike, so the code computes what it did. Inductor's cudagraph trees route each partition's inputs by the
    original compile's map (which position is which graph input), so only this order can run there. A rewrite that
    changes which op reads an input first (a convolution as a reshape and a GEMM) changes the order Inductor emits.
    Unchanged where the partitions differ otherwise (abi_problems says how)."""
    new, orig = _partition_args(new_src), _partition_args(orig_src)
    sig, sig0 = _partitions(new_src), _partitions(orig_src)
    if [(n, set(g), o, k) for n, g, o, k in sig] != [(n, set(g), o, k) for n, g, o, k in sig0]:
        return new_src  # more than the order differs
    # Each graph input goes where the original has it, among the other inputs too (which the signature leaves out).
    lines = new_src.split("\n")
    for name, (names, _, line) in new.items():
        names0 = orig[name][0]
        others = iter([n for n in names if not _GRAPH_INPUT.match(n)])
        order = [n if _GRAPH_INPUT.match(n) else next(others) for n in names0]
        if order == names:
            continue
        k = name.split("_")[1]
        call = [i for i, x in enumerate(lines) if re.fullmatch(rf"\s*partition{k}_args = \[.*\]", x)]
        if line is None or len(call) != 1 or re.fullmatch(r"\s*[\w, ]+ = args", lines[line - 1]) is None:
            return new_src  # not the shape Inductor writes: left as it is, for the check to refuse
        joined = ", ".join(order) + ("," if len(order) == 1 else "")
        indent = re.match(r"\s*", lines[line - 1]).group(0)
        lines[line - 1] = f"{indent}{joined} = args"
        c = call[0]
        lead = re.match(r"\s*", lines[c]).group(0)
        lines[c] = f"{lead}partition{k}_args = [{joined}]"
    return "\n".join(lines)


def missing_configs(patch: dict) -> list[str]:
    """Config names (dotted) that this torch's Inductor does not have."""
    import torch._inductor.config as cfg

    out = []
    for name in patch:
        obj = cfg
        for part in name.split("."):
            if not hasattr(obj, part):
                out.append(name)
                break
            obj = getattr(obj, part)
    return out


def _topk_as_sort(x, k, dim=-1, largest=True, sorted=True):
    """aten.topk as a stable sort and its first k (contiguous, as topk's outputs are); ties in index order.
    A 0-d input, or an unsorted topk (whose order a sort would change for nothing), stays aten.topk."""
    if x.dim() == 0 or not sorted:
        return NotImplemented
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()


# Rewrites applied while the repro is traced again (Variant.trace): name -> (the aten op the graph must call
# for it to change anything, a decomposition table for make_fx).
TRACES = {"topk-as-sort": ("aten.topk", {torch.ops.aten.topk.default: _topk_as_sort})}


def lower(gdir: Path, patch: dict, trace: str = ""):
    """(new wrapper source, seconds): the stored repro lowered by compile_fx_inner under `patch`, traced
    with the rewrite `trace` names (TRACES, or a graph rewrite of tilesmith/search/rewrites) first."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool
    from torch.fx.experimental.proxy_tensor import make_fx

    text = repro.clean((gdir / repro.REPRO_FILE).read_text())
    op, table = TRACES.get(trace, ("", None))
    if op and op not in text:
        raise _NothingToRewrite(f"the graph calls no {op}")
    graph_rewrites = rewrites.named(trace)
    for r in graph_rewrites:
        if not any(o in text for o in r.ops):
            raise _NothingToRewrite(f"the graph calls no {' or '.join(o.rstrip('.') for o in r.ops)}")
    data = loading.load_graph_data(gdir)
    st = repro.status(text, data.constants)
    if not st.available:
        raise ValueError(st.reason)
    ns: dict = {"__name__": "tilesmith_repro"}  # not __main__: the repro's own runner stays off
    exec(compile(text, "<repro>", "exec"), ns)
    mod = ns["mod"]
    for name in st.bound:  # the captured values, not the repro's random placeholders
        setattr(mod, name, data.constants[name])
    args = loading.clone_args(data.inputs)
    if len(args) != len(repro.placeholders(text)):
        raise ValueError(f"the repro takes {len(repro.placeholders(text))} inputs, the graph {len(args)}")
    kind = data.meta.get("kind")
    t0 = time.perf_counter()
    with torch.no_grad():
        gm = make_fx(mod, decomposition_table=table, tracing_mode="real")(*args)
    for r in graph_rewrites:
        try:
            gm = rewrites.apply(r.name, gm, args)
        except rewrites.NotApplicable as e:  # the precondition, read from the traced graph, does not hold
            raise _NothingToRewrite(str(e)) from None
    for n in gm.graph.nodes:  # Inductor names kernels after the aten ops they came from (descriptive_names)
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            n.meta.setdefault("original_aten", n.target)
    with torch._inductor.config.patch(patch):
        # cudagraphs off: we keep only the source; Inductor's cudagraph trees wrap it in production.
        cg = compile_fx_inner(gm, args, cudagraphs=BoxedBool(False), is_backward=kind == "backward",
                              is_inference=kind == "inference")
    return cg.source_code, time.perf_counter() - t0


def abi_problems(gdir: Path, new_src: str, explain: bool = False) -> tuple[list[str], float | None]:
    """What in `new_src` breaks the graph's ABI; and the max abs error against the captured outputs. explain: say how
    graph partitions differ in words (partition_difference) rather than as the two signatures (a rewrite's variant:
    behind TILESMITH_REWRITES until a GPU run has checked it)."""
    data = loading.load_graph_data(gdir)
    orig = source.split_header((gdir / WRAPPER_FILE).read_text())[1]
    problems = []
    for name in _CONST_DECL.findall(new_src):
        c = data.constants.get(name)
        if not isinstance(c, torch.Tensor):
            problems.append(f"needs constant {name}, which the graph does not bind")
    if _partitions(new_src) != _partitions(orig):
        # Inductor's cudagraph trees route inputs and outputs per partition by the original compile's map
        problems.append(f"its graph partitions differ from the original's: {partition_difference(new_src, orig)}"
                        if explain else f"graph partitions {_partitions(new_src)}, the original {_partitions(orig)} "
                        "((graph inputs, other inputs, outputs) per partition)")
    if problems:
        return problems, None
    mod = loading.load_module(new_src, data.constants)
    loading.restore_rng(data.rng)
    with torch.no_grad():
        out = mod.call(loading.clone_args(data.inputs))
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(out) != len(data.outputs):
        return [f"{len(out)} outputs, the original returns {len(data.outputs)}"], None
    err = 0.0
    for i, (a, b) in enumerate(zip(out, data.outputs)):
        if not isinstance(b, torch.Tensor):
            continue
        if not isinstance(a, torch.Tensor) or (a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype):
            lay = (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
            problems.append(f"output {i}: {lay}, the original {(tuple(b.shape), b.stride(), b.dtype)}")
        elif a.numel() and b.dtype.is_floating_point:
            err = max(err, float((a.double() - b.to(a.device).double()).abs().nan_to_num(0.0).max()))
    return problems, err


class _NothingToRewrite(Exception):
    pass


def main(spec_file: str) -> dict:
    spec = json.loads(Path(spec_file).read_text())
    gdir, patch, trace = Path(spec["graph_dir"]), spec["patch"], spec.get("trace") or ""
    missing = missing_configs(patch)
    if missing:
        return {"ok": False, "reason": f"torch {torch.__version__} has no Inductor config {', '.join(missing)}"}
    if trace not in ("", *TRACES) and not rewrites.named(trace):
        return {"ok": False, "reason": f"no graph rewrite named {trace!r}"}
    try:
        src, secs = lower(gdir, patch, trace)
    except _NothingToRewrite as e:  # nothing for this variant to change: not worth a compile
        return {"ok": False, "reason": str(e)}
    except Exception as e:  # Inductor could not lower under this config: a skipped variant, with the reason
        return {"ok": False, "reason": f"compile failed: {type(e).__name__}: {e}"[:400]}
    canon = source.canonicalize(src)
    rewritten = bool(rewrites.named(trace))
    if rewritten:  # a rewritten graph's partitions may take their inputs in another order
        canon = in_original_order(canon, source.split_header((gdir / WRAPPER_FILE).read_text())[1])
    try:
        problems, err = abi_problems(gdir, canon, explain=rewritten)
    except Exception as e:
        return {"ok": False, "reason": f"the re-lowered wrapper does not run: {type(e).__name__}: {e}"[:400],
                "compile_s": secs}
    if problems:
        return {"ok": False, "reason": "changes the graph's ABI: " + "; ".join(problems)[:400], "compile_s": secs}
    fx = source.split_header((gdir / WRAPPER_FILE).read_text())[0]
    Path(spec["out"]).write_text(source.add_header(fx, canon) if fx else canon)
    return {"ok": True, "reason": "", "out": spec["out"], "compile_s": secs, "max_abs_error": err}


if __name__ == "__main__":
    loading.reply(main(sys.argv[1]))
