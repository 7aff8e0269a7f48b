"""The documentation a user reads: every setting the code reads is documented, no development diary ("session 17")
in the product's text or the CLI's help, and every relative link in it leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from tilesmith_cli.app import app

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_TEXT = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "RESULTS.md",
                *sorted((ROOT / "docs").glob("*.md"))]
DIARY = re.compile(r"\bsessions? \d|\bsession-\d", re.I)


def _variables_read() -> set[str]:
    found = set()
    for folder in ("tilesmith", "tilesmith_cli", "examples"):
        for f in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r"\bTILESMITH_[A-Z0-9_]*[A-Z0-9]\b", f.read_text()))
    return found


def test_every_tilesmith_variable_the_code_reads_is_in_docs_settings():
    documented = set(re.findall(r"`(TILESMITH_[A-Z0-9_]+)`", (ROOT / "docs" / "settings.md").read_text()))
    read = _variables_read()
    assert {"TILESMITH_HOME", "TILESMITH_RUNTIME_QUIET", "TILESMITH_MIN_IMPROVEMENT"} <= read
    assert read - documented == set(), sorted(read - documented)


def test_no_development_session_numbers_in_the_docs_or_the_cli_help():
    for f in PRODUCT_TEXT:
        hits = [line for line in f.read_text().splitlines() if DIARY.search(line)]
        assert hits == [], (f.name, hits[:3])
    runner = CliRunner()
    for args in [["--help"], *([c.name, "--help"] for c in app.registered_commands)]:
        r = runner.invoke(app, args)
        assert r.exit_code == 0 and not DIARY.search(r.stdout), (args, r.stdout)


def test_every_relative_link_in_the_docs_leads_to_a_file_that_exists():
    for f in PRODUCT_TEXT + [ROOT / "benchmarks" / "RESULTS-history.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", f.read_text()):
            if "://" in target:
                continue
            assert (f.parent / target).exists(), (f.name, target)
