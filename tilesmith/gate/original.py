"""The original's side of a gate decision: its outputs and float64 reference on each seed's input sets,
and its per-call time alone, from a reference worker that never loads the candidate (or from this
process's cache of them), plus the input-set files the workers read.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from tilesmith.errors import TilesmithError
from tilesmith.gate.proc import calm_spares
from tilesmith.gate.verdict import Policy
from tilesmith.workspace import WRAPPER_FILE


def save_sets(path: Path, named_sets: list, torch) -> None:
    torch.save({"inputs": [inputs for _, inputs in named_sets]}, path)


def load_raw(path: Path, torch):
    """Raw results a worker wrote: tensors and plain containers only (weights_only), then the file goes."""
    try:
        return torch.load(path, weights_only=True)
    finally:
        path.unlink(missing_ok=True)


# The original's results depend only on the graph's files, the device and the input sets: judging many
# candidates for one graph (an optimizer's loop, a test suite) reuses them. Kept in this (trusted)
# process only; a file cache could be written by candidate code.
_REF_CACHE: dict = {}  # (graph id, seed, random_sets, pair, device) -> {"base": ..., "ref64": ...}
_SOLO_CACHE: dict = {}  # (graph id, device, rotating_sets) -> per-call ns of the original alone
_REF_CACHE_SEEDS = 8


def _graph_id(gdir: Path) -> tuple:
    """The graph's content (wrapper and metadata hashed; the data file by size and mtime, it can be large)."""
    h = hashlib.sha256()
    for f in (WRAPPER_FILE, "graph.json"):
        p = gdir / f
        h.update(p.read_bytes() if p.exists() else b"")
    st = os.stat(gdir / "data.pt")
    return (h.hexdigest(), st.st_size, st.st_mtime_ns)


class Reference:
    """The original's outputs and float64 reference for every seed, and its solo per-call time: from the
    cache, or from a reference worker (never loads the candidate) run in a background thread."""

    def __init__(self, gdir: Path, sets: dict, pair, scratch: Path, device: str, policy: Policy, clock,
                 quiet_first: list):
        gid = _graph_id(gdir)
        self._keys = {s: (gid, s, policy.random_sets, tuple(pair), device) for s in sets}
        self._solo_key = (gid, device, policy.rotating_sets)
        self.quiet = threading.Event()
        self.error = None
        self.worker = None
        self._thread = None
        missing = {s: named for s, named in sets.items() if self._keys[s] not in _REF_CACHE}
        if missing or self._solo_key not in _SOLO_CACHE:
            from tilesmith.gate.proc import start_worker

            self.worker = start_worker("reference", scratch, device)
            args = (gdir, missing, sets, pair, scratch, device, policy, clock, quiet_first)
            self._thread = threading.Thread(target=self._run, args=args, daemon=True)
            self._thread.start()

    @property
    def done(self) -> bool:
        return self._thread is None or (not self._thread.is_alive() and self.error is None)

    def _run(self, gdir, missing, sets, pair, scratch, device, policy, clock, quiet_first) -> None:
        t0 = time.monotonic()
        try:
            per_seed, solo = _reference(self.worker, gdir, missing, sets, pair, scratch, device, policy,
                                        self.quiet, quiet_first, clock)
            for s, r in per_seed.items():
                while len(_REF_CACHE) >= _REF_CACHE_SEEDS:
                    _REF_CACHE.pop(next(iter(_REF_CACHE)))
                _REF_CACHE[self._keys[s]] = r
            _SOLO_CACHE[self._solo_key] = solo
        except BaseException as e:  # re-raised by get() in the deciding thread
            self.error = e
        finally:
            self.worker.close()
            clock.add("reference", time.monotonic() - t0)

    def calm(self) -> None:
        """The deciding thread's worker is idle: the reference may time the original alone."""
        self.quiet.set()

    def get(self) -> dict:
        """{"base": {seed: ...}, "ref64": {seed: ... | None}, "per_call_ns": float}, waiting if need be."""
        from tilesmith.gate.proc import WorkerFailure

        self.calm()
        if self._thread is not None:
            self._thread.join()
        if isinstance(self.error, WorkerFailure):
            e = self.error
            raise TilesmithError(f"the original wrapper fails in a gate worker ({e.code}): {e.message}",
                                 code="baseline-failed", hint="check `tilesmith replay GRAPH_DIR` first") from None
        if self.error is not None:
            raise self.error
        out = {"base": {}, "ref64": {}, "per_call_ns": _SOLO_CACHE[self._solo_key]}
        for s, k in self._keys.items():
            out["base"][s], out["ref64"][s] = _REF_CACHE[k]["base"], _REF_CACHE[k]["ref64"]
        return out

    def close(self) -> None:
        """Stop a reference that is still running (the candidate failed before it was needed)."""
        self.quiet.set()
        if self._thread is not None and self._thread.is_alive():
            self.worker.kill()
            self._thread.join()


def _reference(w, gdir, missing: dict, sets: dict, pair, scratch: Path, device: str, policy: Policy,
               quiet, quiet_first: list, clock) -> tuple[dict, float]:
    """The original alone, in worker `w`: outputs and the float64 reference on every set of the seeds in
    `missing`, then (once `quiet` is set and the workers in quiet_first are idle) a solo per-call time
    that sizes timed samples and bounds the paired baseline."""
    import statistics

    import torch

    out = {}
    text = (Path(gdir) / WRAPPER_FILE).read_text()
    with clock("reference.load"):
        w.request({"op": "load", "graph_dir": str(gdir), "baseline": True, "device": device}, policy.load_timeout_s)
    for seed, named in missing.items():
        f, o = scratch / f"sets-ref-{seed}.pt", scratch / f"ref-{seed}.pt"
        save_sets(f, named, torch)
        with clock("reference.outputs"):
            w.request({"op": "outputs", "role": "baseline", "sets_file": str(f), "out_file": str(o),
                       "pair": list(pair)}, policy.call_timeout_s)
        base = load_raw(o, torch)
        with clock("reference.ref64"):
            r = w.request({"op": "ref64", "sets_file": str(f), "out_file": str(o), "wrapper_text": text},
                          policy.call_timeout_s)
        out[seed] = {"base": base, "ref64": load_raw(o, torch)["outputs"] if r.get("available") else None}
        f.unlink()
    f = scratch / "rotating-ref.pt"
    save_sets(f, rotating(next(iter(sets.values())), policy), torch)
    w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline"], "mode": "launch"},
              policy.call_timeout_s)
    f.unlink()
    # Alone means alone: other workers busy on the same cores (or GPU) would inflate the solo time.
    quiet.wait(policy.load_timeout_s + policy.call_timeout_s)
    for p in quiet_first:
        p.idle()
    calm_spares()
    r = w.request({"op": "time", "rounds": 7, "reps": 1, "roles": ["baseline"]}, policy.call_timeout_s)
    return out, max(1000.0, float(statistics.median(r["ns"]["baseline"])))


def rotating(named_sets: list, policy: Policy) -> list:
    randoms = [s for s in named_sets if s[0] not in ("captured", "zeros", "large")]
    return (randoms or named_sets)[: max(1, policy.rotating_sets)]
