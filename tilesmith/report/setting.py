"""Which setting wins, per graph and for the program, for users of CUDA graphs: read from a report.

A graph compiled with CUDA graphs (`mode="reduce-overhead"` or `"max-autotune"`; graph.json's
`compile_mode` is "cudagraphs") runs as Inductor's replay in production, and the gate times its
original that way (graph mode: Inductor's wrapper replayed from a CUDA graph). The tuner offers
tilesmith's own replay of the same code (`tilesmith.cudagraph`, tilesmith/replay/); the runtime loads an accepted one and
turns Inductor's CUDA graphs off for that graph only (tilesmith/runtime `_substitute`). Per graph, then:

- tilesmith's replay won: the accepted source replays itself, timed against Inductor's replay;
- Inductor's replay stays, of tilesmith's faster code: accepted, and Inductor's replay wraps it;
- Inductor's replay stays, of its own code: nothing accepted.

For a graph compiled without CUDA graphs, an accepted replay took over plain launches: Inductor's
replay was never timed for it, so nothing is said about it. Nothing is measured here: every number is
the report's (the gate's accepted chain, its interval, the program estimate's machinery).
"""

from __future__ import annotations

import json
from pathlib import Path

from tilesmith.errors import TilesmithError
from tilesmith.report.rows import GraphSetting, ProgramSetting
from tilesmith.workspace import Graph, graph_dir

CUDAGRAPHS = "cudagraphs"  # graph.json's compile_mode for reduce-overhead / max-autotune


def graph_json(ws_path, key: str) -> dict:
    """A graph's graph.json in the run's workspace (its Graph's meta); {} where it cannot be read."""
    try:
        meta = Graph(graph_dir(ws_path, key)).meta if ws_path else {}
    except (TilesmithError, OSError, UnicodeDecodeError):
        meta = {}
    return meta if isinstance(meta, dict) else {}


def gap_note(meta: dict) -> str:
    """Why a CUDA graph was timed back to back rather than with the program's own host time between its calls
    (graph.json `meta`'s program_gap, capture/gaps.py); "" where the gap was used, or is not known."""
    gap = meta.get("program_gap")
    if not isinstance(gap, dict) or gap.get("usable") is not False or not str(gap.get("device", "")).startswith("cuda"):
        return ""
    return f"timed back to back, not with the program's own host time between calls: {str(gap.get('why') or '')[:300]}"


def compile_mode(meta: dict, info) -> tuple[str, str]:
    """(compile mode, device) of one graph: its graph.json (`meta`) as the gate read it, else workspace.toml's
    entry; ("", "") when neither can be read."""
    if meta.get("compile_mode"):
        return str(meta["compile_mode"]), str(meta.get("device") or "")
    return (info.compile_mode, info.device) if info is not None else ("", "")


def best_text(tdir: Path, cached) -> str | None:
    """The accepted source: the track's best.py, else the installed artifact an exact hit reused."""
    files = [tdir / "best.py"] + ([Path(cached["artifact"])] if isinstance(cached, dict) and cached.get("artifact") else [])
    for f in files:
        try:
            return f.read_text()
        except (OSError, UnicodeDecodeError):
            continue
    return None


def graph_setting(g, cands: list, best_text: str | None) -> GraphSetting:
    """The setting line of GraphReport `g`: `cands` are its CandidateRows, `best_text` the accepted
    source (the track's best.py, or the reused artifact), None when nothing was accepted."""
    from tilesmith.gate import own_replay
    from tilesmith.search.graphed import REPLAYED_SUFFIX

    sp, lo = g.speedup, g.speedup_low
    cuda = g.device.startswith("cuda")
    replays = bool(cuda and best_text and own_replay(best_text) and sp)
    accepted = [c for c in cands if c.accepted]
    modes = {c.mode for c in accepted if c.mode} or ({_cached_mode(g.cached)} - {""} if g.cached else set())
    timed = "" if not modes else modes.pop() if len(modes) == 1 else "mixed"
    s = lambda winner, text: GraphSetting(winner, text, sp, lo, timed)  # noqa: E731
    gain = f"{sp:.3f}x (gate{f', lower bound {lo:.3f}x' if lo else ''})" if sp else ""
    if g.compile_mode == CUDAGRAPHS:
        if g.status in ("not in run", "ineligible"):
            why = f"{g.status}: {g.ineligible_reason}" if g.ineligible_reason else g.status
            return s("inductor-replay", f"reduce-overhead's replay stays: this run did not optimize the graph ({why})")
        if sp and timed != "graph":
            how = {"launch": "as plain launches", "mixed": "in no single mode"}.get(timed, "in a mode not recorded")
            return s("unknown", f"accepted at {gain}, but timed {how}, not against reduce-overhead's replay: "
                                "no advice on the setting")
        if replays:
            more = len(accepted) - 1
            what = "tilesmith's replay" + (f" (with {more} more accepted change{'s' if more > 1 else ''})" if more > 0 else "")
            relowered = [c.label for c in accepted if c.label.endswith(REPLAYED_SUFFIX)]
            if relowered:  # the replay and a re-lowering judged together (tuner.replay_near_even)
                what = f"tilesmith's replay of Inductor's code lowered again ({relowered[-1].removesuffix(REPLAYED_SUFFIX)})"
            return s("tilesmith-replay", f"{what} beats reduce-overhead's CUDA graph by {gain}: keep your compile mode; "
                                         "the runtime replays this graph itself and turns Inductor's replay off for it")
        if sp:
            return s("inductor-replay-of-tilesmith-code", f"Inductor's replay stays, of tilesmith's faster code: {gain}; "
                                                          f"keep your compile mode{_replay_tried(cands)}")
        tried = (f"nothing tried beat it ({g.candidates} candidate{'s' if g.candidates != 1 else ''})" if g.candidates
                 else f"no candidate was judged ({g.status})")
        return s("inductor-replay", f"reduce-overhead's replay stays: {tried}{_replay_tried(cands)}")
    if not g.compile_mode:
        return s("unknown", "compile mode unknown (the workspace's graph.json and workspace.toml are unreadable): "
                            "no advice on the setting")
    if replays:
        return s("tilesmith-replay-over-launches", f"tilesmith's replay took over the launches: {gain} over Inductor's "
                                                   "plain launches; the runtime replays this graph itself")
    if sp:
        return s("tilesmith-code", f"tilesmith's faster code: {gain}")
    return s("inductor-code", f"Inductor's code stays: {'nothing tried beat it' if g.candidates else 'nothing was judged'} "
                              f"({g.candidates} candidate{'s' if g.candidates != 1 else ''}, {g.status})")


