"""`tilesmith capture SCRIPT [-- ARGS...]`"""

from __future__ import annotations

from pathlib import Path

import typer

from tilesmith import paths
from tilesmith_cli import console


def capture(
    ctx: typer.Context,
    script: Path = typer.Argument(..., help="The Python script to run, unmodified."),
    workspace: Path = typer.Option(Path("tilesmith-workspace"), "--workspace", "-w", help="Where to write the graphs."),
    force: bool = typer.Option(False, "--force", help="Replace an existing workspace."),
    append: bool = typer.Option(False, "--append", help="Add to an existing workspace."),
    max_input_bytes: int = typer.Option(2 * 1024**3, help="Budget for stored first-call inputs (storages counted once)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run SCRIPT as __main__ (its own args after --) and dump every graph Inductor produces."""
    from tilesmith.capture import capture as run_capture

    argv = list(ctx.args)

    def go():
        if as_json:
            return run_capture(script, argv, workspace, force=force, append=append, max_input_bytes=max_input_bytes)
        with console.err.status(f"running {script} under capture ...") as status:
            def on_graph(info):
                status.update(f"running {script}: {info.kind} graph {info.short} captured")

            return run_capture(script, argv, workspace, force=force, append=append,
                               max_input_bytes=max_input_bytes, on_graph=on_graph)

    result = console.run_guarded(go, as_json)
    ws = result.workspace
    if as_json:
        console.print_json(result)
    else:
        rows = [[g.short, g.kind, g.device, g.compile_mode, _kernels(g.kernels),
                 "yes" if g.eligible else f"no: {g.reason}"] for g in ws.graphs]
        console.out.print(console.table(f"{len(ws.graphs)} graph(s) in {paths.shown(ws.path)}",
                                        ["graph", "kind", "device", "mode", "kernels", "eligible"], rows))
    if result.script_error:
        console.err.print(f"[red]error:[/red] {script} raised; kept the {len(ws.graphs)} graph(s) captured before it:",
                          markup=True)
        console.err.print(result.script_error, markup=False)
        console.err.print("[dim]hint: run the script without tilesmith first to check it works[/dim]", markup=True)
        raise typer.Exit(1)


def _kernels(k: dict) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in k.items() if n) or "none"
