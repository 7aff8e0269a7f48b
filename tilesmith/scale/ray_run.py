"""Each graph's track as a Ray task (`tilesmith optimize --ray ADDRESS`, or `--ray local` for a Ray instance
started here for the run and stopped at its end). Ray places and queues the tasks; this module only hands
them over, longest expected work first, and takes their messages back.

A task asks for one GPU of the type the graph was captured on (Ray's accelerator type, from the GPU name in
graph.json) and one CPU, or `--ray-cpus` CPUs for a CPU graph (Ray then sets OMP_NUM_THREADS to that number,
and the gate times the graph on that many threads). It is a generator: the track's messages stream back as
they happen, each acceptance with its files, so a task that dies (its process killed, its node gone) loses
only what its track had not yet confirmed. Tasks are never retried by Ray (max_retries=0): such a track is
marked "lost", and `tilesmith optimize --resume RUN` runs it again from its last accepted source.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import deque
from dataclasses import asdict

from tilesmith import runs
from tilesmith.errors import TilesmithError
from tilesmith.scale import local, plan, shipment


def require_ray():
    """The ray module, or the error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise TilesmithError("--ray needs Ray, which is not installed here", code="no-ray",
                             hint="pip install 'tilesmith[ray]'") from None
    return ray


def run_ray(r, graphs, tracks: dict) -> None:
    """Run the unfinished tracks of `graphs` as Ray tasks (see the module's docstring)."""
    ray = require_ray()
    # Ray's driver prints the cluster's errors ("(raylet) The node ... has been marked dead") on stdout, from a
    # thread of its own: on stderr instead, where they belong, so that stdout (`--json`) stays the result's.
    with contextlib.redirect_stdout(sys.stderr):
        mine = _connect(ray, r.settings.ray)
        try:
            _drive(ray, r, graphs, tracks)
        finally:
            if mine:
                ray.shutdown()  # a local instance stops; a cluster only loses this driver


def _connect(ray, address: str) -> bool:
    """Start a local instance ("local") or join the cluster at `address`; False when this process was already
    connected (a program that uses Ray itself: its session is left as it was)."""
    if ray.is_initialized():
        return False
    quiet = dict(log_to_driver=False, logging_level="ERROR")
    try:
        if address == "local":
            ray.init(address="local", include_dashboard=False, **quiet)
        else:
            ray.init(address=address, **quiet)
    except Exception as e:  # noqa: BLE001 - Ray's many connection errors: one message for the user
        raise TilesmithError(f"cannot start or reach Ray at {address!r}: {type(e).__name__}: {e}"[:600],
                             code="ray-unreachable",
                             hint="`ray start --head` on the head node prints the address to give; "
                                  "`--ray local` starts one here") from None
    return True