def _cached_mode(cached: dict) -> str:
    """The timing mode of the verdict that accepted a reused artifact (its manifest's evidence)."""
    try:
        return str(json.loads(Path(cached["manifest"]).read_text())["evidence"].get("mode") or "")
    except (OSError, KeyError, TypeError, AttributeError, UnicodeDecodeError, json.JSONDecodeError):
        return ""


def _replay_tried(cands: list) -> str:
    """'; tilesmith's replay was rejected at ...' when the tuner's replay candidate was judged and lost."""
    from tilesmith.search.graphed import GRAPHED_LABEL, GRAPHED_OVER_INDUCTOR_LABEL

    lost = [c for c in cands if not c.accepted and c.label in (GRAPHED_LABEL, GRAPHED_OVER_INDUCTOR_LABEL)]
    if not lost:
        return ""
    c = lost[-1]
    at = f", {c.speedup:.3f}x" + (f" (lower bound {c.speedup_low:.3f}x)" if c.speedup_low else "") if c.speedup else ""
    return f"; tilesmith's replay was judged and rejected at {c.stage}{at}"


def program_setting(run_id: str, graphs: list, estimate) -> ProgramSetting:
    """The program's line over GraphReports whose `setting` is filled in; `estimate(graphs)` is the
    report's ProgramEstimate machinery (baseline_ms * seen), applied to the CUDA-graph graphs whose
    baseline is Inductor's replay as the gate timed it."""
    cg = [g for g in graphs if g.compile_mode == CUDAGRAPHS]
    count = lambda *w: sum(g.setting.winner in w for g in graphs)  # noqa: E731
    won, code = count("tilesmith-replay"), count("inductor-replay-of-tilesmith-code")
    kept, over = count("inductor-replay"), count("tilesmith-replay-over-launches")
    timed = [g for g in cg if g.baseline_mode == "graph"]
    est = estimate(timed) if timed else None
    if cg:
        text = (f"{len(cg)} of {len(graphs)} graph{'s' if len(graphs) != 1 else ''} compiled with CUDA graphs "
                f"(reduce-overhead or max-autotune): tilesmith's replay beat Inductor's on {won}")
        text += f", Inductor's replay of tilesmith's faster code won on {code}" if code else ""
        text += f", Inductor's replay stays on {kept}" if kept else ""
        if est is not None:
            text += (f"; over the {len(timed)} timed in Inductor's replay: {est.baseline_ms:.4f} ms -> "
                     f"{est.optimized_ms:.4f} ms, {est.speedup:.3f}x (>= {est.speedup_low:.3f}x), estimate")
    else:
        text = f"none of the {len(graphs)} graphs was compiled with CUDA graphs: Inductor's replay was not timed"
    if over:
        text += f"; tilesmith's replay took over the plain launches of {over} graph{'s' if over != 1 else ''}"
    wins = [g for g in graphs if g.setting.speedup]  # accepted here, or an installed artifact reused
    if not wins:
        change = "none: keep your compile mode; nothing to install"
    else:
        new = [g for g in wins if g.status != "cached"]
        load = "`import tilesmith.runtime` in the program (or TILESMITH_RUNTIME=1)"
        change = ("none to torch.compile: keep its mode; " +
                  (f"`tilesmith install {run_id}`, then {load}" if new else f"{load} (the artifacts are installed)"))
        if won:
            change += f"; the runtime turns Inductor's replay off for the {won} graph{'s' if won != 1 else ''} it replays itself"
    note = NOTE if any(g.setting.timed_in == "graph" or g.baseline_mode == "graph" for g in cg) else ""
    return ProgramSetting(len(graphs), len(cg), won, code, kept, over, est, text, change, note)


# How the gate times reduce-overhead's replay (gate/worker/setup.py op_time_setup, gate/worker/trees.py): never slower
# than Inductor's own code path in the program.
NOTE = ("reduce-overhead's replay, as the gate times it: against a candidate that replays itself, Inductor's code "
        "through its cudagraph trees, the inputs Inductor marked static read in place and the others copied in as "
        "in the program (every input static, nothing copied, where the capture has no marks); against "
        "any other candidate, the original and the candidate alike through the trees where the capture has the "
        "marks, else each replayed from a plain CUDA graph per input buffer set, inputs already in place, without "
        "the trees' host time, input copies and checks")
