"""Many graphs, many GPUs: tracks that run away from the run's own process.

- over several GPUs of this host (`--gpus`, default every visible GPU): local.py, one track per GPU at a time,
  each in a process pinned to its GPU through CUDA_VISIBLE_DEVICES;
- as Ray tasks (`--ray ADDRESS|local`): ray_run.py, one task per graph asking for one GPU of the type the
  graph was captured on (or CPUs for a CPU graph).
Either way a track is shipped (shipment.py) to `python -m tilesmith.scale.child`, which runs the ordinary
optimize driver on that one graph, and its results come back into the same run folder. Where there is one
GPU, no GPU, or only CPU graphs, the run's own process runs every track as before (optimize._work_all).
"""

from __future__ import annotations

import os

from tilesmith.errors import TilesmithError
from tilesmith.scale.plan import Lane

__all__ = ["Lane", "check", "place"]


def check(settings, optimizer=None, lanes=None) -> None:
    """Before a run starts: the placement the settings ask for can be had here (an error otherwise)."""
    if settings.ray and (settings.gpus or lanes is not None):
        raise TilesmithError("--gpus and --ray do not go together", code="usage",
                             hint="with --ray, each track's task gets a GPU of its own from Ray")
    if (settings.ray or lanes is not None) and optimizer is not None:
        raise TilesmithError("a custom optimizer runs in this process only, not in a track's own process",
                             code="usage", hint="use the tuner or the agent with --ray")
    if settings.ray_cpus <= 0:
        raise TilesmithError("--ray-cpus must be more than 0", code="usage")
    if settings.ray:
        from tilesmith.scale.ray_run import require_ray

        require_ray()


def place(r, graphs: list, tracks: dict, lanes: list[Lane] | None = None) -> list:
    """Run the tracks that go elsewhere (a Ray cluster; other GPUs of this host; `lanes` when given: every
    graph on them); return the graphs left for the run's own process."""
    from tilesmith.runs import FINAL

    if r.settings.ray:
        from tilesmith.scale.ray_run import run_ray

        run_ray(r, graphs, tracks)
        return []
    if lanes is None:
        away = [g for g in graphs if str(g.device).startswith("cuda") and tracks[g.key].status not in FINAL]
        if not away or r.optimizer is not None or (r.settings.gpus is None and len(away) < 2):
            return graphs
        from tilesmith.scale.plan import gpu_lanes, visible_gpus

        lanes = gpu_lanes(r.settings.gpus, visible_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if r.settings.gpus is None and len(lanes) < 2:  # one GPU: today's path, in this process
            return graphs
    else:
        away = list(graphs)
    from tilesmith.scale.local import run_lanes

    run_lanes(r, away, tracks, lanes)
    return [g for g in graphs if g not in away]
