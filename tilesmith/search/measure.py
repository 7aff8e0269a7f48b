"""Cheap screening for the tuner: time several rewrites of one graph's wrapper, interleaved, in one
worker subprocess. Only a screen: a variant that looks faster here still has to pass the full gate."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilesmith.launch import sandbox
from tilesmith.launch.secrets import redact_obj
from tilesmith.gate.spares import calm_spares
from tilesmith.workspace import graph_devices


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
        res = sandbox.run_json([sys.executable, "-m", "tilesmith.search.measure_worker", str(spec)],
                               sandbox.Spec.for_graphs(tmp, graph_devices([graph_dir]), readable=[str(graph_dir)]),
                               timeout_s)
    if res.returncode is None:
        return [Screen(label, None, [], f"screening timed out after {timeout_s:.0f} s") for label, _ in sources]
    if res.returncode != 0 or res.reply is None:
        return [Screen(label, None, [], f"worker failed: {res.tail}") for label, _ in sources]
    raw = redact_obj(res.reply)
    out = []
    for (label, _), r in zip(sources, raw["results"]):
        ms = [ns / 1e6 for ns in r["ns"]]
        out.append(Screen(label, statistics.median(ms) if ms else None, ms, r.get("error", "")))
    return out
