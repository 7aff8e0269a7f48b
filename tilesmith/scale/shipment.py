"""A track that runs away from the run's own process (on another GPU of this host, or on a Ray node).

What is shipped (`pack`): the graph's folder (wrapper.py, graph.json, data.pt, ...), its entry of the
workspace, the run's settings, the agent's skill folders, and the track folder as the run left it (a lost
or interrupted track carries on from its best). Where it runs (`run_track`): unpacked into a scratch folder,
then `python -m tilesmith.scale.child` runs the ordinary optimize driver on that one graph in a private
TILESMITH_HOME; it prints one JSON line per event, and each event brings back the files of the track folder
that changed since the last (the baseline profile, each verdict, each acceptance). How it comes back (`absorb`): into runs/<run-id>/<key>/ and run.json of the
run, with best.json pointing at the run's own workspace, so `report` and `install` read the run unchanged.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tilesmith import runs
from tilesmith import workspace as wsmod
from tilesmith.launch.secrets import is_secret

SHIP_FILE = "shipment.json"
# The run's own settings that a track reads from the environment (TILESMITH_RELOWER, TILESMITH_SANDBOX, ...)
# travel with it; where things live (home, caches) and secrets do not.
_LOCAL_ONLY = {"TILESMITH_HOME", "TILESMITH_DEBUG", "TILESMITH_NATIVE_DIR", "TILESMITH_DEMO_OUT", "TILESMITH_GRAPH_DIR",
               "TILESMITH_GATE_DEVICE", "TILESMITH_GATE_HEADER_DIR", "TILESMITH_INDUCTOR_DEFAULT_DIR"}


def pack(r, g, row: dict, deadline_epoch: float | None) -> dict:
    """Everything graph `g`'s track needs to run anywhere tilesmith is installed (see the module's docstring);
    `row` is its track's row in run.json as the run has it now."""
    ws, settings = r.ws, asdict(r.settings)
    skills = {f"skills/{i}/{rel}": data for i, d in enumerate(settings.get("skills") or [])
              for rel, data in read_tree(Path(d)).items()}
    settings.update(graphs=[g.key], gpus=None, ray=None, jobs=1, max_minutes=None,
                    skills=[f"skills/{i}" for i in range(len(settings.get("skills") or []))])
    env = {k: v for k, v in os.environ.items()
           if k.startswith("TILESMITH_") and k not in _LOCAL_ONLY and not is_secret(k)}
    return {"run_id": r.run_id, "key": g.key, "settings": settings, "deadline_epoch": deadline_epoch, "env": env,
            "workspace": {"script": ws.script, "argv": list(ws.argv), "created": ws.created,
                          "environment": ws.environment, "graph": asdict(g)},
            "graph_files": read_tree(ws.graph_dir(g.key)), "track_files": read_tree(runs.track_dir(r.run_id, g.key)),
            "skill_files": skills, "row": row}


def read_tree(root: Path) -> dict[str, bytes]:
    """{path relative to root: bytes} of every file under root ({} when it does not exist)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def unpack(ship: dict, root: Path) -> Path:
    """Lay out a shipment under root: ws/ (a workspace of one graph), home/ (its run), skills/; returns
    the track folder in that home."""
    root = Path(root)
    w = ship["workspace"]
    ws = wsmod.Workspace(path=root / "ws", script=w["script"], argv=w["argv"], created=w["created"],
                         environment=w["environment"], graphs=[wsmod.GraphInfo(**w["graph"])])
    write_tree(ws.graph_dir(ship["key"]), ship["graph_files"])
    wsmod.save(ws)
    write_tree(root, ship.get("skill_files") or {})
    settings = {**ship["settings"], "skills": [str(root / s) for s in ship["settings"].get("skills") or []]}
    run_dir = root / "home" / "runs" / ship["run_id"]
    track = run_dir / ship["key"]
    track.mkdir(parents=True, exist_ok=True)
    write_tree(track, ship["track_files"])
    wsmod.write_json(run_dir / "run.json", {
        "run_id": ship["run_id"], "created": runs.now_iso(), "ended": None, "status": "interrupted",
        "workspace": str(ws.path), "settings": settings, "environment": w["environment"],
        "graphs": {ship["key"]: ship["row"]} if ship["row"] else {}})
    (root / SHIP_FILE).write_text(json.dumps({k: ship[k] for k in ("run_id", "key", "deadline_epoch", "env")}))
    return track


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write {relative path: bytes} under root; a path that would leave root is refused."""
    root = Path(root)
    for rel, data in files.items():
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"a shipped file's path leaves its folder: {rel!r}")
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, dest)


