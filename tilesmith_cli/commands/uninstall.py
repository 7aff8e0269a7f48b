"""`tilesmith uninstall KEY|--all`"""

from __future__ import annotations

import typer

from tilesmith_cli import console


def uninstall(
    key: str = typer.Argument(None, help="The graph key (a unique prefix) of the artifact to remove."),
    all_: bool = typer.Option(False, "--all", help="Remove every installed artifact."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Remove installed artifacts; the runtime uses Inductor's code for those graphs again."""
    from tilesmith import store
    from tilesmith.errors import TilesmithError

    def go():
        if all_ == bool(key):
            raise TilesmithError("give a KEY or --all (not both)", code="usage",
                                 hint="`tilesmith installed` lists the keys")
        if all_:
            return store.remove_all()
        k = store.resolve(key)
        store.remove(k)
        return [k]

    removed = console.run_guarded(go, as_json)
    if as_json:
        console.print_json({"removed": removed})
        return
    for k in removed:
        console.out.print(f"removed {k[:12]}")
    if not removed:
        console.out.print("nothing was installed")
