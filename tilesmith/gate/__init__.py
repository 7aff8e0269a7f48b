"""The gate: `judge(graph_dir, candidate_path, policy) -> Verdict`, proving a candidate wrapper correct
and faster than the original, stage by stage, cheapest first (DESIGN.md "The gate").

Candidate code runs only in worker subprocesses (gate/worker.py via gate/proc.py). The original's
outputs come from a separate reference worker that never loads the candidate, and every comparison
and statistic is computed here, from raw tensors and raw nanosecond samples.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import threading
import time
from pathlib import Path

from tilesmith import paths
from tilesmith.errors import TilesmithError
from tilesmith.gate.original import Reference, load_raw, rotating, save_sets
from tilesmith.gate.proc import calm_spares, refill_spares, usable_cores
from tilesmith.gate.verdict import MODES, STAGES, Pass, Policy, Reason, SetCorrectness, Timing, Verdict
from tilesmith.workspace import load_graph_json

__all__ = ["judge", "Policy", "Verdict", "Reason", "Pass", "SetCorrectness", "Timing", "STAGES", "MODES"]


def judge(graph_dir, candidate_path, policy: Policy | None = None, on_progress=None) -> Verdict:
    """Judge one candidate wrapper for a captured graph; never raises for a bad candidate, only for bad usage.

    on_progress(stage, message) is called as stages start.
    """
    policy = policy or Policy()
    t0 = time.monotonic()
    gdir = paths.absolute(graph_dir)  # workers run in folders of their own: no relative path reaches them
    meta = load_graph_json(gdir)
    try:
        raw = paths.absolute(candidate_path).read_bytes()
    except OSError as e:
        raise TilesmithError(f"cannot read the candidate {paths.shown(candidate_path)}: {e.strerror}", code="no-candidate",
                             hint="pass the path of a Python file defining call(args)") from None
    mode = resolve_mode(policy.mode, meta)
    v = Verdict(False, "static", meta.get("key", gdir.name), hashlib.sha256(raw).hexdigest(),
                min_improvement=policy.min_improvement, checked_only=policy.correctness_only)
    note = on_progress or (lambda stage, message: None)
    note("static", "screening the source")
    from tilesmith.gate.static import screen

    try:
        findings = screen(raw.decode())
    except UnicodeDecodeError:
        findings = []
        v.reasons.append(Reason("static-syntax", "the candidate is not UTF-8 text"))
    v.reasons += [Reason(f.code, f"line {f.line}: {f.message}") for f in findings]
    if not v.reasons:
        with tempfile.TemporaryDirectory(prefix="tilesmith-gate-") as scratch:
            _run(v, gdir, meta, raw, Path(scratch), policy, mode, note)
    v.wall_s = time.monotonic() - t0
    return v


def resolve_mode(mode: str, meta: dict) -> str:
    """auto: CUDA-graph replay for graphs compiled with CUDA graphs, plain launches otherwise."""
    if mode not in MODES:
        raise TilesmithError(f"unknown timing mode {mode!r}", code="usage", hint="use auto, launch or graph")
    cuda = str(meta.get("device", "")).startswith("cuda")
    if mode == "auto":
        return "graph" if cuda and meta.get("compile_mode") == "cudagraphs" else "launch"
    if mode == "graph" and not cuda:
        raise TilesmithError("graph mode needs a CUDA graph; this one runs on " + str(meta.get("device")),
                             code="usage", hint="use --mode launch")
    return mode


def own_replay(text: str) -> bool:
    """Whether a wrapper replays its own launches from CUDA graphs (tilesmith.cudagraph)."""
    return "from tilesmith.cudagraph import graphed" in text and "graphed(call)" in text


def graph_device(meta: dict) -> str:
    """The device a captured graph runs on: its first CUDA tensor input's, else cpu."""
    for i in meta.get("inputs", []):
        if i.get("kind") == "tensor" and str(i.get("device", "")).startswith("cuda"):
            return i["device"]
    return "cpu"


