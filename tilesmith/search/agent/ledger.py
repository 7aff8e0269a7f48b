"""What the agent tried on one track, and the attempt files each turn works on.

Each turn gets its own attempt files, /attempts/turn_NNN_a.py, _b.py, _c.py, all copies of the best
accepted source; they are never renamed or deleted, so a note or a ledger row that names one stays
true for the whole run. The ledger (profiles/ledger.json, shown in every turn's message) has one row
per attempt file: the idea it carries, the roofline gain claimed for it, its last check, its last
screened time, and the gate's verdict when it was judged. Rows are keyed by file; a check or screen
is recorded with the sha256 of the bytes it saw, so an edit after a passing check does not count as
checked.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

LETTERS = "abcdefgh"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Row:
    turn: int
    file: str  # virtual path, e.g. /attempts/turn_003_b.py
    idea: str = ""
    max_gain: float | None = None  # the speedup its roofline allows (the agent's claim), x
    check: str = ""  # "" | "ok" | "failed: <codes>"
    check_sha: str = ""
    screened_ms: float | None = None
    best_ms: float | None = None  # the best source's time in the same screen
    screen_sha: str = ""
    verdict: str = ""  # "" | "accepted 1.043x" | "rejected at <stage>: <codes>"


class Ledger:
    """Thread-safe: parallel subagents record through the same tools."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[str, Row] = {}
        self._lock = threading.Lock()
        if path.exists():  # a resumed track keeps its history
            for r in json.loads(path.read_text()):
                self.rows[r["file"]] = Row(**r)

    def row(self, file: str, turn: int = 0) -> Row:
        with self._lock:
            return self.rows.setdefault(file, Row(turn, file))

    def update(self, file: str, **fields) -> None:
        r = self.row(file)
        with self._lock:
            for k, v in fields.items():
                setattr(r, k, v)
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps([asdict(r) for r in self.rows.values()], indent=1))

    def check_failed(self, file: str, text: str) -> bool:
        """The latest check of exactly these bytes failed."""
        r = self.rows.get(file)
        return bool(r and r.check.startswith("failed") and r.check_sha == sha(text))

    def table(self, last: int = 24) -> str:
        """The rows (the most recent `last`), one line each: what was tried and what came of it."""
        rows = [r for r in self.rows.values() if r.idea or r.check or r.screened_ms or r.verdict][-last:]
        if not rows:
            return "(empty: nothing tried yet)"
        out = ["turn | file | idea (roofline gain) | check | screened ms (best) | verdict"]
        for r in rows:
            gain = f" ({r.max_gain:g}x)" if r.max_gain else ""
            ms = f"{r.screened_ms:.4f} ({r.best_ms:.4f})" if r.screened_ms and r.best_ms else (
                f"{r.screened_ms:.4f}" if r.screened_ms else "-")
            out.append(f"{r.turn} | {r.file} | {(r.idea or '-')[:90]}{gain} | {r.check or '-'} | {ms} | {r.verdict or '-'}")
        return "\n".join(out)


def turn_attempts(track_dir: Path, turn: int, text: str, width: int) -> list[Path]:
    """This turn's attempt files, each a copy of `text` (the best accepted source)."""
    from tilesmith.workspace import atomic_write_text

    d = track_dir / "attempts"
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for letter in LETTERS[:width]:
        p = d / f"turn_{turn:03d}_{letter}.py"
        atomic_write_text(p, text)
        out.append(p)
    return out


def virtual(track_dir: Path, p: Path) -> str:
    return "/" + str(Path(p).resolve().relative_to(Path(track_dir).resolve()))


def resolve(track_dir: Path, vpath: str) -> Path:
    """A virtual path the model gave, inside the track folder's attempts/ or scratch/, or ValueError."""
    root = Path(track_dir).resolve()
    p = (root / vpath.lstrip("/")).resolve()
    if not any(p.is_relative_to(root / sub) for sub in ("attempts", "scratch")):
        raise ValueError(f"{vpath}: give a file under /attempts/ or /scratch/")
    if not p.is_file():
        raise ValueError(f"{vpath}: no such file")
    return p