def _drive(ray, r, graphs, tracks: dict) -> None:
    from tilesmith.runs import FINAL

    todo = deque(plan.order([g for g in graphs if tracks[g.key].status not in FINAL], r.ws.graph_dir,
                            lambda key: runs.track_dir(r.run_id, key)))
    nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(remote_track)
    deadline = shipment.epoch_deadline(r)
    # Graphs in Ray's hands at once: enough to keep every slot busy, few enough that the object store does
    # not hold every graph's data.pt at once (a model's graphs carry its weights).
    window = max(2, 2 * sum(int(n.get("GPU", 0) + n.get("CPU", 0) // r.settings.ray_cpus) for n in nodes))
    live: dict = {}  # generator -> [graph, its placement once the task started]
    try:
        while todo or live:
            while todo and len(live) < window and not r.expired():
                g = todo.popleft()
                gen = _submit(task, r, g, tracks[g.key], nodes, deadline)
                if gen is not None:
                    live[gen] = [g, None]
            if r.expired():  # queued tasks never start after the budget; started ones stop at it themselves
                for gen in [x for x, (_, where) in live.items() if where is None]:
                    ray.cancel(gen)
                    del live[gen]
                if not live:
                    break
            if live:
                ready, _ = ray.wait(list(live), num_returns=1, timeout=1.0)
                for gen in ready:
                    _step(ray, r, tracks, live, gen)
    except KeyboardInterrupt:
        for gen in live:  # the task's process dies; its track's process stops as on Ctrl-C
            ray.cancel(gen, force=True)
        raise


def _submit(task, r, g, t, nodes: list[dict], deadline):
    """Hand graph g's track to Ray (its generator), or None: an exact hit, or no node could ever run it."""
    if local._cached(r, g, t):
        return None
    opts, why = resources(g, r.ws.graph_dir(g.key), r.settings.ray_cpus, nodes)
    if why:
        t.reason = f"{why}; add one and `tilesmith optimize --resume {r.run_id}`"
        r.save(t)
        r.note("track", key=g.key, track=t)
        return None
    ship = shipment.pack(r, g, asdict(t), deadline)
    return task.options(**opts, max_retries=0, name=f"tilesmith-track-{g.short}").remote(ship)


def _step(ray, r, tracks: dict, live: dict, gen) -> None:
    """Take the next message of one task and bring it into the run."""
    g, where = live[gen]
    t = tracks[g.key]
    try:
        msg = ray.get(next(gen))
    except StopIteration:
        del live[gen]
        shipment.place(r, g.key, ended=runs.now_iso())
        return
    except ray.exceptions.TaskCancelledError:
        del live[gen]  # Ctrl-C or the budget: the run marks the track
        return
    except ray.exceptions.RayError as e:
        del live[gen]
        shipment.lost(r, t, f"its Ray task died{' on ' + where if where else ''}: {_one_line(e)}")
        shipment.place(r, g.key, ended=runs.now_iso())
        return
    if msg["event"] == "placed":
        live[gen][1] = f"node {msg['node_id'][:12]} ({msg['ip']})"
        shipment.place(r, g.key, where=f"ray {live[gen][1]}", started=runs.now_iso(), ended=None,
                       **{k: v for k, v in msg.items() if k != "event"})
    elif msg["event"] == "started":
        shipment.place(r, g.key, pid=msg["pid"])
    elif msg["event"] == "lost":
        shipment.lost(r, t, f"on {where}: {msg['reason']}")
    else:
        shipment.absorb(r, t, g, msg)


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400]


def resources(g, graph_dir, ray_cpus: float, nodes: list[dict]) -> tuple[dict, str]:
    """(the task's Ray options, "" or why no node of the cluster can ever run it)."""
    if str(g.device).startswith("cuda"):
        try:
            gpu = (json.loads((graph_dir / "graph.json").read_text()).get("environment") or {}).get("gpu")
        except (OSError, ValueError):
            gpu = None
        acc = accelerator_type(gpu)
        opts, need = {"num_gpus": 1, "num_cpus": 1}, {"GPU": 1, "CPU": 1}
        if acc:
            opts["accelerator_type"] = acc
            need[f"accelerator_type:{acc}"] = 0.001  # what Ray asks of a node for accelerator_type=
        what = f"a free {acc} GPU" if acc else "a GPU"
    else:
        opts, need, what, gpu = {"num_cpus": ray_cpus, "num_gpus": 0}, {"CPU": ray_cpus}, f"{ray_cpus:g} CPU(s)", None
    if any(all(n.get(k, 0) >= v for k, v in need.items()) for n in nodes):
        return opts, ""
    return opts, (f"not started: no node of the Ray cluster has {what}"
                  + (f" (the graph was captured on {gpu})" if gpu else ""))


def accelerator_type(gpu_name: str | None) -> str | None:
    """Ray's accelerator type for a GPU name ("NVIDIA H100 80GB HBM3" -> "H100"), by Ray's own rule."""
    if not gpu_name:
        return None
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        return NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(gpu_name)
    except Exception:  # noqa: BLE001 - another Ray: the GPU count alone decides
        return None


def remote_track(ship: dict):
    """The task (runs on a Ray worker): says where it runs, then runs the shipped track in a scratch folder
    and passes its messages on (shipment.run_track). Ray set CUDA_VISIBLE_DEVICES to the task's GPU."""
    import socket
    import tempfile
    from pathlib import Path

    import ray

    ctx = ray.get_runtime_context()
    yield {"event": "placed", "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
           "host": socket.gethostname(), "gpus": [str(x) for x in ray.get_gpu_ids()], "ray_pid": os.getpid(),
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    with tempfile.TemporaryDirectory(prefix="tilesmith-track-") as tmp:
        yield from shipment.run_track(ship, {}, Path(tmp))
