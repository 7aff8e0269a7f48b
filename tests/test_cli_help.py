"""The README's commands exist and document themselves: every `tilesmith X` the README shows has --help."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from tilesmith_cli.app import app

README = Path(__file__).resolve().parent.parent / "README.md"
runner = CliRunner()


def test_every_command_the_readme_shows_exists_and_has_help():
    shown = set(re.findall(r"^tilesmith (\w+)", README.read_text(), re.M))
    assert {"capture", "optimize", "report", "install", "validate", "submit", "replay", "installed"} <= shown
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for cmd in sorted(shown):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0, (cmd, r.output)
        assert cmd in top.output and "Usage" in r.output


def test_an_unknown_option_is_a_usage_error_with_exit_2():
    r = runner.invoke(app, ["optimize", "--no-such-option"])
    assert r.exit_code == 2
