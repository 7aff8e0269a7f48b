"""`tilesmith submit GRAPH_DIR CANDIDATE.py`"""

from __future__ import annotations

from pathlib import Path

import typer

from tilesmith_cli import console


def submit(
    graph_dir: Path = typer.Argument(..., help="The captured graph folder (workspace/graphs/<key>)."),
    candidate: Path = typer.Argument(..., help="Your rewritten wrapper (keeps call(args))."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Judge a hand-written wrapper with the full gate; record it as a run (install it with `tilesmith install RUN_ID`)."""
    from tilesmith.submit import submit as run_submit

    def go():
        if as_json:
            return run_submit(graph_dir, candidate)
        with console.err.status(f"gate: judging {candidate} against {graph_dir.name[:12]} ..."):
            return run_submit(graph_dir, candidate)

    result = console.run_guarded(go, as_json)
    if as_json:
        console.print_json(result)
    else:
        v = result.verdict
        timing = (v.get("confirmation") or v.get("first") or {}).get("timing") or {}
        if result.accepted:
            console.err.print(f"accepted: {timing.get('speedup', 0):.3f}x faster, lower bound "
                              f"{timing.get('speedup_low', 0):.3f}x; install with `tilesmith install {result.run_id}`",
                              markup=False)
        else:
            console.err.print(f"rejected at stage {v.get('stage')}:", markup=False)
            for r in v.get("reasons") or []:
                console.err.print(f"  {r.get('code')}: {r.get('message')}", markup=False)
        console.out.print(result.run_id)
    if not result.accepted:
        raise typer.Exit(1)
