"""Optimizers: the built-in tuner (no model) and the agent. Each proposes candidate wrapper sources.

The contract between the optimize driver and an optimizer, public so that a new optimizer (or a
test's scripted one) needs nothing private:

- `Track`: what an optimizer sees of one graph: the captured graph (`graph`, workspace.Graph: graph.json
  read once) and its folders, the best confirmed source, the baseline profile, a log for screened
  variants, the time limit, and `restore_best()`.
- `Candidate`: a source to judge.
- `Optimizer`: `(track, settings, submit, loops_done) -> (status, reason)`. `submit(candidate)` runs
  the gate and returns its verdict as a dict; an accepted one becomes the track's best. The tuner and
  the agent (`tuner.run_track`, `agent.optimizer.run_track`) are both Optimizers;
  `from_generator` makes one from a generator that yields candidates and receives verdicts.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Literal, Protocol

from tilesmith import runs
from tilesmith import workspace as wsmod

__all__ = ["Candidate", "Track", "Optimizer", "Submit", "TrackEnd", "from_generator", "drive"]


@dataclass
class Candidate:
    text: str  # the full wrapper source (FX header included)
    label: str  # what changed, for reports
    path: Path | None = None  # already written into attempts/ (the agent edits its attempt in place)


Submit = Callable[[Candidate], dict]  # judge one candidate; returns the gate's verdict as a dict
TrackEnd = Literal["done", "exhausted", "interrupted"]


class Track:
    """What an optimizer sees of one graph: its folder, the best source so far, the profile."""

    def __init__(self, run_id: str, key: str, graph_dir: Path, deadline: float | None, stop: threading.Event,
                 timing_lock: threading.Lock | None = None):
        self.run_id, self.key, self.graph_dir = run_id, key, graph_dir
        self.graph = wsmod.Graph(graph_dir)  # graph.json is read when first asked for, then kept
        self.dir = runs.track_dir(run_id, key)
        self.profiles = self.dir / "profiles"
        self.profiles.mkdir(parents=True, exist_ok=True)
        self.best_text = self.graph.wrapper
        self.profile = None  # the baseline Profile, when the driver has one
        self._deadline, self._stop = deadline, stop
        # The driver's: an optimizer holds it while it measures, so no two measurements overlap.
        self.timing_lock = timing_lock or threading.Lock()

    def record(self, variant: dict) -> None:
        """Log one screened variant (profiles/tuner_variants.jsonl; the report counts these lines)."""
        _append(self.profiles / "tuner_variants.jsonl", variant)

    def failed_screens(self) -> str:
        """When every variant screened (not skipped: a duplicate, one that did not compile) failed to run:
        how many, and the first error; else ""."""
        f = self.profiles / "tuner_variants.jsonl"
        rows = []
        for line in (f.read_text(errors="replace").splitlines() if f.exists() else []):
            try:
                row = json.loads(line)
            except ValueError:  # a line cut off by a killed run: not a screen's word either way
                continue
            if isinstance(row, dict) and "samples" in row:
                rows.append(row)
        errors = [str(v.get("error")) for v in rows if v.get("error") and not v.get("median_ms")]
        if not rows or len(errors) < len(rows):
            return ""
        return f"all {len(rows)} screened variants failed to run, the first: {errors[0][:300]}"

    def expired(self) -> bool:
        return self._stop.is_set() or (self._deadline is not None and time.monotonic() > self._deadline)

    def restore_best(self) -> bool:
        """Put back best.py (the gate's timing baseline) if something rewrote it; True if it had changed.

        An optimizer's shell is not a sandbox: it could rewrite best.py to make the next candidate look
        fast. The source the host confirmed is in memory; a restore is logged in profiles/events.jsonl."""
        best = self.dir / "best.py"
        if best.exists() and best.read_text() != self.best_text:
            wsmod.atomic_write_text(best, self.best_text)
            _append(self.profiles / "events.jsonl", {"event": "best.py restored: changed outside the host"})
            return True
        return False


def _append(log: Path, event: dict) -> None:
    with log.open("a") as f:
        f.write(json.dumps({"t": runs.now_iso(), **event}) + "\n")


class Optimizer(Protocol):
    def __call__(self, track: Track, settings, submit: Submit, *, loops_done: int = 0) -> tuple[TrackEnd, str]:
        """Propose candidates through `submit` until `settings.loops` are accepted (`loops_done` of
        them already were), `track.expired()`, or nothing is left to try; return (status, reason)."""


def drive(candidates: Generator[Candidate, dict, None], track: Track, loops: int, submit: Submit,
          loops_done: int = 0) -> tuple[TrackEnd, str]:
    """Judge each candidate a generator yields and send its verdict back; `loops` accepted end it."""
    verdict = None
    while loops_done < loops:
        if track.expired():
            return "interrupted", ""
        try:
            cand = candidates.send(verdict) if verdict is not None else next(candidates)
        except StopIteration:
            if track.expired():  # it stopped because the time limit came, not because it ran out of ideas
                return "interrupted", ""
            return ("exhausted" if loops_done == 0 else "done"), "the optimizer has nothing more to try"
        if track.expired():  # the budget ran out while it was proposed (screens take a while): no decision
            return "interrupted", ""  # starts after the budget; one already started finishes
        verdict = submit(cand)
        loops_done += bool(verdict.get("accepted"))
    return "done", ""


def from_generator(propose: Callable[[Track, object], Generator[Candidate, dict, None]]) -> Optimizer:
    """An Optimizer from `propose(track, settings)`, a generator of candidates that receives verdicts."""

    def run(track: Track, settings, submit: Submit, *, loops_done: int = 0) -> tuple[TrackEnd, str]:
        return drive(propose(track, settings), track, settings.loops, submit, loops_done)

    return run
