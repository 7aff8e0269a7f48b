"""Helpers for the tests of tilesmith/scale: a workspace made of several captured ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tilesmith import runs
from tilesmith import workspace as wsmod


def merged_workspace(dest: Path, *sources: Path) -> Path:
    """One workspace holding every graph of `sources` (real captures, copied; the first one's header)."""
    loaded = [wsmod.load(s) for s in sources]
    graphs = []
    for w in loaded:
        for g in w.graphs:
            shutil.copytree(w.graph_dir(g.key), wsmod.graph_dir(dest, g.key))
            graphs.append(g)
    first = loaded[0]
    wsmod.save(wsmod.Workspace(path=Path(dest), script=first.script, argv=first.argv, created=first.created,
                               environment=first.environment, graphs=graphs))
    return Path(dest)


def placement(run_id: str, key: str) -> dict:
    return json.loads((runs.track_dir(run_id, key) / "placement.json").read_text())


def verdicts(run_id: str, key: str) -> list[str]:
    return sorted(p.name for p in (runs.track_dir(run_id, key) / "profiles").glob("verdict_*.json"))
