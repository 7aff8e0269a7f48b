"""`tilesmith validate GRAPH_DIR CANDIDATE.py`: exit 0 accepted, 1 rejected, 2 usage error."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from tilesmith.errors import TilesmithError
from tilesmith_cli import console

USAGE_CODES = ("usage", "no-graph", "no-candidate")


class Mode(str, Enum):
    auto = "auto"
    launch = "launch"
    graph = "graph"


def validate(
    graph_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A captured graph: <workspace>/graphs/<key>."),
    candidate: Path = typer.Argument(..., exists=True, dir_okay=False, help="The candidate wrapper (defines call(args))."),
    mode: Mode = typer.Option(Mode.auto, "--mode", help="Timing: launch (back-to-back calls) or graph (CUDA-graph replay)."),
    min_improvement: float = typer.Option(None, "--min-improvement", min=0.0, max=10.0,
                                          help="Required speedup margin (default: TILESMITH_MIN_IMPROVEMENT, else 0.02)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random input sets."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite-differences",
                                         help="Accept NaN/inf placed unlike the original's on the special-value input "
                                              "sets (NaN, inf, extreme magnitudes); recorded in the verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Prove a candidate wrapper correct and faster than the original, or say why not."""
    from tilesmith.gate import Policy, judge

    policy = Policy(mode=mode.value, seed=seed, allow_nonfinite_differences=allow_nonfinite)
    if min_improvement is not None:
        policy.min_improvement = min_improvement

    def go():
        try:
            if as_json:
                return judge(graph_dir, candidate, policy)
            with console.err.status("validating ...") as status:
                return judge(graph_dir, candidate, policy, on_progress=lambda s, m: status.update(f"{s}: {m}"))
        except TilesmithError as e:
            if e.code not in USAGE_CODES:
                raise
            _usage(e, as_json)

    v = console.run_guarded(go, as_json)
    if as_json:
        console.print_json(v)
    else:
        _render(v)
    raise typer.Exit(0 if v.accepted else 1)


def _usage(e, as_json: bool) -> None:
    """Bad arguments (not a captured graph, a mode the graph cannot run in): exit 2, not 1 (rejected)."""
    if as_json:
        console.print_json(e.to_dict())
    else:
        console.err.print(f"[red]error:[/red] {e.message}", markup=True)
        if e.hint:
            console.err.print(f"[dim]hint: {e.hint}[/dim]", markup=True)
    raise typer.Exit(2)


def _both(t) -> str:
    """The two comparisons behind the speedup: the original in its own worker, and in the candidate's."""
    if not t.beside_speedup:
        return "-"
    return f"{t.apart_speedup:.3f}x ({t.apart_low:.3f}) / {t.beside_speedup:.3f}x ({t.beside_low:.3f})"


def _render(v) -> None:
    rows = []
    for label, p in (("first", v.first), ("confirmation", v.confirmation)):
        if p is None:
            continue
        for c in p.correctness:
            ref = "" if c.ref64_candidate_abs_error is None else \
                f"{c.ref64_candidate_abs_error:.2g} (original {c.ref64_original_abs_error:.2g})"
            rows.append([label, c.name, "ok" if c.ok else "FAIL", f"{c.max_abs_error:.3g}", f"{c.max_rel_error:.3g}", ref])
    if rows:
        console.out.print(console.table("correctness", ["pass", "input set", "result", "max abs err", "max rel err",
                                                        "err vs float64"], rows))
    trows = [[label, t.mode, f"{t.baseline_ms:.4f}", f"{t.candidate_ms:.4f}", f"{t.speedup:.3f}x",
              f"[{t.speedup_low:.3f}, {t.speedup_high:.3f}]", _both(t), t.samples]
             for label, p in (("first", v.first), ("confirmation", v.confirmation)) if p and (t := p.timing)]
    if trows:
        console.out.print(console.table("timing", ["pass", "mode", "original ms", "candidate ms", "speedup",
                                                   "one-sided bounds", "apart / beside (lower bounds)",
                                                   "paired samples"], trows))
    idle = [f"{label} {t.idle_cpu_ms:.0f} ms in {t.idle_wall_ms:.0f} ms"
            for label, p in (("first", v.first), ("confirmation", v.confirmation)) if p and (t := p.timing) and t.idle_wall_ms]
    if idle:  # an honest worker is idle then (background-work: timing.IDLE_CPU_SHARE)
        console.out.print("idle CPU of the candidate's worker while the original was timed apart: " + "; ".join(idle),
                          markup=False)
    for w in v.warnings:
        console.err.print(f"[yellow]warning:[/yellow] {w.code}: {w.message}", markup=True)
    head = "[green]ACCEPTED[/green]" if v.accepted else f"[red]REJECTED[/red] at {v.stage}"
    console.out.print(f"{head} ({v.wall_s:.1f} s; candidate sha256 {v.candidate_sha256[:12]}, graph {v.graph_key[:12]})",
                      markup=True)
    console.out.print(f"sandbox: {v.sandbox or 'unrecorded'}", markup=False)
    if v.allow_nonfinite_differences:
        console.out.print("judged with --allow-nonfinite-differences", markup=False)
    for r in v.reasons:
        console.out.print(f"  {r.code}: {r.message}", markup=False)
