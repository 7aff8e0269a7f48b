"""`tilesmith --version`: the installed distribution's version, else the source tree's pyproject.toml."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def version(dist: str = "tilesmith") -> str:
    """The version `dist` was installed with; from a source tree that was never installed (PYTHONPATH, a GPU
    machine's checkout), pyproject.toml's; "unknown" when neither says."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    try:
        import tomllib

        return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, ValueError, ImportError):
        m = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text() if PYPROJECT.exists() else "", re.M)
        return m.group(1) if m else "unknown"
