"""Where tracks run and in which order, when there is more than one place to run them: lanes (one GPU
each, pinned through CUDA_VISIBLE_DEVICES in the environment of the track's process), the order of the
graphs (longest expected work first), and the loop that gives each free lane the next graph."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tilesmith.errors import TilesmithError


@dataclass(frozen=True)
class Lane:
    """One place a track runs, one track at a time: its name in records, and what its track's process adds
    to its environment (every worker that process starts inherits it: screening, gate, profile)."""

    name: str  # "gpu 1"
    env: dict = field(default_factory=dict)  # {"CUDA_VISIBLE_DEVICES": "1"}


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, as indices into its own device list ("0", "1", ...).
    torch.cuda.device_count() asks NVML and creates no CUDA context here; no CUDA build: none."""
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch with CUDA, no driver: no GPU to spread over
        return []


def parse_gpus(text: str | None) -> list[str] | None:
    """`--gpus 0,1,3` as ["0", "1", "3"]; None or "" stays None (every visible GPU)."""
    if not text:
        return None
    ids = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in ids if not x.isdigit()]
    if bad or not ids:
        raise TilesmithError(f"--gpus {text!r}: give GPU indices separated by commas, e.g. 0,1,2,3", code="usage")
    return list(dict.fromkeys(ids))


def gpu_lanes(asked: list[str] | None, visible: list[str], parent_visible: str | None) -> list[Lane]:
    """One lane per GPU asked for (None: every visible one). An index is this process's (after its own
    CUDA_VISIBLE_DEVICES, `parent_visible`): the lane's process gets the matching entry of that list, so
    that its GPU is the same physical device and is its device 0."""
    ids = list(visible) if asked is None else list(asked)
    unknown = [i for i in ids if i not in visible]
    if unknown:
        raise TilesmithError(f"--gpus: GPU {unknown[0]} is not visible here ({len(visible)} visible: "
                             f"{','.join(visible) or 'none'})", code="usage",
                             hint="give indices as this process sees them (after CUDA_VISIBLE_DEVICES)")
    entries = [e.strip() for e in parent_visible.split(",")] if parent_visible else None
    return [Lane(f"gpu {i}", {"CUDA_VISIBLE_DEVICES": entries[int(i)] if entries else i}) for i in ids]


def expected_work(graph, graph_dir: Path, track_dir: Path) -> tuple:
    """How much work a graph's track is expected to be, as a sort key (bigger first): a baseline profile's
    roofline headroom times its calls per step (else its wall time) when the run has one (a resumed run),
    else the graph's size as a proxy (kernel count, then the wrapper's bytes). Profiled graphs come first:
    the two scales do not compare."""
    try:
        p = json.loads((track_dir / "profiles" / "baseline.json").read_text())
        per_call = float(p.get("headroom_ms") or 0.0) or float(p.get("wall_ms") or 0.0)
        return (1, per_call * max(1, int(graph.seen or 1)), 0)
    except (OSError, ValueError, TypeError):
        pass
    kernels = sum(int(v or 0) for v in (graph.kernels or {}).values())
    try:
        size = (graph_dir / "wrapper.py").stat().st_size
    except OSError:
        size = 0
    return (0, kernels, size)


def order(graphs, graph_dir: Callable, track_dir: Callable) -> list:
    """`graphs` longest expected work first (expected_work); ties keep the capture's order."""
    return sorted(graphs, key=lambda g: expected_work(g, graph_dir(g.key), track_dir(g.key)), reverse=True)


def schedule(items: list, lanes: list[Lane], run_one: Callable, stopped: Callable[[], bool],
             interrupt: Callable[[], None] = lambda: None) -> None:
    """run_one(item, lane) for every item, in the given order, each on the first lane that is free; a
    lane runs one item at a time. Once stopped() is true no item starts. run_one's exceptions are the
    caller's to catch: one that escapes ends its lane (the other lanes take the rest). On Ctrl-C:
    interrupt(), which must make every run_one return soon, then the lanes are waited for and the
    KeyboardInterrupt goes on."""
    queue, lock = deque(items), threading.Lock()

    def lane_loop(lane: Lane) -> None:
        while not stopped():
            with lock:
                if not queue:
                    return
                item = queue.popleft()
            run_one(item, lane)

    threads = [threading.Thread(target=lane_loop, args=(lane,), name=f"tilesmith-{lane.name}", daemon=True)
               for lane in lanes]
    for t in threads:
        t.start()
    try:
        for t in threads:  # in slices, so that Ctrl-C reaches the main thread
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        interrupt()
        for t in threads:
            t.join(120)
        raise
