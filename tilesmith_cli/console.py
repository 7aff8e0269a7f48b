"""Rendering and the one error boundary: `error: ...` + dim `hint: ...` (or JSON), exit codes."""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict, is_dataclass

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tilesmith import settings
from tilesmith.errors import TilesmithError

# Lines as long as their content where the output is not a terminal (a pipe, a file, a test's capture): a table
# folded to 80 columns split every graph key in two, and `grep`/`cut` on the output could not find one.
UNWRAPPED_WIDTH = 100_000


class _Console(Console):
    """rich's Console, unwrapped when its stream is not a terminal (COLUMNS is for terminals)."""

    @property
    def size(self):
        size = super().size
        return size if self.is_terminal else size._replace(width=UNWRAPPED_WIDTH)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


def to_jsonable(obj):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj):
        return asdict(obj)
    return obj


def print_json(obj) -> None:
    # Plain print (not rich) so JSON stays byte-exact for machines.
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, default=str) + "\n")


def fail(e: TilesmithError, as_json: bool = False) -> None:
    """Print a user error and exit 1."""
    if as_json:
        print_json(e.to_dict())
    else:
        # The library's text is plain: "[ray]" in `pip install 'tilesmith[ray]'` is no markup tag.
        err.print(f"[red]error:[/red] {escape(e.message)}", markup=True)
        if e.hint:
            err.print(f"[dim]hint: {escape(e.hint)}[/dim]", markup=True)
    raise typer.Exit(1)


def table(title: str | None, columns: list[str], rows: list[list]) -> Table:
    """A table whose first column (a graph key, a pass) is never folded, on a terminal too."""
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, overflow="fold", no_wrap=i == 0)
    for r in rows:
        t.add_row(*[("" if v is None else str(v)) for v in r])
    return t


def run_guarded(fn, as_json: bool = False, resume=None):
    """Call `fn`; TilesmithError -> exit 1 with hint; Ctrl-C -> 130; anything else -> one line + exit 1.
    `resume`: a function giving the command that carries on after Ctrl-C (None: nothing to carry on)."""
    try:
        return fn()
    except TilesmithError as e:
        fail(e, as_json)
    except KeyboardInterrupt:
        _forget_the_interrupt()
        how = resume() if resume is not None else None
        err.print("[yellow]interrupted[/yellow]: what was confirmed is saved" + (f"; `{how}` carries on" if how else ""),
                  markup=True)
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as e:  # a bug of ours: one line, the traceback on request
        if settings.current().debug:
            traceback.print_exc()
        else:
            err.print(f"[red]error:[/red] unexpected {type(e).__name__}: {e}", markup=True)
            err.print("[dim]hint: set TILESMITH_DEBUG=1 for the traceback[/dim]", markup=True)
        raise typer.Exit(1) from None


def _forget_the_interrupt() -> None:
    """Clear CPython's mark of an unhandled Ctrl-C: this one is handled, and the exit status is to be ours (130).

    CPython marks a KeyboardInterrupt unhandled whenever one leaves code that exec() or eval() ran from a string
    (Python/pythonrun.c, run_eval_code_obj), even when a caller catches it, and a process started as `python -m`
    and so marked ends by killing itself with SIGINT (status -2 to its parent, the message printed all the same).
    Such code runs all the time: every dataclass's generated methods, e.g. while torch._inductor is imported
    (2 of 20 Ctrl-Cs in the first second of `python -m tilesmith_cli.app optimize` landed there). A string that
    runs to its end clears the mark."""
    exec("")
