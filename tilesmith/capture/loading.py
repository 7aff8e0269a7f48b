"""Load a captured graph in a fresh process: its wrapper module (with constants) and its data.

Used by rerun.py and the workers (gate, screens, profile); never in the process that decides (it executes wrapper code).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tilesmith.errors import TilesmithError
from tilesmith.workspace import Graph, GraphData


def load_graph_data(gdir: Path | str, device_map=None) -> GraphData:
    """The data of the captured graph in `gdir`: Graph(gdir).data(device_map)."""
    return Graph(gdir).data(device_map)


def load_module(text: str, constants: dict):
    """Exec wrapper source (FX header allowed) as a fresh module with `constants` as globals."""
    from tilesmith.runtime import load_source

    mod = load_source(text, dict(constants))
    if not callable(getattr(mod, "call", None)):
        raise TilesmithError("the wrapper defines no call(args)", code="no-call")
    return mod


def load_wrapper(gdir: Path | str, constants: dict):
    """The captured wrapper of the graph in `gdir`, loaded (load_module)."""
    return load_module(Graph(gdir).wrapper, constants)


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


def state_reset(data: GraphData, args: list):
    """For a graph that updates some inputs in place (graph.json's mutated_inputs: running statistics, an optimizer's
    state, a KV cache and its position), a function that puts the values the captured call found back into those of
    `args`, in place; None for a graph that updates none. A worker that calls the graph again and again on one set of
    buffers calls it before each timed call (outside the time), so every call starts from the captured state as the
    gate's samples do: a decoder's cache position, advanced by each call, otherwise ran past the cache's end (an
    index out of bounds at the 252nd call of a tuner's screen)."""
    from tilesmith.capture.tensors import snapshot

    at = [i for i in sorted(int(i) for i in data.meta.get("mutated_inputs") or [])
          if i < len(args) and isinstance(args[i], torch.Tensor)]
    if not at:
        return None
    kept = [(args[i], snapshot(data.inputs[i])) for i in at]

    def reset() -> None:
        for dst, src in kept:
            dst.copy_(src)
    return reset


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
