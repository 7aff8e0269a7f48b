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
from tilesmith.gate.context import DecisionContext
from tilesmith.gate.spares import calm_spares
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
_REF_CACHE: dict = {}  # (graph id, seed, random_sets, rotating_sets, pair, device) -> {"base", "ref64"}
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


def timing_contents(meta: dict, inputs: list, seed: int, policy: Policy) -> list:
    """The input contents timed calls rotate through: twice as many random sets as rotating buffers, drawn
    from their own seed (not the correctness sets), so the buffers' values change between samples."""
    from tilesmith.gate.inputs import derive_seed, draw_sets, parameter_indices

    # Parameters keep one value through the timed calls, as a program's weights do between steps: the
    # workers time them in one buffer at one address (a replay reads weights in place). Correctness
    # varies them; the checked timed calls compare against the original on these same values.
    n = 2 * max(1, policy.rotating_sets)
    return draw_sets(meta, inputs, derive_seed(seed, "timing") % (1 << 31), n, shared=parameter_indices(meta))


class Reference:
    """The original's side of a decision, in a worker that never loads the candidate: its outputs and
    float64 reference for every seed's sets, its solo per-call time
    (from this process's cache where it has them), and then, kept open, the baseline's timed samples."""

    def __init__(self, gdir: Path, sets: dict, contents: dict, pair, ctx: DecisionContext, quiet_first: list,
                 specials: dict | None = None):
        policy, device = ctx.policy, ctx.device
        gid = _graph_id(gdir)
        self._keys = {s: (gid, s, policy.random_sets, policy.rotating_sets, tuple(pair), device) for s in sets}
        self._solo_key = (gid, device, policy.rotating_sets)
        self.quiet = threading.Event()
        self._closing = threading.Event()  # close() is stopping the thread: a failed request is not the original's
        self.error = None
        self.base_role = "best" if ctx.timing_base else "baseline"
        # The worker that times the baseline apart: one of its own that loads the baseline and nothing
        # else, so that it carries no history of code the candidate's worker never ran (the float64
        # reference's eager ops, an OpenMP pool they grew). The reference worker as timer measured the
        # original against itself at up to 1.24x on the oversubscribed example; this one, up to 1.15x.
        # A correctness-only check (the agent's `check`) times nothing: no timer.
        # With a pool of spares (decisions back to back), both are kept for the next decision on the same
        # graph (and, for the timer, the same baseline): they never run candidate code.
        spares = ctx.spares
        base_sha = ctx.timing_base_sha
        self._kept_keys = ({"reference": spares.trusted_key(device, (str(gdir),), str(gdir), gid),
                            "timer": spares.trusted_key(device, (str(gdir),), str(gdir), gid, base_sha)}
                           if spares is not None else {})
        self.reused: set[str] = set()  # the roles whose worker was kept from an earlier decision
        self.worker = self._worker("reference", ctx, gdir)
        self.timer = None if policy.correctness_only else self._worker("timer", ctx, gdir)
        missing = {s: named for s, named in sets.items() if self._keys[s] not in _REF_CACHE}
        # Each seed's special-value sets (gate/inputs.py special_sets), run apart from the others: the original
        # may fail on NaN in its inputs (an index computed from a float), and that must not fail the decision.
        self._specials = {s: (specials or {}).get(s) or [] for s in missing}
        args = (gdir, missing, contents[next(iter(contents))], pair, ctx, quiet_first)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _worker(self, role: str, ctx: DecisionContext, gdir: Path):
        from tilesmith.gate.proc import Worker
        from tilesmith.gate.spares import start_worker

        spares = ctx.spares
        if spares is None:
            return start_worker(role, ctx.scratch, ctx.device, (gdir,))
        w = spares.reuse(role, self._kept_keys[role])
        if w is not None:
            self.reused.add(role)
            return w
        return Worker(role, spares.home, ctx.device, (gdir,))  # its folder outlives this decision's

    def _restart(self, ctx: DecisionContext, gdir: Path):
        """A fresh reference worker, loaded, in place of the one closed when the original failed on the
        special-value sets (a failed request ends its worker)."""
        from tilesmith.gate.proc import Worker
        from tilesmith.gate.spares import start_worker

        self.worker.close()
        if self._closing.is_set():  # killed by close(), not failed on its own: nothing to go on with
            raise RuntimeError("the decision ended while the reference ran the special-value sets")
        self.reused.discard("reference")
        spares = ctx.spares
        self.worker = (start_worker("reference", ctx.scratch, ctx.device, (gdir,)) if spares is None
                       else Worker("reference", spares.home, ctx.device, (gdir,)))
        self.worker.request({"op": "load", "graph_dir": str(gdir), "baseline": True, "device": ctx.device},
                            ctx.policy.load_timeout_s)
        return self.worker

    @property
    def done(self) -> bool:
        return not self._thread.is_alive() and self.error is None

    def _run(self, gdir, missing, first_contents, pair, ctx, quiet_first) -> None:
        t0 = time.monotonic()
        try:
            per_seed, solo = _reference(self.worker, gdir, missing, first_contents, pair, ctx, self.quiet,
                                        quiet_first, None if self._solo_key not in _SOLO_CACHE else 0.0,
                                        loaded="reference" in self.reused, specials=self._specials,
                                        restart=lambda: self._restart(ctx, gdir))
            for s, r in per_seed.items():
                while len(_REF_CACHE) >= _REF_CACHE_SEEDS:
                    _REF_CACHE.pop(next(iter(_REF_CACHE)))
                _REF_CACHE[self._keys[s]] = r
            if solo:
                _SOLO_CACHE[self._solo_key] = solo
            base = {"baseline": True}
            if self.timer is None or "timer" in self.reused:
                return
            if ctx.timing_base:
                best = self.timer.dir / "timing_baseline.py"
                best.write_bytes(Path(ctx.timing_base).read_bytes())
                base = {"best_file": str(best)}
            with ctx.clock("timer.load"):
                self.timer.request({"op": "load", "graph_dir": str(gdir), "device": ctx.device, **base},
                                   ctx.policy.load_timeout_s)
        except BaseException as e:  # re-raised by get() in the deciding thread
            self.error = e
        finally:
            ctx.clock.add("reference", time.monotonic() - t0)

    def calm(self) -> None:
        """The deciding thread's worker is idle: the reference may time the original alone."""
        self.quiet.set()

    def get(self) -> dict:
        """{"base"|"ref64"|"special": {seed: ...}, "per_call_ns": float}, waiting if need be. A seed's "special":
        None (no special-value sets), or {"names", "base", "ref64", "error"}: the sets the original runs on, its
        outputs and float64 reference on them, and how it failed on the others."""
        from tilesmith.gate.proc import WorkerFailure

        self.calm()
        self._thread.join()
        if isinstance(self.error, WorkerFailure):
            e = self.error
            raise TilesmithError(f"the original wrapper fails in a gate worker ({e.code}): {e.message}",
                                 code="baseline-failed", hint="check `tilesmith replay GRAPH_DIR` first") from None
        if self.error is not None:
            raise self.error
        out = {"base": {}, "ref64": {}, "special": {}, "per_call_ns": _SOLO_CACHE[self._solo_key]}
        for s, k in self._keys.items():
            for part in ("base", "ref64", "special"):
                out[part][s] = _REF_CACHE[k].get(part)
        return out

    def close(self, spares=None) -> None:
        """Stop the reference worker (still running when the candidate failed before it was needed); with
        `spares`, keep the reference and timer workers for the next decision when they are idle and well."""
        self.quiet.set()
        self._closing.set()
        workers = {r: w for r, w in (("reference", self.worker), ("timer", self.timer)) if w is not None}
        if self._thread.is_alive():
            for w in workers.values():
                w.kill()
            self._thread.join()
        if self.worker is not workers.get("reference"):  # replaced by _restart before the kill reached it
            workers["reference"].close()
            workers["reference"] = self.worker
        for role, w in workers.items():
            # The thread has ended: without an error, both workers did all they were asked and are idle.
            if spares is not None and self.error is None and role in self._kept_keys:
                spares.keep(role, self._kept_keys[role], w)
            else:
                w.close()


