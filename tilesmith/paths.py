"""Where tilesmith keeps things: TILESMITH_HOME (default ~/.cache/tilesmith) and its sub-folders."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_WORKSPACE = "tilesmith-workspace"


def home() -> Path:
    """The tilesmith home folder; read from the environment on every call so tests can move it."""
    return Path(os.environ.get("TILESMITH_HOME") or Path.home() / ".cache" / "tilesmith")


def runs_dir() -> Path:
    return home() / "runs"


def run_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def artifacts_dir() -> Path:
    return home() / "artifacts"


def manifests_dir() -> Path:
    return home() / "manifests"


def locks_dir() -> Path:
    return home() / "locks"
