"""Load a captured graph in a fresh process: its wrapper module (with constants) and its data.

Used by rerun.py and the workers (gate, screens, profile); never in the process that decides (it executes wrapper code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tilesmith.errors import TilesmithError
from tilesmith.workspace import DATA_FILE, WRAPPER_FILE, load_graph_json


@dataclass
class GraphData:
    """The first real call of a graph: inputs, outputs, constants and the RNG state before it."""

    meta: dict
    inputs: list
    outputs: list
    constants: dict
    rng: dict


def load_graph_data(gdir: Path | str, device_map=None) -> GraphData:
    """Read graph.json and data.pt; raises TilesmithError when the data was not stored."""
    gdir = Path(gdir)
    meta = load_graph_json(gdir)
    f = gdir / DATA_FILE
    if not f.exists():
        raise TilesmithError(f"{gdir.name[:12]}: no stored inputs ({meta.get('data_note') or 'data.pt missing'})",
                             code="no-data", hint="capture again (raise --max-input-bytes if the budget was hit)")
    if device_map is None and "cuda" in str(meta.get("device") or ""):
        _init_cuda()
    try:
        data = torch.load(f, map_location=device_map, weights_only=False)
    except Exception as e:
        raise TilesmithError(f"{f} is unreadable: {e}", code="corrupt-graph", hint="capture again") from None
    return GraphData(meta, data["inputs"], data["outputs"], data.get("constants", {}), data.get("rng", {}))


def _init_cuda() -> None:
    """Start CUDA before loading CUDA tensors. Before it starts, torch.cuda.device_count() asks NVML, and in a
    worker forked from the zygote (which imported torch with NVML-based checks) NVML counted no device while
    the CUDA runtime saw one: torch.load then refused the graph's data ("device_count() is 0"), which failed
    every forked profile and screen worker on the H200 (session 12). Once CUDA has started the count comes from
    the CUDA runtime. The gate's workers never met it: they create their CUDA context before loading."""
    try:
        torch.cuda.init()
    except Exception:  # noqa: BLE001 - no usable CUDA: torch.load says so in its own words just below
        pass


def load_module(text: str, constants: dict):
    """Exec wrapper source (FX header allowed) as a fresh module with `constants` as globals."""
    from tilesmith.runtime import load_source

    mod = load_source(text, dict(constants))
    if not callable(getattr(mod, "call", None)):
        raise TilesmithError("the wrapper defines no call(args)", code="no-call")
    return mod


def load_wrapper(gdir: Path | str, constants: dict):
    return load_module((Path(gdir) / WRAPPER_FILE).read_text(), constants)


def restore_rng(rng: dict) -> None:
    for dev, state in rng.items():
        if dev == "cpu":
            torch.set_rng_state(state)
        elif torch.cuda.is_available():
            torch.cuda.set_rng_state(state, int(dev.split(":")[1]))


def clone_args(inputs: list) -> list:
    """A fresh list of exact-layout copies: call() clears its list and may keep references."""
    from tilesmith.capture.tensors import snapshot

    return [snapshot(x) if isinstance(x, torch.Tensor) else x for x in inputs]


def reply(answer: dict) -> None:
    """A worker's last act: print its answer as one JSON line and leave at once. The interpreter's own
    shutdown (the profiler's and Inductor's compile pool's exit handlers, CUDA's teardown) is no part of
    the answer, and the parent waits for the process to end."""
    import json
    import os
    import sys

    print(json.dumps(answer), flush=True)
    sys.stderr.flush()
    os._exit(0)
