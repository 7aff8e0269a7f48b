"""`tilesmith install / installed / uninstall / submit` through the real typer app."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.test_install import KEY, SRC, make_run
from tilesmith import store
from tilesmith_cli.app import app

runner = CliRunner()


def test_install_prints_a_table_with_speedup_interval_and_result(tmp_path):
    rid = make_run(tmp_path)
    r = runner.invoke(app, ["install", rid[:12]])
    assert r.exit_code == 0, r.output
    assert KEY[:12] in r.stdout and "installed" in r.stdout and "1.350x" in r.stdout and "[1.300" in r.stdout
    assert store.artifact_path(KEY).read_text() == SRC


def test_install_json_and_dry_run_change_nothing(tmp_path):
    make_run(tmp_path)
    r = runner.invoke(app, ["install", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["dry_run"] is True and d["graphs"][0]["status"] == "would-install"
    assert store.get(KEY) is None


def test_install_without_runs_is_an_error_with_a_hint():
    r = runner.invoke(app, ["install"])
    assert r.exit_code == 1
    assert "error: no runs" in r.stderr and "hint:" in r.stderr


def test_installed_lists_key_kind_speedup_environment_and_provenance_then_uninstall_removes(tmp_path):
    rid = make_run(tmp_path)
    runner.invoke(app, ["install", rid])
    r = runner.invoke(app, ["installed"])
    assert r.exit_code == 0, r.output
    for text in (KEY[:10], "forward", "1.350x", "torch", "ok"):  # cells wrap at 80 columns
        assert text in r.stdout, text
    j = json.loads(runner.invoke(app, ["installed", "--json"]).stdout)
    assert [m["key"] for m in j] == [KEY] and j[0]["problem"] == ""
    assert j[0]["environment"]["torch"] == "2.13.0+cpu" and j[0]["provenance"]["optimizer"] == "tuner"
    r = runner.invoke(app, ["uninstall", KEY[:8]])
    assert r.exit_code == 0 and f"removed {KEY[:12]}" in r.stdout
    assert store.get(KEY) is None and json.loads(runner.invoke(app, ["installed", "--json"]).stdout) == []


def test_uninstall_needs_a_key_or_all_and_all_removes_everything(tmp_path):
    runner.invoke(app, ["install", make_run(tmp_path)])
    r = runner.invoke(app, ["uninstall"])
    assert r.exit_code == 1 and "give a KEY or --all" in r.stderr
    r = runner.invoke(app, ["uninstall", "ffff"])
    assert r.exit_code == 1 and "matches 0 installed artifacts" in r.stderr
    r = runner.invoke(app, ["uninstall", "--all", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"removed": [KEY]}


def test_submit_of_a_folder_that_is_not_a_captured_graph_is_an_error(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(SRC)
    r = runner.invoke(app, ["submit", str(tmp_path), str(cand)])
    assert r.exit_code == 1 and "not a captured graph" in r.stderr
