"""`tilesmith install [RUN_ID]`"""

from __future__ import annotations

import typer

from tilesmith_cli import console


def install(
    run_id: str = typer.Argument(None, help="The run whose accepted sources to install (a unique prefix; default: the newest)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change nothing."),
    force: bool = typer.Option(False, "--force", help="Replace installed artifacts even when their evidence is better."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Put a run's gate-accepted sources into the artifact store (the runtime loads them)."""
    from tilesmith.install import install as run_install

    result = console.run_guarded(lambda: run_install(run_id, dry_run=dry_run, force=force), as_json)
    if as_json:
        console.print_json(result)
        return
    rows = [[g.key[:12], g.kind, _x(g.speedup), _interval(g), g.status, g.reason] for g in result.graphs]
    title = f"run {result.run_id}" + (" (dry run: nothing changed)" if dry_run else "")
    console.out.print(console.table(title, ["graph", "kind", "speedup", "interval", "result", "why"], rows))
    n = len(result.installed)
    console.err.print(f"{n} artifact(s) installed" if not dry_run else "dry run", markup=False)
    if result.native:
        console.err.print(f"CUDA-graph replay's address check in C: {result.native}", markup=False)


def _x(v) -> str:
    return "" if v is None else f"{v:.3f}x"


def _interval(g) -> str:
    return "" if g.speedup_low is None else f"[{g.speedup_low:.3f}, {g.speedup_high:.3f}]"
