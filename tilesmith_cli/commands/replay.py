"""`tilesmith replay GRAPH_DIR...`"""

from __future__ import annotations

from pathlib import Path

import typer

from tilesmith_cli import console


def replay(
    graph_dirs: list[Path] = typer.Argument(..., help="Captured graph folders (workspace/graphs/<key>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Load captured wrappers in a fresh process, call them on the captured inputs, compare outputs."""
    from tilesmith.capture.rerun import rerun

    results = console.run_guarded(lambda: [rerun(d) for d in graph_dirs], as_json)
    if as_json:
        console.print_json([r.to_dict() for r in results])
    else:
        rows = [[r.key[:12], "match" if r.ok else "MISMATCH", "bitwise" if r.bitwise else f"{r.max_abs_error:.3g}",
                 "; ".join(r.problems)] for r in results]
        console.out.print(console.table(None, ["graph", "result", "max abs error", "problems"], rows))
    if not all(r.ok for r in results):
        raise typer.Exit(1)
