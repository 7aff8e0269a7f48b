"""Runs on disk: runs/<run-id>/run.json (Run) and one track folder per graph.

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
from dataclasses import asdict, dataclass, field
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


@dataclass
class Run:
    """One run's record, runs/<run-id>/run.json: what was asked (`settings`), of which workspace, on which
    stack (`environment`), how it stands (`status`: running | complete | interrupted | failed, `ended`), and
    per graph what its track came to (`graphs`: key -> optimize's TrackResult, or submit's verdict, as a dict)."""

    run_id: str
    created: str | None = None
    workspace: str | None = None
    settings: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    status: str = "running"
    ended: str | None = None
    graphs: dict = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return paths.run_dir(self.run_id)

    def save(self) -> None:
        """Write run.json (atomically, known secret values redacted)."""
        write_json(self.dir / "run.json", self.to_dict())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d, asked: str | None = None) -> "Run":
        """The Run a run.json holds; a TilesmithError (corrupt-run) when it is no run record. Fields of the wrong
        type read as missing (a report of a damaged run still shows what it can)."""
        if not isinstance(d, dict) or not isinstance(d.get("run_id"), str) or not isinstance(d.get("graphs", {}), dict):
            raise TilesmithError(f"run.json of run '{asked or 'newest'}' is not a run record", code="corrupt-run",
                                 hint=f"look at {paths.runs_dir()}; a run.json holds run_id, settings and graphs")
        dict_or_empty = lambda v: v if isinstance(v, dict) else {}  # noqa: E731
        return cls(d["run_id"], d.get("created"), d.get("workspace"), dict_or_empty(d.get("settings")),
                   dict_or_empty(d.get("environment")), d.get("status", "unknown"), d.get("ended"), d.get("graphs") or {})

    # Read access by name, as run.json's dict gave it before Run: tilesmith/install.py still reads a run so.
    def __getitem__(self, name: str):
        return getattr(self, name)

    def get(self, name: str, default=None):
        return getattr(self, name, default)


def create_run(settings: dict, workspace: str, environment: dict, run_id: str | None = None) -> Run:
    """A new run's folder and its run.json (status running)."""
    run = Run(run_id or new_run_id(), now_iso(), str(workspace), settings, environment)
    run.dir.mkdir(parents=True, exist_ok=False)
    run.save()
    return run


def load_run(run_id: str | None = None) -> Run:
    """The run `run_id` (a unique prefix is enough), or the newest run when None."""
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
        d = json.loads((root / rid / "run.json").read_text())
    except json.JSONDecodeError as e:
        raise TilesmithError(f"{root / rid / 'run.json'} is corrupt: {e}", code="corrupt-run") from None
    return Run.from_dict(d, run_id)


# The statuses of a track that a resumed run never runs again.
FINAL = ("done", "exhausted", "cached", "failed")


def exact_hit(run_id: str, key: str, provenance_match) -> bool:
    """Whether the store holds an artifact for graph `key` made with the same settings (`provenance_match`, the run
    settings' check of an artifact's provenance); if so, the track's cache.json names it and no search is needed."""
    from tilesmith import store

    m = store.get(key)
    if m is None or not provenance_match(m.provenance):
        return False
    write_json(track_dir(run_id, key) / "cache.json",
               {"key": key, "artifact": str(store.artifact_path(key)), "manifest": str(store.manifest_path(key)),
                "speedup": m.evidence.speedup, "from_run": m.provenance.get("run_id")})
    return True


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