def _run(v: Verdict, gdir: Path, meta: dict, raw: bytes, scratch: Path, policy: Policy, mode: str, note) -> None:
    import torch

    from tilesmith import loading
    from tilesmith.gate.inputs import derive_seed, make_sets
    from tilesmith.gate.proc import WorkerFailure, start_worker

    clock = _Clock(v.stage_seconds)
    cand = scratch / "candidate.py"
    cand.write_bytes(raw)  # the judged bytes: later edits of the user's file cannot change what runs
    timing_base = None
    if policy.timing_baseline:
        base_raw = Path(policy.timing_baseline).read_bytes()
        timing_base = scratch / "timing_baseline.py"
        timing_base.write_bytes(base_raw)
        v.timing_baseline_sha256 = hashlib.sha256(base_raw).hexdigest()
    with clock("inputs"):
        data = loading.load_graph_data(gdir, device_map="cpu")
        seeds = [policy.seed, derive_seed(policy.seed, "confirmation") % (1 << 31)]
        sets = {s: make_sets(meta, data.inputs, s, policy.random_sets) for s in seeds}
    device = graph_device(meta)
    pair = (1, 2) if policy.random_sets >= 2 else (0, len(sets[seeds[0]]) - 1)
    modes = {}
    if mode == "graph" and own_replay(raw.decode()):
        # Inductor replays the original from a CUDA graph; the candidate replays itself (the runtime turns
        # Inductor's CUDA graphs off for a graph whose artifact does): each timed the way it would run.
        modes = {"candidate": "launch"}
        if timing_base is not None and own_replay(timing_base.read_text()):
            modes["baseline"] = "launch"  # the best so far replays itself too: like with like
        v.warnings.append(Reason("own-replay", "the candidate replays its own CUDA graph: timed as plain calls "
                                               "against the original's whole-graph replay (graph mode)"))
    ctx = dict(gdir=gdir, cand=cand, timing_base=timing_base, scratch=scratch, device=device, policy=policy, mode=mode,
               modes=modes, pair=pair, note=note, torch=torch, WorkerFailure=WorkerFailure, clock=clock)
    note("load", "starting workers; the original runs in its own reference worker")
    # Every worker starts now, before candidate code runs anywhere, so their interpreters, imports, CUDA
    # contexts and baseline loads overlap one another and the reference run; each is still fresh (no
    # candidate code in it) when its candidate arrives, and the confirmation's is a different process
    # with new seeds. A live sibling worker gives a candidate nothing to attack that the deciding
    # process (same user, alive throughout) does not already offer.
    # On a machine with few cores a third interpreter starting alongside would slow the other two
    # down and is wasted when the first pass rejects: there the confirmation's worker starts after it.
    early = policy.confirm and usable_cores() >= policy.prestart_min_cores
    preps = [_Prepared(start_worker("candidate", scratch, device), ctx)]
    if early:
        preps.append(_Prepared(start_worker("candidate", scratch, device), ctx))
    ref = Reference(gdir, sets, pair, scratch, device, policy, clock, quiet_first=preps[1:])
    try:
        v.first = Pass(seed=seeds[0])
        ok = _pass(v, v.first, sets[seeds[0]], ctx, preps[0], ref, others=preps[1:], confirmation=False)
        preps[0].close()  # the first candidate's process is gone before the confirmation runs
        v.reference64 = ref.done and ref.get()["ref64"][seeds[0]] is not None
        if not ok:
            return
        if not policy.confirm:
            v.accepted = True
            return
        if not early:
            preps.append(_Prepared(start_worker("candidate", scratch, device), ctx))
        v.confirmation = Pass(seed=seeds[1])
        v.accepted = _pass(v, v.confirmation, sets[seeds[1]], ctx, preps[1], ref, others=[], confirmation=True)
    finally:
        ref.close()
        for w in preps:
            w.close()
        refill_spares(device)
    t1, t2 = v.first.timing, v.confirmation.timing
    if v.accepted and max(t1.speedup, t2.speedup) > policy.suspicious_speedup \
            and not 0.5 <= t2.speedup / t1.speedup <= 2.0:
        v.accepted = False
        v.reasons.append(Reason("suspicious-speedup", f"a {t1.speedup:.1f}x speedup did not reproduce in the "
                                                      f"confirmation ({t2.speedup:.1f}x)"))


