"""Rerun a captured graph (`tilesmith replay GRAPH_DIR`): load its wrapper in a fresh process, call it on the
captured inputs, compare with the captured outputs. Proves a workspace is complete enough for the gate to use.
(The lean CUDA-graph replay a candidate may use is another thing: tilesmith/replay/.)"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import paths
from tilesmith.launch import sandbox
from tilesmith.errors import TilesmithError
from tilesmith.workspace import Graph


@dataclass
class RerunResult:
    key: str
    ok: bool
    bitwise: bool = False
    max_abs_error: float = 0.0
    outputs: int = 0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def rerun(graph_dir: str | Path, *, timeout_s: float = 600.0, atol: float = 1e-5) -> RerunResult:
    """Rerun one captured graph in a subprocess; `ok` when every output matches within `atol`."""
    graph = Graph(paths.absolute(graph_dir))
    cmd = [sys.executable, "-m", "tilesmith.capture.rerun", str(graph.dir), str(atol)]
    with tempfile.TemporaryDirectory(prefix="tilesmith-replay-") as tmp:
        spec = sandbox.Spec.for_graphs(tmp, [graph.device], readable=[str(graph.dir)])
        res = sandbox.run_json(cmd, spec, timeout_s)
    if res.returncode is None:
        return RerunResult(graph.key, False, problems=[f"replay did not finish in {timeout_s:.0f} s"])
    if res.returncode != 0 or res.reply is None:
        raise TilesmithError(f"replay of {graph.key[:12]} failed (exit {res.returncode}): {res.tail}",
                             code="replay-failed",
                             hint="run `python -m tilesmith.capture.rerun GRAPH_DIR` to see the whole error")
    return RerunResult(**res.reply)


def _main(gdir: str, atol: float) -> dict:
    import torch

    from tilesmith.capture import loading

    graph = Graph(gdir)
    data = graph.data()
    mod = loading.load_module(graph.wrapper, data.constants)
    args = loading.clone_args(data.inputs)
    loading.restore_rng(data.rng)
    with torch.no_grad():
        out = mod.call(args)
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    problems, bitwise, max_err = [], True, 0.0
    if len(out) != len(data.outputs):
        problems.append(f"{len(out)} outputs, captured {len(data.outputs)}")
    for i, (a, b) in enumerate(zip(out, data.outputs)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                problems.append(f"output {i}: {a!r} != {b!r}")
            continue
        if a.shape != b.shape or a.dtype != b.dtype or a.stride() != b.stride():
            problems.append(f"output {i}: layout {tuple(a.shape)}/{a.stride()}/{a.dtype} != captured "
                            f"{tuple(b.shape)}/{b.stride()}/{b.dtype}")
            continue
        b = b.to(a.device)
        same = torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(a.isnan(), b.isnan())
                                      and torch.equal(a.nan_to_num(), b.nan_to_num()))
        bitwise &= same
        if not same:
            err = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item() if a.numel() else 0.0
            max_err = max(max_err, err)
            if err > atol:
                problems.append(f"output {i}: max abs error {err:.3g} > {atol:g}")
    return {"key": data.meta["key"], "ok": not problems, "bitwise": bitwise and not problems,
            "max_abs_error": max_err, "outputs": len(out), "problems": problems}


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-5)))
