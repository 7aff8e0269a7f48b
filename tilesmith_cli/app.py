"""The typer app: registration only; each command lives in tilesmith_cli/commands/<name>.py."""

from __future__ import annotations

import typer

from tilesmith_cli.commands import capture, optimize, replay
from tilesmith_cli.commands import install, installed, submit, uninstall
from tilesmith_cli.commands import report
from tilesmith_cli.commands import validate

app = typer.Typer(
    name="tilesmith",
    help="Make the code TorchInductor generates faster, with proof.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from tilesmith_cli.version import version

        typer.echo(f"tilesmith {version()}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print tilesmith's version and exit."),
) -> None:
    """Make the code TorchInductor generates faster, with proof."""


app.command("capture", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(capture.capture)
app.command("replay")(replay.replay)
app.command("optimize")(optimize.optimize)
app.command("report")(report.report)
app.command("submit")(submit.submit)
app.command("install")(install.install)
app.command("installed")(installed.installed)
app.command("uninstall")(uninstall.uninstall)
app.command("validate")(validate.validate)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