def run_track(ship: dict, env_extra: dict, root: Path, stopped=lambda: False):
    """Run one shipped track in a process of its own under root; yields its messages: {"event": "started",
    "pid"} first, then the child's events ({"event", "row", "label"/"error", "files": the track folder's
    files changed since the last message}), and last either its "end" or {"event": "lost", "reason"} when the process died without one.
    stopped(): when it turns true the process is asked to stop (SIGTERM), saves what it has and ends."""
    track = unpack(ship, root)
    sent = _stamps(track)  # what the run already has
    env = {**os.environ, **(ship.get("env") or {}), **env_extra, "TILESMITH_HOME": str(root / "home"),
           "PYTHONUNBUFFERED": "1"}
    with open(root / "child.log", "wb") as log:
        p = subprocess.Popen([sys.executable, "-m", "tilesmith.scale.child", str(root)], stdout=subprocess.PIPE,
                             stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=str(root))
        yield {"event": "started", "pid": p.pid}
        ended = False
        try:
            for msg in _messages(p, stopped):  # each with the files changed since the last: a baseline
                msg["files"], sent = changed_files(track, sent)  # profile, each verdict, an acceptance
                ended = ended or msg["event"] == "end"
                yield msg
        finally:
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if not ended:
        tail = " | ".join((root / "child.log").read_text(errors="replace").strip().splitlines()[-3:])[-600:]
        yield {"event": "lost", "reason": f"the track's process ended without finishing ({_status(p.returncode)})"
                                          + (f": {tail}" if tail else "")}


def _status(rc: int | None) -> str:
    if rc is not None and rc < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def _messages(p: subprocess.Popen, stopped):
    """The child's JSON messages from its stdout as they come; asks it to stop once stopped() is true."""
    buf, asked = b"", False
    fd = p.stdout.fileno()
    while True:
        if not asked and stopped():
            asked = True
            p.terminate()  # the child turns SIGTERM into Ctrl-C: it saves, reports its end and exits
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours (a library's print)
            if isinstance(msg, dict) and isinstance(msg.get("event"), str):
                yield msg


def _stamps(root: Path) -> dict[str, tuple]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def changed_files(root: Path, sent: dict) -> tuple[dict[str, bytes], dict]:
    """The files under root that are new or changed since `sent` (their stamps), and the stamps now."""
    now = _stamps(root)
    return {rel: (root / rel).read_bytes() for rel, st in now.items() if sent.get(rel) != st}, now


def absorb(r, t, g, msg: dict) -> None:
    """One message of a track that ran elsewhere, into the run: its files into the track folder (best.json
    last, as runs.record_best writes it, naming the run's own graph folder and settings), its row into t
    and run.json, its event to the caller's on_event."""
    files = dict(msg.get("files") or {})
    best = files.pop("best.json", None)
    tdir = runs.track_dir(r.run_id, g.key)
    write_tree(tdir, files)
    if best is not None:
        b = json.loads(best)
        b.update(graph_dir=str(r.ws.graph_dir(g.key)), settings=asdict(r.settings))
        wsmod.write_json(tdir / "best.json", b)
    for k, v in (msg.get("row") or {}).items():
        if k not in ("key", "kind") and hasattr(t, k):
            setattr(t, k, v)
    r.save(t)
    if msg["event"] in ("profile", "profile-failed", "candidate", "accepted", "track"):  # "end": already said
        r.note(msg["event"], key=g.key, track=t, **{k: msg[k] for k in ("label", "error") if k in msg})


def lost(r, t, reason: str) -> None:
    """Mark t lost (its process or node died before it ended): unfinished, `--resume` runs it again."""
    t.status = "lost"
    t.reason = f"{reason}; `tilesmith optimize --resume {r.run_id}` runs it again"[:800]
    r.save(t)
    r.note("track", key=t.key, track=t)


def place(r, key: str, **where) -> None:
    """Record where a track runs (runs/<run-id>/<key>/placement.json): merged into what is there."""
    f = runs.track_dir(r.run_id, key) / "placement.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    try:
        old = json.loads(f.read_text())
    except (OSError, ValueError):
        old = {}
    wsmod.write_json(f, {**old, **where})


def epoch_deadline(r) -> float | None:
    """The run's --max-minutes deadline as wall-clock time, for processes on other machines."""
    return None if r.deadline is None else time.time() + (r.deadline - time.monotonic())