def _reference(w, gdir, missing: dict, first_contents: list, pair, ctx: DecisionContext, quiet, quiet_first: list,
               solo_known, loaded: bool = False, specials: dict | None = None, restart=None) -> tuple[dict, float | None]:
    """The original alone, in worker `w`: outputs and the float64 reference on every set of the seeds in
    `missing`, and on their `specials` (where the original fails on those, `restart()` gives the worker to go
    on with); then (once `quiet` is set and the workers in
    quiet_first are idle) a solo per-call time that sizes timed samples, unless `solo_known`."""
    import torch

    from tilesmith.gate.sizing import solo_ns

    policy, clock, device = ctx.policy, ctx.clock, ctx.device
    out = {}
    text = (Path(gdir) / WRAPPER_FILE).read_text()
    if not loaded:  # a kept reference worker has it loaded
        with clock("reference.load"):
            w.request({"op": "load", "graph_dir": str(gdir), "baseline": True, "device": device}, policy.load_timeout_s)
    for seed, named in missing.items():
        f, o = w.dir / f"sets-ref-{seed}.pt", w.dir / f"ref-{seed}.pt"
        save_sets(f, named, torch)
        with clock("reference.outputs"):
            w.request({"op": "outputs", "role": "baseline", "sets_file": str(f), "out_file": str(o),
                       "pair": list(pair)}, policy.call_timeout_s)
        base = load_raw(o, torch)
        with clock("reference.ref64"):
            r = w.request({"op": "ref64", "sets_file": str(f), "out_file": str(o), "wrapper_text": text},
                          policy.call_timeout_s)
        ref64 = load_raw(o, torch)["outputs"] if r.get("available") else None
        out[seed] = {"base": base, "ref64": ref64, "special": None}
        f.unlink()
    todo = {seed: named for seed, named in (specials or {}).items() if named}
    if todo:
        w = _special_outputs(w, gdir, todo, ctx, out, restart)
    if solo_known is not None:
        return out, None
    f = w.dir / "rotating-ref.pt"
    save_sets(f, first_contents, torch)
    w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline"], "mode": "launch",
               "buffers": policy.rotating_sets}, policy.call_timeout_s)
    f.unlink()
    # Alone means alone: other workers busy on the same cores (or GPU) would inflate the solo time.
    quiet.wait(policy.load_timeout_s + policy.call_timeout_s)
    for p in quiet_first:
        p.idle()
    calm_spares()
    return out, solo_ns(w, "baseline", policy.call_timeout_s)


