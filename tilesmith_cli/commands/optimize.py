"""`tilesmith optimize`"""

from __future__ import annotations

from pathlib import Path

import typer

from tilesmith_cli import console


def optimize(
    workspace: Path = typer.Option(Path("tilesmith-workspace"), "--workspace", "-w", help="The captured workspace."),
    optimizer: str = typer.Option("auto", help="tuner | agent | auto (the agent when a model is configured)."),
    agency: str = typer.Option("medium", help="low | medium | high: how far the agent may restructure."),
    loops: int = typer.Option(1, help="Accepted improvement cycles per graph."),
    max_model_calls: int = typer.Option(None, help="Exact model-call budget per graph (agent; default 150; 0: no limit)."),
    graph_minutes: float = typer.Option(None, help="Minutes the agent may spend per graph (default 45; 0: no limit)."),
    reasoning_effort: str = typer.Option(None, help="minimal | low | medium | high, sent to reasoning models (agent)."),
    context_window: int = typer.Option(None, help="The model's context window in tokens, if its provider does not say "
                                                  "(agent: shorter prompts, earlier summaries)."),
    warm_start: bool = typer.Option(True, "--warm-start/--no-warm-start",
                                    help="The agent starts after the built-in tuner (its best source and log)."),
    model: str = typer.Option(None, help="Model name (default: TILESMITH_MODEL)."),
    graphs: list[str] = typer.Option([], "--graphs", help="Only these graph keys (prefixes)."),
    max_minutes: float = typer.Option(None, help="Stop cleanly after this many minutes."),
    jobs: int = typer.Option(1, help="Graphs optimized at once (measurements never overlap)."),
    gpus: str = typer.Option(None, help="GPUs of this host to spread CUDA graphs over, one track per GPU at a "
                                        "time, e.g. 0,1,2,3 (default: every visible GPU)."),
    ray: str = typer.Option(None, help="Run each graph's track as a Ray task: a cluster's address, or `local` for "
                                       "one started here for the run (pip install 'tilesmith\\[ray]')."),
    ray_cpus: float = typer.Option(1.0, help="CPUs a CPU graph's Ray task asks for; its gate times on that many."),
    resume: str = typer.Option(None, help="Carry on with an interrupted run."),
    skills: list[Path] = typer.Option([], "--skills", help="Extra agent skill folders (SKILL.md inside, or folders of them)."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite-differences",
                                         help="The gate accepts NaN/inf placed unlike the original's on its special-value "
                                              "input sets; recorded in each verdict and the report."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Optimize each eligible graph with the tuner or the agent; the gate decides. Prints a run id."""
    from tilesmith.optimize import OptimizeSettings
    from tilesmith.optimize import optimize as run_optimize
    from tilesmith.scale.plan import parse_gpus

    settings = OptimizeSettings(optimizer=optimizer, agency=agency, loops=loops, max_model_calls=max_model_calls,
                                model=model, graphs=list(graphs), max_minutes=max_minutes, jobs=jobs,
                                skills=[str(p) for p in skills], graph_minutes=graph_minutes,
                                reasoning_effort=reasoning_effort, context_window=context_window, warm_start=warm_start,
                                allow_nonfinite_differences=allow_nonfinite, ray=ray, ray_cpus=ray_cpus)

    seen: dict = {"run_id": resume}

    def go():
        settings.gpus = parse_gpus(gpus)
        if as_json:
            return run_optimize(workspace, settings, resume=resume, on_event=_progress(None, seen))
        with console.err.status("starting ...") as status:
            return run_optimize(workspace, settings, resume=resume, on_event=_progress(status, seen))

    result = console.run_guarded(go, as_json, resume=lambda: seen["run_id"] and f"tilesmith optimize --resume {seen['run_id']}")
    if as_json:
        console.print_json(result)
    else:
        _render(result)
    if result.failed() or result.lost():
        raise typer.Exit(1)


def _progress(status, seen: dict):
    """The library's progress events: the run id kept in `seen` (for Ctrl-C's message), the rest shown on
    stderr unless `status` is None (--json)."""

    def on_event(kind, **kw):
        t = kw.get("track")
        if kind == "run":
            seen["run_id"] = kw["run_id"]
        if status is None:
            return
        if kind == "run":
            console.err.print(f"run {kw['run_id']}: {kw['graphs']} graph(s)")
        elif kind == "profile":
            status.update(f"profiling {kw['key'][:12]} ...")
        elif kind == "profile-failed":
            console.err.print(f"  {kw['key'][:12]}: baseline profile failed, the track runs without one: "
                              f"{kw['error'][:300]}")
        elif kind == "candidate":
            best = f", best {t.speedup:.3f}x" if t.speedup else ""
            status.update(f"{t.key[:12]}: loop {t.loops_done + 1}, candidate {t.candidates}{best}: judging {kw['label'][:60]}")
        elif kind == "accepted":
            console.err.print(f"  {t.key[:12]}: loop {t.loops_done} accepted, {t.speedup:.3f}x (>= {t.speedup_low:.3f}x)")
        elif kind == "track" and t.status not in ("running", "pending"):
            console.err.print(f"  {t.key[:12]}: {t.status}{': ' + t.reason if t.reason else ''}")

    return on_event


def _render(result) -> None:
    """The run's table, then what did not go as asked (failed graphs, an interrupted run) and what comes next."""
    rows = [[t.key[:12], t.kind, t.status, t.loops_done, t.candidates, _ms(t.baseline_ms), _ms(t.best_ms),
             f"{t.speedup:.3f}x (>= {t.speedup_low:.3f}x)" if t.speedup else "-"] for t in result.tracks]
    console.out.print(console.table(f"run {result.run_id} ({result.status})",
                                    ["graph", "kind", "status", "loops", "tried", "baseline", "best", "speedup"], rows))
    failed = result.failed()
    if failed:
        console.err.print(f"[red]error:[/red] {len(failed)} graph(s) failed, not for want of a faster candidate:",
                          markup=True)
        for t in failed:
            console.err.print(f"  {t.key[:12]}: {t.reason or 'no reason recorded'}", markup=False)
        console.err.print("[dim]hint: `tilesmith replay WORKSPACE/graphs/KEY` checks that a captured graph loads and "
                          "runs; `tilesmith capture --force` captures it again[/dim]", markup=True)
    lost = result.lost()
    if lost:
        console.err.print(f"[red]error:[/red] {len(lost)} graph(s) lost: their track's process or node died",
                          markup=True)
        for t in lost:
            console.err.print(f"  {t.key[:12]}: {t.reason or 'no reason recorded'}", markup=False)
        console.err.print(f"[dim]hint: `tilesmith optimize --resume {result.run_id}` runs exactly the unfinished "
                          "graphs again; what was accepted is kept[/dim]", markup=True)
    elif result.status == "interrupted":
        console.err.print(f"[yellow]interrupted[/yellow]: the time limit (--max-minutes) ended the run before every graph "
                          f"was done; `tilesmith optimize --resume {result.run_id}` carries on", markup=True)
    console.out.print(f"next: tilesmith report {result.run_id}  |  tilesmith install {result.run_id}")


def _ms(v):
    return f"{v:.4f} ms" if v else "-"