class _Clock:
    """Adds wall seconds per step into a Verdict's stage_seconds."""

    def __init__(self, into: dict):
        self.into = into

    @contextlib.contextmanager
    def __call__(self, key: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(key, time.monotonic() - t0)

    def add(self, key: str, seconds: float) -> None:
        self.into[key] = round(self.into.get(key, 0.0) + seconds, 4)


class _Prepared:
    """A candidate worker started early: in a background thread it finishes its imports and loads the
    baseline (trusted code only) while the deciding thread does other work."""

    def __init__(self, worker, ctx: dict):
        self.worker = worker
        self.error = None
        self.startup_s = None
        self._thread = threading.Thread(target=self._prepare, args=(ctx,), daemon=True)
        self._thread.start()

    def _prepare(self, ctx: dict) -> None:
        policy = ctx["policy"]
        try:
            self.startup_s = self.worker.request({"op": "ready"}, policy.load_timeout_s).get("startup_s")
            self.worker.request({"op": "load", "graph_dir": str(ctx["gdir"]), "baseline": True,
                                 "baseline_file": str(ctx["timing_base"]) if ctx["timing_base"] else None,
                                 "device": ctx["device"]}, policy.load_timeout_s)
        except BaseException as e:  # re-raised by wait() in the deciding thread
            self.error = e

    def idle(self) -> None:
        """Block until the preparation is over (the worker then waits on stdin, using nothing)."""
        self._thread.join()

    def wait(self):
        """The prepared worker, or the WorkerFailure that ended its preparation."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.worker

    def close(self) -> None:
        if self._thread.is_alive():
            self.worker.kill()  # ends the pending request: the thread sees the worker die and returns
            self._thread.join()
        self.worker.close()


def _pass(v: Verdict, p: Pass, named_sets: list, ctx: dict, prep: _Prepared, ref: Reference, others: list,
          confirmation: bool) -> bool:
    """Load, correctness and timing in one fresh candidate worker; False (with reasons) at the first failure."""
    from tilesmith.gate import timing

    torch, policy, scratch, note, clock = ctx["torch"], ctx["policy"], ctx["scratch"], ctx["note"], ctx["clock"]
    stage = (lambda s: "confirmation") if confirmation else (lambda s: s)
    key = "confirmation" if confirmation else "first"
    reasons = []
    try:
        v.stage = stage("load")
        note(v.stage, "loading the candidate in a fresh worker")
        with clock(f"{key}.start"):  # interpreter, imports, CUDA context and baseline load, if not over yet
            w = prep.wait()
        clock.add(f"{key}.worker_imports", prep.startup_s or 0.0)  # inside the worker, overlapped with other work
        with clock(f"{key}.load"):
            w.request({"op": "load", "graph_dir": str(ctx["gdir"]), "candidate": str(ctx["cand"]),
                       "device": ctx["device"]}, policy.load_timeout_s)
        v.stage = stage("correctness")
        note(v.stage, f"comparing outputs on {len(named_sets)} input sets")
        f, o = scratch / f"sets-{p.seed}.pt", scratch / f"cand-{p.seed}.pt"
        with clock(f"{key}.outputs"):
            save_sets(f, named_sets, torch)
            w.request({"op": "outputs", "role": "candidate", "sets_file": str(f), "out_file": str(o),
                       "pair": list(ctx["pair"])}, policy.call_timeout_s)
            f.unlink()
        try:
            got = load_raw(o, torch)
        except Exception as e:
            v.reasons.append(Reason("protocol", f"the candidate worker's outputs are unreadable: {e}"[:300]))
            return False
        ref.calm()  # this worker is idle until the reference is in: the original may be timed alone
        with clock("reference_wait"):
            r = ref.get()
        base, ref64 = r["base"][p.seed], r["ref64"][p.seed]
        with clock(f"{key}.compare"):
            try:
                reasons = _compare(p, named_sets, got, base, ref64, ctx["pair"])
            except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as e:
                reasons = [Reason("protocol", f"the candidate worker's outputs are malformed: {e!r}"[:300])]
        if reasons:
            v.reasons += reasons
            return False
        if policy.correctness_only:  # a check, not a decision: correct so far, never accepted
            return False
        v.stage = stage("timing")
        note(v.stage, f"timing ({ctx['mode']}), paired and interleaved")
        f = scratch / f"rotating-{p.seed}.pt"
        with clock(f"{key}.timing_setup"):
            save_sets(f, rotating(named_sets, policy), torch)
            w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline", "candidate"],
                       "mode": ctx["mode"], "modes": ctx["modes"]}, policy.call_timeout_s)
            f.unlink()
        with clock(f"{key}.quiesce"):  # no other worker may be busy while samples are taken
            for other in others:
                other.idle()
            calm_spares()
        reps = max(1, min(100000, round(policy.target_sample_ms * 1e6 / r["per_call_ns"])))
        with clock(f"{key}.timing"):
            p.timing, reasons = timing.measure(w, policy, ctx["mode"], reps, r["per_call_ns"])
        if p.timing:
            clock.add(f"{key}.timed", (sum(p.timing.baseline_ns) + sum(p.timing.candidate_ns)) / 1e9)
    except ctx["WorkerFailure"] as e:
        v.reasons.append(Reason(e.code, f"{v.stage}: {e.message}"))
        return False
    if p.timing and p.timing.speedup > policy.suspicious_speedup:
        v.warnings.append(Reason("suspicious-speedup", f"{p.timing.speedup:.1f}x is above "
                                 f"{policy.suspicious_speedup:g}x: confirmed in a fresh worker before acceptance"))
    solo_ms = r["per_call_ns"] / 1e6
    if p.timing and p.timing.baseline_ms > 5 * solo_ms and p.timing.baseline_ms > solo_ms + 1.0:
        # A warning, not a verdict: on a shared machine the solo time can be unlucky; the paired
        # design still compares like with like, and the warning shows up in reports.
        v.warnings.append(Reason("baseline-slowed", f"the original took {p.timing.baseline_ms:.3f} ms per call next to "
                              f"the candidate but {solo_ms:.3f} ms alone: the candidate may slow it down"))
    v.reasons += reasons
    return not reasons


def _compare(p: Pass, named_sets: list, got: dict, base: dict, ref64, pair) -> list[Reason]:
    """Every set, then the same-buffer pair; fills p.correctness and returns the reasons to reject."""
    from tilesmith.gate import correctness

    reasons = []
    if len(got["sets"]) != len(named_sets):
        return [Reason("protocol", f"the candidate worker returned {len(got['sets'])} sets, not {len(named_sets)}")]
    for k, (name, _) in enumerate(named_sets):
        r = correctness.compare_set(name, got["sets"][k], base["sets"][k], ref64[k] if ref64 else None)
        p.correctness.append(r.summary)
        reasons += r.reasons
    i, j = pair
    return reasons + correctness.compare_pair((named_sets[i][0], named_sets[j][0]), got["pair"],
                                              base["sets"][i], base["sets"][j])
