"""Where tilesmith keeps things: TILESMITH_HOME (default ~/.cache/tilesmith) and its sub-folders."""

from __future__ import annotations

import os
from pathlib import Path

from tilesmith import settings

DEFAULT_WORKSPACE = "tilesmith-workspace"


def absolute(path: str | os.PathLike) -> Path:
    """A path the user gave (`~` expanded), made absolute against the current directory once, at the
    boundary: worker processes run in folders of their own, where a relative path means something else.
    Symbolic links are kept as given (no resolve), so messages and records name what the user named."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def shown(path: str | os.PathLike) -> str:
    """A path for a message, the way the user typed it: relative to the current directory when it lies
    inside it, else absolute."""
    p = absolute(path)
    try:
        return str(p.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(p)


def home() -> Path:
    """The tilesmith home folder (absolute, TILESMITH_HOME); read from the environment on every call so tests can
    move it."""
    return settings.current().home


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
