"""Cheap screening for the tuner: time several rewrites of one graph's wrapper, interleaved, in one
worker subprocess. Only a screen: a variant that looks faster here still has to pass the full gate."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilesmith.gate.proc import calm_spares


@dataclass
class Screen:
    label: str
    median_ms: float | None  # None when the variant failed to load or run
    samples_ms: list[float]
    error: str = ""


def screen(graph_dir: str | Path, sources: list[tuple[str, str]], *, budget_s: float = 5.0,
           timeout_s: float = 900) -> list[Screen]:
    """Time each (label, source text) on the captured inputs; per-variant median of raw samples.

    budget_s: seconds of timing (after compiling and warming every variant) shared by all variants.
    """
    with tempfile.TemporaryDirectory(prefix="tilesmith-screen-") as tmp:
        files = []
        for i, (_, text) in enumerate(sources):
            f = Path(tmp) / f"variant_{i:03d}.py"
            f.write_text(text)
            files.append(str(f))
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"graph_dir": str(graph_dir), "sources": files, "budget_s": budget_s}))
        calm_spares()  # no gate worker may still be starting while the variants are timed
        try:
            p = subprocess.run([sys.executable, "-m", "tilesmith.search.measure_worker", str(spec)],
                               capture_output=True, text=True, timeout=timeout_s,
                               env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"})
        except subprocess.TimeoutExpired:
            return [Screen(label, None, [], f"screening timed out after {timeout_s:.0f} s") for label, _ in sources]
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        err = " | ".join((p.stderr or p.stdout).strip().splitlines()[-2:])
        return [Screen(label, None, [], f"worker failed: {err}") for label, _ in sources]
    raw = json.loads(lines[-1])
    out = []
    for (label, _), r in zip(sources, raw["results"]):
        ms = [ns / 1e6 for ns in r["ns"]]
        out.append(Screen(label, statistics.median(ms) if ms else None, ms, r.get("error", "")))
    return out
