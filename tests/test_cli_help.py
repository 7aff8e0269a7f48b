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


def test_version_prints_the_installed_version_and_exits_0():
    from importlib import metadata

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"tilesmith {metadata.version('tilesmith')}\n" and r.stderr == ""


def test_version_falls_back_to_pyproject_where_tilesmith_was_never_installed():
    import tomllib

    from tilesmith_cli.version import PYPROJECT, version

    want = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert version("tilesmith-never-installed") == want and version() == want  # the checkout is what is installed
