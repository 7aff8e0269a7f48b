"""Which mode each role of a gate decision is timed in: the graph's own (plain launches, or a CUDA-graph
replay for a graph Inductor compiled with CUDA graphs), and the exceptions for a candidate that replays
itself (tilesmith.cudagraph), which the runtime runs instead of Inductor's replay.
"""

from __future__ import annotations

from pathlib import Path

from tilesmith.errors import TilesmithError
from tilesmith.gate.verdict import MODES, Reason, Verdict


def resolve_mode(mode: str, meta: dict) -> str:
    """auto: CUDA-graph replay for graphs compiled with CUDA graphs, plain launches otherwise."""
    if mode not in MODES:
        raise TilesmithError(f"unknown timing mode {mode!r}", code="usage", hint="use auto, launch or graph")
    cuda = str(meta.get("device", "")).startswith("cuda")
    if mode == "auto":
        return "graph" if cuda and meta.get("compile_mode") == "cudagraphs" else "launch"
    if mode == "graph" and not cuda:
        raise TilesmithError("graph mode needs a CUDA graph; this one runs on " + str(meta.get("device")),
                             code="usage", hint="use --mode launch")
    return mode


def own_replay(text: str) -> bool:
    """Whether a wrapper replays its own launches from CUDA graphs (tilesmith.cudagraph): it imports the
    helper and its last top-level statement that binds `call` is `call = graphed(call)` (later ones that do
    not, e.g. `benchmark_compiled_module` and the `__main__` block, may follow), so the module's `call` is the helper's replay,
    which is what makes the runtime turn Inductor's CUDA graphs off for the graph. A call that only uses a
    replay inside it (`_g = graphed(call)` and a function calling `_g`) would still run under Inductor's
    trees in the program, and is timed like any other candidate."""
    import ast

    if "from tilesmith.cudagraph import graphed" not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    last = None  # the last top-level statement that binds `call` (anywhere inside it)
    for stmt in tree.body:
        if any(isinstance(n, ast.Name) and n.id == "call" and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt)) \
                or any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == "call"
                       for n in ast.walk(stmt)) \
                or any(isinstance(n, ast.alias) and (n.asname or n.name) == "call" for n in ast.walk(stmt)):
            last = stmt
    return (isinstance(last, ast.Assign) and len(last.targets) == 1 and isinstance(last.targets[0], ast.Name)
            and last.targets[0].id == "call" and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Name) and last.value.func.id == "graphed"
            and len(last.value.args) == 1 and not last.value.keywords
            and isinstance(last.value.args[0], ast.Name) and last.value.args[0].id == "call")


TREES_BOTH = ("timed through Inductor's cudagraph trees, the original and the candidate alike: the program runs "
              "installed code of a graph compiled with CUDA graphs under the trees, whose host time per call a bare "
              "replay leaves out (the MoE on the H200: a bare-replay gain of 1.19x was 1.12x in the program)")


def role_modes(v: Verdict, mode: str, raw: bytes, timing_base: Path | None, meta: dict | None = None) -> dict:
    """Roles timed in another mode than the graph's. Inductor replays the original of a graph compiled
    with CUDA graphs; a candidate that replays itself (the runtime turns Inductor's CUDA graphs off for a
    graph whose artifact does) is timed as plain calls of its own replay: each the way it would run. The
    original it replaces then runs as the program would run it, through Inductor's cudagraph trees
    (gate/worker/trees.py); a bare replay where the trees cannot be set up."""
    if mode != "graph":
        return {}
    if not own_replay(raw.decode(errors="replace")):
        # Code the trees will run in the program: both roles through the trees, where each call can read its
        # own buffer set (Inductor's static marks known, gate.inputs.trees_static): a candidate must never run
        # where every call reads the same inputs (a cache keyed on them would answer from memory).
        from tilesmith.gate.inputs import trees_static

        if meta is None or trees_static(meta) is None:
            return {}
        v.warnings.append(Reason("trees", TREES_BOTH))
        if timing_base is not None and own_replay(timing_base.read_text()):
            return {"candidate": "trees", "baseline": "launch"}  # the best so far runs its own replay in the program
        return {"candidate": "trees", "baseline": "trees"}
    modes = {"candidate": "launch", "baseline": "trees"}
    if timing_base is not None and own_replay(timing_base.read_text()):
        modes["baseline"] = "launch"  # the best so far replays itself too: like with like
        v.warnings.append(Reason("own-replay", "the candidate replays its own CUDA graph, as does the best so "
                                               "far: both timed as plain calls of their own replay"))
    else:
        v.warnings.append(Reason("own-replay", "the candidate replays its own CUDA graph: timed as plain calls "
                                               "against the original run through Inductor's cudagraph trees "
                                               "(the inputs Inductor marked static read in place, the others copied "
                                               "in, as in the program; every input static where the capture did "
                                               "not record Inductor's marks)"))
    return modes
