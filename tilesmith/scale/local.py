"""Tracks over several GPUs of this host: one lane per GPU, one track per lane at a time, each track in a
process of its own whose environment pins it (and so every worker it starts: screening, gate, profile) to
its lane's GPU; the graph longest expected work first goes to the first lane that is free."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tilesmith import runs
from tilesmith.scale import plan, shipment


def run_lanes(r, graphs, tracks: dict, lanes: list[plan.Lane]) -> None:
    """Run the tracks of `graphs` not finished yet on `lanes` (see the module's docstring); results land
    in the run as they come (shipment.absorb). Ctrl-C stops every lane's track, which saves what it has."""
    from tilesmith.runs import FINAL

    todo = plan.order([g for g in graphs if tracks[g.key].status not in FINAL], r.ws.graph_dir,
                      lambda key: runs.track_dir(r.run_id, key))
    deadline = shipment.epoch_deadline(r)

    def run_one(g, lane: plan.Lane) -> None:
        t = tracks[g.key]
        try:
            if not r.expired() and not _cached(r, g, t):
                _run_on(r, g, t, lane, deadline)
        except Exception as e:  # noqa: BLE001 - one graph's failure never ends the run
            t.status, t.reason = "failed", f"{type(e).__name__}: {e}"[:500]
            r.save(t)
            r.note("track", key=g.key, track=t)

    plan.schedule(todo, lanes, run_one, r.expired, interrupt=r.stop.set)


def _cached(r, g, t) -> bool:
    """An exact hit in this host's store (the track's own process has a store of its own)."""

    if not runs.exact_hit(r.run_id, g.key, r.settings.provenance_match):
        return False
    t.status, t.reason = "cached", "an artifact made with the same settings is installed"
    r.save(t)
    r.note("track", key=g.key, track=t)
    return True


def _run_on(r, g, t, lane: plan.Lane, deadline: float | None) -> None:
    from dataclasses import asdict

    ship = shipment.pack(r, g, asdict(t), deadline)
    with tempfile.TemporaryDirectory(prefix="tilesmith-lane-") as tmp:
        for msg in shipment.run_track(ship, lane.env, Path(tmp), stopped=r.stop.is_set):
            if msg["event"] == "started":
                shipment.place(r, g.key, where=lane.name, env=lane.env, pid=msg["pid"], started=runs.now_iso(),
                               started_unix_s=time.time(), ended=None, ended_unix_s=None)
            elif msg["event"] == "lost":
                shipment.lost(r, t, f"{lane.name}: {msg['reason']}")
            else:
                shipment.absorb(r, t, g, msg)
    shipment.place(r, g.key, ended=runs.now_iso(), ended_unix_s=time.time())
