"""`python -m tilesmith.scale.child DIR`: one shipped graph's track (tilesmith/scale/shipment.py) in a process
of its own: the ordinary optimize driver resuming the shipped run of one graph, in the private TILESMITH_HOME
its parent set. One JSON line per event on stdout, the last {"event": "end", "row": the track's row in
run.json}. SIGTERM, and the death of its parent, stop it as Ctrl-C stops `tilesmith optimize`: what was
confirmed is saved, and the end is still reported."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

# The stack a verdict is about, as far as it can be read without a CUDA context in this process: a node
# whose torch, triton, CUDA runtime or Python differ from the capture's would judge another program.
STACK = ("torch", "triton", "cuda_runtime", "python", "machine")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0])
    out = _own_stdout()
    _stop_with_parent()
    from tilesmith.scale.shipment import SHIP_FILE

    ship = json.loads((root / SHIP_FILE).read_text())
    rid, key = ship["run_id"], ship["key"]
    emit = _emitter(out)
    captured = json.loads((root / "ws" / "graphs" / key / "graph.json").read_text()).get("environment") or {}
    why = stack_mismatch(captured)
    if why:
        return _end(emit, rid, key, status="failed", reason=why)
    minutes = None
    if ship.get("deadline_epoch") is not None:
        minutes = (float(ship["deadline_epoch"]) - time.time()) / 60
        if minutes <= 0:  # queued past the run's --max-minutes: not started, the run says why
            return _end(emit, rid, key)
    from tilesmith.errors import TilesmithError
    from tilesmith.optimize import OptimizeSettings, optimize

    try:
        optimize(resume=rid, settings=OptimizeSettings(max_minutes=minutes), on_event=emit)
    except KeyboardInterrupt:
        pass  # the run marked the track interrupted and saved it
    except TilesmithError as e:
        return _end(emit, rid, key, status="failed", reason=e.message + (f" ({e.hint})" if e.hint else ""))
    return _end(emit, rid, key)


def _own_stdout():
    """The messages' stream: the original stdout, which from now on nothing else writes to (fd 1 goes to
    stderr, so a library's print cannot split a message)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _stop_with_parent() -> None:
    """SIGTERM when the process that started this one dies (a Ray worker killed with its node) and on
    SIGTERM: Ctrl-C's path (KeyboardInterrupt), so the driver saves and closes its workers."""
    signal.signal(signal.SIGTERM, _interrupt)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the line above
            raise SystemExit(1)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _emitter(out):
    def emit(kind: str, **kw) -> None:
        if kind == "run":
            return
        msg = {"event": kind}
        if kw.get("track") is not None:
            msg["row"] = asdict(kw["track"])
        msg.update({k: str(kw[k]) for k in ("label", "error") if k in kw})
        out.write(json.dumps(msg, default=str) + "\n")
        out.flush()

    return emit


def _end(emit, rid: str, key: str, **change) -> int:
    """Report the track's row as run.json has it (with `change` applied and saved), last."""
    from tilesmith import runs
    from tilesmith.optimize import TrackResult

    run = runs.load_run(rid)
    row = {**(run.graphs.get(key) or {}), **change}
    if change:
        run.graphs[key] = row
        run.save()
        emit("track", track=TrackResult(**row))
    emit("end", track=TrackResult(**row))
    return 0


def stack_mismatch(captured: dict) -> str:
    """Why this machine cannot judge a graph captured on `captured` (graph.json's environment), or ""."""
    import platform

    import torch

    from tilesmith.environment import triton_version

    here = {"torch": torch.__version__, "triton": triton_version(), "cuda_runtime": torch.version.cuda,
            "python": platform.python_version(), "machine": platform.machine()}
    diff = [f"{k} {here[k]} here, {captured.get(k)} at capture" for k in STACK
            if k in captured and captured.get(k) != here[k]]
    if not diff:
        return ""
    return (f"this machine's stack is not the one the graph was captured on ({'; '.join(diff)}): a verdict "
            "here would not hold for the graph's key")


if __name__ == "__main__":
    sys.exit(main())
