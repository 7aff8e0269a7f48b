"""The artifact store: atomic, locked, evidence-ordered writes; list, resolve, remove."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tilesmith import paths, store
from tilesmith.errors import TilesmithError

KEY = "ab" * 32
ENV = {"torch": "2.13.0+cpu", "triton": None, "gpu": None, "machine": "x86_64", "numerics": {}}


def ev(low: float) -> store.Evidence:
    return store.Evidence(speedup=low + 0.1, speedup_low=low, speedup_high=low + 0.2, mode="launch", samples=20)


def put(data: bytes, low: float, **kw) -> store.PutResult:
    return store.put(KEY, data, kind="forward", environment=ENV, evidence=ev(low),
                     provenance={"optimizer": "manual", "run_id": "r1"}, **kw)


def test_put_writes_the_artifact_and_a_manifest_whose_sha256_matches_it():
    r = put(b"def call(args):\n    return ()\n", 1.5)
    assert r.action == "installed"
    data = store.artifact_path(KEY).read_bytes()
    m = json.loads(store.manifest_path(KEY).read_text())
    assert data == b"def call(args):\n    return ()\n"
    assert m["sha256"] == store.sha256_bytes(data) and m["key"] == KEY
    assert m["environment"] == ENV and len(m["environment_id"]) == 16
    assert m["evidence"]["speedup_low"] == 1.5 and m["provenance"]["optimizer"] == "manual"
    assert store.verify(KEY) == ""
    assert not [p for p in paths.home().rglob("*.tmp")]


def test_put_keeps_the_installed_artifact_when_the_new_evidence_is_not_better():
    put(b"first", 1.5)
    r = put(b"second", 1.4)
    assert r.action == "kept" and "as good or better" in r.reason
    assert store.artifact_path(KEY).read_bytes() == b"first"
    assert put(b"first", 9.0).action == "kept"  # same bytes again: nothing to do


def test_put_replaces_a_worse_artifact_when_the_evidence_is_better_or_forced():
    put(b"first", 1.5)
    assert put(b"second", 1.6).action == "replaced"
    assert store.artifact_path(KEY).read_bytes() == b"second"
    assert put(b"third", 1.0, force=True).action == "replaced"
    assert store.get(KEY).sha256 == store.sha256_bytes(b"third")


def test_dry_run_says_what_would_happen_and_changes_nothing():
    r = put(b"first", 1.5, dry_run=True)
    assert r.action == "would-install"
    assert store.get(KEY) is None and not store.artifact_path(KEY).exists()


def test_concurrent_installs_of_one_key_from_several_processes_leave_the_best_artifact_consistent(tmp_path):
    # Eight real processes race on one key, each with its own source and evidence; the lock must
    # serialize them so the store ends with the best one and a manifest that matches its bytes.
    go = tmp_path / "go"
    code = textwrap.dedent(f"""
        import os, sys, time
        from tilesmith import store
        i = int(sys.argv[1])
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        for rep in range(5):
            store.put({KEY!r}, (f"source {{i}} " * 2000).encode(), kind="forward", environment={ENV!r},
                      evidence=store.Evidence(1.0 + i / 10, 1.0 + i / 10, 1.2 + i / 10, "launch"),
                      provenance={{"run_id": str(i)}})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], env=os.environ.copy()) for i in range(8)]
    go.write_text("")
    assert all(p.wait(timeout=120) == 0 for p in procs)
    m = store.get(KEY)
    assert m.provenance["run_id"] == "7"
    assert store.artifact_path(KEY).read_bytes() == ("source 7 " * 2000).encode()
    assert store.verify(KEY) == ""
    assert not [p for p in paths.home().rglob("*.tmp")]


def test_list_resolve_and_remove_work_by_key_prefix():
    put(b"x", 1.5)
    other = "cd" * 32
    store.put(other, b"y", kind="backward", environment=ENV, evidence=ev(1.2), provenance={})
    assert {m.key for m in store.list_installed()} == {KEY, other}
    assert store.resolve("ab") == KEY
    with pytest.raises(TilesmithError, match="matches 0"):
        store.resolve("ef")
    assert store.remove(KEY) is True
    assert not store.manifest_path(KEY).exists() and not store.artifact_path(KEY).exists()
    assert store.remove_all() == [other]
    assert store.list_installed() == []


def test_verify_reports_an_artifact_modified_after_install():
    put(b"x", 1.5)
    store.artifact_path(KEY).write_bytes(b"x = 1  # edited")
    assert "do not match" in store.verify(KEY)


def test_put_refuses_a_string_that_is_not_a_graph_key():
    with pytest.raises(TilesmithError, match="not a graph key"):
        store.put("../../etc/passwd", b"x", kind="forward", environment=ENV, evidence=ev(1.5), provenance={})


def test_a_revoked_artifact_is_gone_and_the_store_keeps_why_and_installed_lists_it():
    from typer.testing import CliRunner

    from tilesmith_cli.app import app

    put(b"x", 1.5)
    assert store.revoke(KEY, "call 7 checked against Inductor's code: output 0 differs") is True
    assert store.get(KEY) is None and not store.artifact_path(KEY).exists()
    assert [(r["key"], r["reason"][:7]) for r in store.revoked()] == [(KEY, "call 7 ")]
    assert store.revoke(KEY, "again") is False and len(store.revoked()) == 1  # nothing installed: nothing recorded
    r = CliRunner().invoke(app, ["installed"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "removed after a failed check" in r.stdout and KEY[:12] in r.stdout
    assert "output 0 differs" in r.stdout