def _special_outputs(w, gdir, specials: dict, ctx: DecisionContext, out: dict, restart):
    """Into out[seed]["special"], {"names", "base", "ref64", "error"}: the original's outputs and float64 reference on
    those of the seed's special-value sets it runs on, each set in a request of its own. A set the original fails on
    (NaN reaching an index: its own behaviour, not a candidate's fault) is left out, for every seed, and "error"
    says how it failed; `restart()` gives the worker to go on with. Returns the worker."""
    import torch

    from tilesmith.gate.proc import WorkerFailure

    policy, clock = ctx.policy, ctx.clock
    text = (Path(gdir) / WRAPPER_FILE).read_text()
    failed: dict = {}  # set name -> how the original failed on it
    for seed, named in specials.items():
        kept, bases = [], []
        f, o = w.dir / f"sets-special-{seed}.pt", w.dir / f"special-{seed}.pt"
        for name, inputs in named:
            if name in failed:
                continue
            save_sets(f, [(name, inputs)], torch)
            try:
                with clock("reference.special"):
                    w.request({"op": "outputs", "role": "baseline", "sets_file": str(f), "out_file": str(o),
                               "pair": []}, policy.call_timeout_s)
            except WorkerFailure as e:
                failed[name] = f"set {name}: {e.code}: {e.message}"[:300]
                w = restart()
                f, o = w.dir / f.name, w.dir / o.name
                continue
            kept.append((name, inputs))
            bases.append(load_raw(o, torch)["sets"][0])
        ref64 = None
        if kept:
            save_sets(f, kept, torch)
            with clock("reference.special"):
                r = w.request({"op": "ref64", "sets_file": str(f), "out_file": str(o), "wrapper_text": text},
                              policy.call_timeout_s)
            ref64 = load_raw(o, torch)["outputs"] if r.get("available") else None
        f.unlink(missing_ok=True)
        out[seed]["special"] = {"names": [n for n, _ in kept], "base": {"sets": bases}, "ref64": ref64,
                                "error": "; ".join(failed.values())}
    return w


def rotating(named_sets: list, policy: Policy) -> list:
    randoms = [s for s in named_sets if s[0] not in ("captured", "zeros", "large", "captured-weights")]
    return (randoms or named_sets)[: max(1, policy.rotating_sets)]
