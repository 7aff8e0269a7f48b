"""Runs on disk: runs/<run-id>/run.json and one track folder per graph.

A track (`runs/<run-id>/<key>/`) holds `attempts/attempt_00..04.py` (five rolling sources),
`profiles/` (every verdict and profile as JSON), and, once the gate accepted something,
`best.py` + `best.json` ({"key", "sha256" of best.py's bytes, "verdict": the gate's Verdict as a
dict, "graph_dir", "kind", "settings"}). Install trusts only best.json whose verdict is accepted and
whose sha256 still matches best.py.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import secrets
from pathlib import Path

from tilesmith import paths
from tilesmith.errors import TilesmithError
from tilesmith.workspace import atomic_write_text, write_json

ATTEMPTS = 5


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    """Sortable by time: 20261130-135102-3f9a."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def create_run(settings: dict, workspace: str, environment: dict, run_id: str | None = None) -> Path:
    rid = run_id or new_run_id()
    d = paths.run_dir(rid)
    d.mkdir(parents=True, exist_ok=False)
    write_json(d / "run.json", {"run_id": rid, "created": now_iso(), "ended": None, "status": "running",
                                "workspace": str(workspace), "settings": settings, "environment": environment,
                                "graphs": {}})
    return d


def load_run(run_id: str | None = None) -> dict:
    """run.json of `run_id` (a unique prefix is enough), or of the newest run when None."""
    root = paths.runs_dir()
    ids = sorted(p.name for p in root.iterdir() if (p / "run.json").exists()) if root.is_dir() else []
    if not ids:
        raise TilesmithError(f"no runs in {root}", code="no-runs", hint="run `tilesmith optimize` (or `tilesmith submit`) first")
    if run_id is None:
        rid = ids[-1]
    else:
        hits = [i for i in ids if i.startswith(run_id)]
        if len(hits) != 1:
            raise TilesmithError(f"run '{run_id}' matches {len(hits)} runs", code="run-not-found",
                                 hint=f"runs live in {root}; the newest is {ids[-1]}")
        rid = hits[0]
    try:
        return json.loads((root / rid / "run.json").read_text())
    except json.JSONDecodeError as e:
        raise TilesmithError(f"{root / rid / 'run.json'} is corrupt: {e}", code="corrupt-run") from None


def save_run(run: dict) -> None:
    write_json(paths.run_dir(run["run_id"]) / "run.json", run)


def track_dir(run_id: str, key: str) -> Path:
    return paths.run_dir(run_id) / key


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def record_best(run_id: str, key: str, source_text: str, verdict: dict, graph_dir: str, kind: str, settings: dict) -> Path:
    """Write best.py then best.json (last, so a crash between leaves no accepted record)."""
    t = track_dir(run_id, key)
    t.mkdir(parents=True, exist_ok=True)
    atomic_write_text(t / "best.py", source_text)
    write_json(t / "best.json", {"key": key, "sha256": sha256_file(t / "best.py"), "verdict": verdict,
                                 "graph_dir": str(graph_dir), "kind": kind, "settings": settings})
    return t / "best.py"


def push_attempt(run_id: str, key: str, text: str) -> Path:
    """Add a source to the ring of five: fill 00..04, then drop the oldest and shift the rest down."""
    d = track_dir(run_id, key) / "attempts"
    d.mkdir(parents=True, exist_ok=True)
    existing = sorted(d.glob("attempt_*.py"))
    if len(existing) >= ATTEMPTS:
        existing[0].unlink()
        for i, p in enumerate(sorted(d.glob("attempt_*.py"))):
            os.replace(p, d / f"attempt_{i:02d}.py")
        existing = sorted(d.glob("attempt_*.py"))
    p = d / f"attempt_{len(existing):02d}.py"
    atomic_write_text(p, text)
    return p
