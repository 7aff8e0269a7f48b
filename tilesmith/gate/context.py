"""What one gate decision's stages share: DecisionContext, made by gate/__init__.py (_run) and read by its stages there,
in gate/original.py (the reference worker's side) and gate/timed.py (the timing stage); and StageClock, the wall
seconds per step it adds into the verdict. A module of its own so that those modules import it, not the gate package.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tilesmith.gate.spares import Spares
from tilesmith.gate.verdict import Policy, Reason


class StageClock:
    """Adds wall seconds per step into a Verdict's stage_seconds."""

    def __init__(self, into: dict):
        self.into = into

    @contextlib.contextmanager
    def __call__(self, key: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(key, time.monotonic() - t0)

    def add(self, key: str, seconds: float) -> None:
        self.into[key] = round(self.into.get(key, 0.0) + seconds, 4)


@dataclass
class DecisionContext:
    """One decision's inputs and the state its two passes carry over (modes, warnings, buffers, solo_in_mode_ns)."""

    gdir: Path  # the captured graph's folder, absolute
    meta: dict  # its graph.json
    cand: Path  # the judged bytes, copied into `scratch` (later edits of the user's file change nothing)
    timing_base: Path | None  # a copy of Policy.timing_baseline, timed in place of the original; None: the original
    timing_base_sha: str  # that source's sha256, "" without one: it keys a kept timer worker
    scratch: Path  # this decision's temporary folder
    device: str  # the graph's device, "cuda:0" or "cpu" (gate.graph_device)
    policy: Policy  # how strict the gate is and how much time it may spend
    mode: str  # the graph's timing mode, "launch" or "graph" (gate.modes.resolve_mode)
    note: Callable[[str, str], None]  # on_progress(stage, message), a no-op without one
    clock: StageClock  # wall seconds per step, into the verdict's stage_seconds
    spares: Spares | None  # started workers this decision may take (gate.spares.keep_spares); None: every one fresh
    modes: dict[str, str]  # role ("candidate", "baseline") -> its timing mode where not `mode` (gate.modes.role_modes)
    warnings: list[Reason]  # the verdict's own list (Verdict.warnings), changed in place
    specials: dict[int, list]  # seed -> its special-value input sets [(name, inputs)] (gate.inputs.special_sets)
    pair: tuple[int, int]  # indices of the two correctness sets run in the same buffers
    buffers: int = 0  # rotating buffer sets the timed calls cycle through; set by timed.run before any read
    solo_in_mode_ns: float | None = None  # the original alone in graph mode, ns per call (timed.resized); None: unknown
