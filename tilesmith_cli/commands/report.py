"""`tilesmith report`"""

from __future__ import annotations

from pathlib import Path

import typer

from tilesmith_cli import console


def report(
    run_id: str = typer.Argument(None, help="The run (a unique prefix is enough); default: the newest."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    html: Path = typer.Option(None, "--html", help="Also write a self-contained HTML page with charts here."),
) -> None:
    """What a run found: per graph speedup and candidates, kernel times, the whole-program estimate."""
    from tilesmith.errors import TilesmithError
    from tilesmith.report import build_report
    from tilesmith.report.html import render_html

    def go():
        r = build_report(run_id)
        if html is not None:
            try:
                html.write_text(render_html(r), encoding="utf-8")
            except OSError as e:
                raise TilesmithError(f"cannot write {html}: {e}", code="write-failed") from None
        return r

    r = console.run_guarded(go, as_json)
    if as_json:
        console.print_json(r)
        return
    _render(r)
    if html is not None:
        console.err.print(f"wrote {html}")


def _render(r) -> None:
    out = console.out
    out.print(f"run {r.run_id} ({r.status}), optimizer {r.optimizer or '?'}, workspace {r.workspace or '?'}")
    from tilesmith.report import agent_budgets
    from tilesmith.report.rows import BANDWIDTH_COLUMN, BANDWIDTH_NOTE, rate_text

    if agent_budgets(r.settings):
        out.print(agent_budgets(r.settings))
    for n in r.notes:
        out.print(f"[yellow]note:[/yellow] {n}", markup=True)
    rows = [[g.key[:12], g.kind, _elig(g), g.status, _f(g.baseline_ms, 4), _f(g.best_ms, 4), _speedup(g), g.loops_done,
             g.candidates, ", ".join(f"{k} {v}" for k, v in sorted(g.rejected_by_stage.items())) or "-",
             "-" if g.model_calls is None else g.model_calls] for g in r.graphs]
    out.print(console.table("graphs (ms per call)", ["graph", "kind", "eligible", "status", "baseline", "best",
                                                     "speedup [interval]", "loops", "tried", "rejected", "model calls"], rows))
    kernels = [(g, k) for g in r.graphs for k in g.top_kernels[:3]]
    rows = [[g.key[:12], k.name, k.kind, k.calls, f"{k.time_ms:.4f}", f"{100 * k.share:.1f}%",
             rate_text(k.gbps, k.bw_frac, True), rate_text(k.tflops, k.flop_frac), k.klass or "-", _f(k.headroom_ms, 4), k.tried or "-"]
            for g, k in kernels]
    if rows:
        out.print(console.table("top kernels (baseline profile)", ["graph", "kernel", "kind", "calls", "ms", "share",
                                                                   BANDWIDTH_COLUMN, "TFLOP/s (of peak)", "class",
                                                                   "headroom ms", "the tuner tried"], rows))
    if any((k.bw_frac or 0) > 1 for _, k in kernels):
        out.print(f"[dim]{BANDWIDTH_NOTE}[/dim]", markup=True)
    for g in r.graphs:
        if g.profile_class:
            gap = f", device idle between kernels {g.gap_ms:.4f} ms/call" if g.gap_ms is not None else ""
            out.print(f"[dim]{g.key[:12]}: {g.profile_class}-bound{gap}; ceilings {g.ceilings}; {g.counters}[/dim]",
                      markup=True)
    rows = [[c.key[:12], c.label[:60], c.stage, c.why] for c in r.candidates if not c.accepted and c.why][:10]
    if rows:
        out.print(console.table("rejections (first reason)", ["graph", "candidate", "stage", "why"], rows))
    for g in r.graphs:
        for n in g.notes:
            out.print(f"[yellow]note:[/yellow] {g.key[:12]}: {n}", markup=True)
    _setting(r)
    p = r.program
    if p is None:
        out.print("whole program: no graph has a baseline measurement")
    else:
        out.print(f"whole program (estimate): {p.baseline_ms:.4f} ms -> {p.optimized_ms:.4f} ms, {p.speedup:.3f}x "
                  f"(>= {p.speedup_low:.3f}x); {p.graphs_improved} of {p.graphs_measured} graph(s) improved")
        out.print(f"[dim]{p.note}[/dim]", markup=True)
    accepted = sum(c.accepted for c in r.candidates)
    out.print(f"candidates judged: {len(r.candidates)}, accepted: {accepted}")
    levels = sorted({c.sandbox or "unrecorded" for c in r.candidates})
    if levels:
        out.print("sandbox: " + ", ".join(f"{lv} ({sum((c.sandbox or 'unrecorded') == lv for c in r.candidates)})"
                                          for lv in levels))


def _setting(r) -> None:
    """Per graph its compile mode and who replays it, then the program's line and the change to make."""
    out = console.out
    for g in r.graphs:
        if g.setting is not None:
            out.print(f"setting {g.key[:12]} ({g.compile_mode or '?'}, {g.device or '?'}): {g.setting.statement}",
                      markup=False)
    if r.setting is not None:
        out.print(f"setting, program: {r.setting.statement}", markup=False)
        out.print(f"change: {r.setting.change}", markup=False)
        if r.setting.note:
            out.print(f"note: {r.setting.note}", style="dim", markup=False)


def _elig(g) -> str:
    return "?" if g.eligible is None else ("yes" if g.eligible else f"no: {g.ineligible_reason}")


def _speedup(g) -> str:
    return "-" if g.speedup is None else f"{g.speedup:.3f}x [{_f(g.speedup_low)}, {_f(g.speedup_high)}]"


def _f(v, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
