"""The agent's fast inner loop and its exploration tools, beside the full `evaluate`:

- check(path): static screen, load and correctness on every input set (the gate with
  Policy.correctness_only): seconds, never a decision;
- screen(paths): the attempts and the best source timed interleaved on the captured inputs, one
  worker, no confirmation (tilesmith.search.measure.screen, the tuner's screen);
- ideas(ideas): the turn's plan, 3-5 ideas with the gain each one's roofline allows; the most
  promising get this turn's attempt files, one each, so subagents never share a file;
- finish(reason): nothing more is worth trying on this graph: the track ends after this turn.

Every GPU measurement (check, screen, evaluate, profile, and shell commands that run Python or a
profiler) holds the run's timing lock, the one the optimize driver's gate holds: measurements never
overlap, across tracks or across parallel subagents.
"""

from __future__ import annotations

import json
from pathlib import Path

from langchain_core.tools import tool
from pydantic import BaseModel, Field

from tilesmith.errors import TilesmithError
from tilesmith.search.agent.ledger import resolve, sha, virtual


class Idea(BaseModel):
    idea: str = Field(description="what to change, concretely (kernels, buffers, calls)")
    max_gain: float = Field(description="the speedup of the whole call its roofline allows, e.g. 1.3 for 30 %")
    why: str = Field(default="", description="the bound: bytes or FLOPs at the measured ceiling vs the time now")


def _judge(state, path: Path, settings, **policy):
    from tilesmith.gate import judge
    from tilesmith.gate.verdict import Policy

    pol = Policy(min_improvement=settings.min_improvement, seed=50_000 + state.evaluations, confirm=False,
                 allow_nonfinite_differences=getattr(settings, "allow_nonfinite_differences", False), **policy)
    if settings.gate_time_budget_s:
        pol.time_budget_s = settings.gate_time_budget_s
    state.track.restore_best()  # the shell could have rewritten the timing baseline
    best = state.track.dir / "best.py"
    pol.timing_baseline = str(best) if best.exists() else None
    state.evaluations += 1
    with state.timing_lock:
        return judge(state.track.graph_dir, path, pol)


def _path(state, vpath: str | None) -> Path:
    return resolve(state.track.dir, vpath) if vpath else state.attempt


def _check_summary(v) -> str:
    if not v.reasons:
        return "ok"
    return "failed: " + ", ".join(dict.fromkeys(r.code for r in v.reasons))


def _check(state, settings, path: str) -> str:
    """The `check` tool: correctness only (the gate with Policy.correctness_only), recorded in the ledger."""
    try:
        p = _path(state, path)
        text = p.read_text()
        v = _judge(state, p, settings, correctness_only=True)
    except ValueError as e:
        return f"check: {e}"
    except TilesmithError as e:
        return json.dumps({"error": e.message, "hint": e.hint})
    vp = virtual(state.track.dir, p)
    state.ledger.update(vp, check=_check_summary(v), check_sha=sha(text))
    sets = [{"set": c.name, "ok": c.ok, "max_rel_error": c.max_rel_error} for c in (v.first.correctness if v.first else [])]
    return json.dumps({"file": vp, "ok": not v.reasons, "stage": v.stage,
                       "reasons": [r.to_dict() for r in v.reasons], "sets": sets, "seconds": round(v.wall_s, 1)})


def _screen(state, paths: list[str]) -> str:
    """The `screen` tool: the attempts and the best source timed interleaved, recorded in the ledger."""
    from tilesmith.search.measure import screen as run_screen

    try:
        files = [resolve(state.track.dir, p) for p in paths]
    except ValueError as e:
        return f"screen: {e}"
    if not files:
        return "screen: name at least one attempt file"
    texts = [f.read_text() for f in files]
    with state.timing_lock:
        res = run_screen(state.track.graph_dir, [("best", state.track.best_text)] +
                         [(virtual(state.track.dir, f), t) for f, t in zip(files, texts)],
                         budget_s=state.screen_budget_s)
    best = res[0].median_ms
    lines = [f"best so far: {best:.4f} ms" if best else f"best so far: failed ({res[0].error})"]
    for r, t in zip(res[1:], texts):
        if r.median_ms is None:
            lines.append(f"{r.label}: failed: {r.error}")
            continue
        state.ledger.update(r.label, screened_ms=r.median_ms, best_ms=best, screen_sha=sha(t))
        vs = f", {best / r.median_ms:.3f}x vs best" if best else ""
        lines.append(f"{r.label}: {r.median_ms:.4f} ms ({len(r.samples_ms)} samples){vs}")
    return "\n".join(lines)


def _assign_ideas(state, ideas: list[Idea]) -> str:
    """The `ideas` tool: the most promising ideas get this turn's attempt files, one each, in the ledger."""
    ranked = sorted(ideas, key=lambda i: -i.max_gain)
    out = []
    for i, idea in enumerate(ranked):
        if i < len(state.attempts):
            vp = virtual(state.track.dir, state.attempts[i])
            state.ledger.row(vp, state.turn)
            state.ledger.update(vp, idea=idea.idea, max_gain=idea.max_gain)
            out.append(f"{vp}: {idea.idea} (up to {idea.max_gain:g}x: {idea.why})")
        else:
            out.append(f"(no file this turn) {idea.idea} (up to {idea.max_gain:g}x)")
    if len(ideas) < 3:
        out.append("Fewer than 3 ideas: if that is all the roofline leaves, say so; if nothing is worth "
                   "trying, call finish.")
    return "Assigned:\n" + "\n".join(out)


def make_inner_tools(state, settings) -> list:
    """`state` (agent._TrackState): the track, this turn's attempt files, the ledger, the timing lock."""

    @tool
    def check(path: str = "") -> str:
        """Fast check of one attempt file (default: your current attempt): static screen, load, and
        correctness of every output on the captured inputs and random input sets, against the gate's
        tolerances. No timing, never a decision. Use it after every edit, before screen or evaluate."""
        return _check(state, settings, path)

    @tool
    def screen(paths: list[str]) -> str:
        """Time several attempt files against the best source so far, interleaved in one worker on the
        captured inputs (a few seconds; medians of raw samples). A screen, not a verdict: at the end of
        the turn the host judges the fastest screened attempt that passed its check."""
        return _screen(state, paths)

    @tool
    def ideas(ideas: list[Idea]) -> str:
        """Record this turn's plan: 3-5 ideas, each with the speedup its roofline allows (max_gain) and
        why. The most promising get this turn's attempt files, one file per idea; give each to its own
        subagent with `task` (naming the file) or work on it yourself. Returns the assignment."""
        return _assign_ideas(state, ideas)

    @tool
    def finish(reason: str) -> str:
        """Declare that nothing more is worth trying on this graph (say why: e.g. every kernel is at its
        roofline, or the remaining time is launch overhead the timing mode already removes). The track
        ends after this turn; an attempt you changed this turn is still judged."""
        state.finished = reason.strip() or "the agent found nothing more worth trying"
        return "Noted: the track ends after this turn."

    for t in (check, screen, ideas, finish):
        t.handle_tool_error = True
    return [check, screen, ideas, finish]
