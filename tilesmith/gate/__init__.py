"""The gate: `judge(graph_dir, candidate_path, policy) -> Verdict`, proving a candidate wrapper correct
and faster than the original, stage by stage, cheapest first (DESIGN.md "The gate").

Candidate code runs only in worker subprocesses (the package gate/worker, started and spoken to by gate/proc.py,
kept warm by gate/spares.py). The original's outputs come from a separate reference worker that never loads the
candidate, and every comparison and statistic is computed here, from raw tensors and raw nanosecond samples and
the kernel's timestamps of each timed window's marks (gate/windows.py, gate/marksock.py).
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from pathlib import Path

from tilesmith import paths
from tilesmith.errors import TilesmithError
from tilesmith.gate.context import DecisionContext, StageClock
from tilesmith.gate.original import Reference, load_raw, save_sets
from tilesmith.gate import refill as parent_refill, timed
from tilesmith.gate.modes import own_replay, resolve_mode, role_modes
from tilesmith.gate.proc import WorkerFailure
from tilesmith.gate.spares import usable_cores
from tilesmith.gate.verdict import MODES, STAGES, Pass, Policy, Reason, SetCorrectness, Timing, Verdict
from tilesmith.workspace import load_graph_json

__all__ = ["judge", "Policy", "Verdict", "Reason", "Pass", "SetCorrectness", "Timing", "STAGES", "MODES", "own_replay",
           "resolve_mode"]


def judge(graph_dir, candidate_path, policy: Policy | None = None, on_progress=None, spares=None) -> Verdict:
    """Judge one candidate wrapper for a captured graph; never raises for a bad candidate, only for bad usage.

    on_progress(stage, message) is called as stages start. spares: a pool from gate.spares.keep_spares whose
    started workers this decision may take (None: every worker starts fresh).
    """
    from tilesmith.launch import sandbox

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
                min_improvement=policy.min_improvement, checked_only=policy.correctness_only,
                sandbox=sandbox.level(), allow_nonfinite_differences=policy.allow_nonfinite_differences)
    note = on_progress or (lambda stage, message: None)
    note("static", "screening the source")
    from tilesmith.gate import static

    try:
        text = raw.decode()
        findings = static.screen(text) or static.allowlist(text)  # the allowlist reads what the screen let through
    except UnicodeDecodeError:
        findings = []
        v.reasons.append(Reason("static-syntax", "the candidate is not UTF-8 text"))
    v.reasons += [Reason(f.code, f"line {f.line}: {f.message}") for f in findings]
    if not v.reasons:
        with tempfile.TemporaryDirectory(prefix="tilesmith-gate-") as scratch:
            _run(v, gdir, meta, raw, Path(scratch), policy, mode, note, spares)
    v.wall_s = time.monotonic() - t0
    return v


def graph_device(meta: dict) -> str:
    """The device a captured graph runs on: its first CUDA tensor input's, else cpu."""
    for i in meta.get("inputs", []):
        if i.get("kind") == "tensor" and str(i.get("device", "")).startswith("cuda"):
            return i["device"]
    return "cpu"


def _run(v: Verdict, gdir: Path, meta: dict, raw: bytes, scratch: Path, policy: Policy, mode: str, note,
         spares) -> None:
    clock = StageClock(v.stage_seconds)
    cand = scratch / "candidate.py"
    cand.write_bytes(raw)  # the judged bytes: later edits of the user's file cannot change what runs
    timing_base = None
    if policy.timing_baseline:
        base_raw = Path(policy.timing_baseline).read_bytes()
        timing_base = scratch / "timing_baseline.py"
        timing_base.write_bytes(base_raw)
        v.timing_baseline_sha256 = hashlib.sha256(base_raw).hexdigest()
    device = graph_device(meta)
    modes = role_modes(v, mode, raw, timing_base, meta)
    seeds, sets, contents, specials = _input_sets(gdir, meta, policy, clock)
    ctx = DecisionContext(gdir=gdir, meta=meta, cand=cand, timing_base=timing_base,
                          timing_base_sha=v.timing_baseline_sha256 or "", scratch=scratch, device=device, policy=policy,
                          mode=mode, note=note, clock=clock, spares=spares, modes=modes, warnings=v.warnings,
                          specials=specials,
                          pair=(1, 2) if policy.random_sets >= 2 else (0, len(sets[seeds[0]]) - 1))
    note("load", "starting workers; the original runs in its own reference worker")
    # Every worker starts now, before candidate code runs anywhere, so their interpreters, imports and
    # CUDA contexts overlap one another and the reference run; each is still fresh (no candidate code
    # in it) when its candidate arrives, and the confirmation's is a different process with new seeds.
    # On a machine with few cores a third interpreter starting alongside would slow the other two
    # down and is wasted when the first pass rejects: there the confirmation's worker starts after it.
    early = policy.confirm and usable_cores() >= policy.prestart_min_cores
    preps = [_Prepared(ctx) for _ in range(2 if early else 1)]
    ref = Reference(gdir, sets, contents, ctx.pair, ctx, quiet_first=preps[1:], specials=ctx.specials)
    retries = [policy.busy_retries]  # passes a busy machine lost that may be measured again, this decision
    try:
        # the first candidate's process is gone before the confirmation runs (_measured closes it)
        ok = _measured(v, seeds[0], sets[seeds[0]], contents[seeds[0]], ctx, preps[0], ref, preps[1:], False, retries)
        v.reference64 = ref.done and ref.get()["ref64"][seeds[0]] is not None
        if ok and not policy.confirm:
            v.accepted = True
        elif ok:
            if not early:
                preps.append(_Prepared(ctx))
            v.accepted = _measured(v, seeds[1], sets[seeds[1]], contents[seeds[1]], ctx, preps[1], ref, [], True,
                                   retries)
    finally:
        ref.close(spares)
        for w in preps:
            w.close()
        if spares is not None:
            spares.refill(device, (gdir,))
    _check_reproduced(v, policy)


def _input_sets(gdir: Path, meta: dict, policy: Policy, clock) -> tuple[list, dict, dict, dict]:
    """Seeds of the two passes, each one's correctness sets, the contents its timed calls rotate through, and its
    special-value sets (NaN, inf, extreme magnitudes in the activations; run in requests of their own)."""
    from tilesmith.capture import loading
    from tilesmith.gate.inputs import derive_seed, make_sets, special_sets
    from tilesmith.gate.original import timing_contents

    with clock("inputs"):
        data = loading.load_graph_data(gdir, device_map="cpu")
        seeds = [policy.seed, derive_seed(policy.seed, "confirmation") % (1 << 31)]
        sets = {s: make_sets(meta, data.inputs, s, policy.random_sets) for s in seeds}
        contents = {s: timing_contents(meta, data.inputs, s, policy) for s in seeds}
        specials = {s: special_sets(meta, data.inputs, s) for s in seeds}
    return seeds, sets, contents, specials


# A speedup above Policy.suspicious_speedup must come out within this factor in the confirmation, or the
# candidate's own time within a factor of 2. Not the speedup within 2: on the loaded 2-core machine an
# honest 20x rewrite measured 17.4x and 65.6x (the original 1.50 then 5.49 ms, the candidate 0.093 then 0.080).
REPRODUCE_FACTOR = 4.0


def _check_reproduced(v: Verdict, policy: Policy) -> None:
    t1, t2 = v.first.timing if v.first else None, v.confirmation.timing if v.confirmation else None
    if v.accepted and t1 and t2 and max(t1.speedup, t2.speedup) > policy.suspicious_speedup \
            and not 1 / REPRODUCE_FACTOR <= t2.speedup / t1.speedup <= REPRODUCE_FACTOR \
            and not 0.5 <= t2.candidate_ms / t1.candidate_ms <= 2.0:  # load moves the slow original's time most
        v.accepted = False
        v.reasons.append(Reason("suspicious-speedup", f"a {t1.speedup:.1f}x speedup did not reproduce in the "
                                                      f"confirmation ({t2.speedup:.1f}x)"))


class _Prepared:
    """A candidate worker started early: in a background thread it finishes its imports (and CUDA context)
    while the deciding thread does other work. It loads nothing before its candidate but the baseline,
    which is timed beside it as well as apart, in a worker where candidate code never runs."""

    def __init__(self, ctx: DecisionContext):
        from tilesmith.gate.spares import start_worker

        self.worker = start_worker("candidate", ctx.scratch, ctx.device, (ctx.gdir,), ctx.spares)
        self.error = None
        self.startup_s = None
        self._thread = threading.Thread(target=self._prepare, args=(ctx,), daemon=True)
        self._thread.start()

    def _prepare(self, ctx: DecisionContext) -> None:
        try:
            self.startup_s = self.worker.request({"op": "ready"}, ctx.policy.load_timeout_s).get("startup_s")
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


def _measured(v: Verdict, seed: int, named_sets: list, contents: list, ctx: DecisionContext, prep: _Prepared,
              ref: Reference, others: list, confirmation: bool, retries: list) -> bool:
    """A pass (v.first, or v.confirmation), in the prepared worker; measured again in a fresh worker where it was
    rejected as not faster while the candidate's worker as a whole ran the original slower than the original's own
    worker did, the candidate faster than the bar beside the original there (readings.slow_worker: a busy machine's doing), as long as
    retries[0], the decision's allowance, lasts. The pass set aside goes to v.retried, its reasons and warnings off
    the verdict, with a busy-retry warning. Every pass that counts is judged as any other: a candidate that slows its
    own worker to be measured again gains at most Policy.busy_retries more draws of each bound (each one-sided at
    Policy.confidence; both passes must clear it), and a slower candidate fails the comparison beside the original."""
    from tilesmith.gate import readings

    while True:
        p = Pass(seed=seed)
        setattr(v, "confirmation" if confirmation else "first", p)
        reasons, warned = len(v.reasons), len(v.warnings)
        try:
            ok = _pass(v, p, named_sets, contents, ctx, prep, ref, others, confirmation)
        finally:
            prep.close()
        rejected = {r.code for r in v.reasons[reasons:]}
        slow = None if ok or retries[0] <= 0 or rejected != {"not-faster"} else readings.slow_worker(
            p.timing, ctx.policy.min_improvement)
        if slow is None:
            return ok
        retries[0] -= 1
        t = p.timing
        v.retried.append(p)
        del v.reasons[reasons:], v.warnings[warned:]
        v.warnings.append(Reason("busy-retry", f"a {'confirmation' if confirmation else 'first'} pass was measured "
                                 f"again in a fresh worker: the candidate's worker ran the original {slow:.1f}x slower "
                                 "than the original's own worker for the whole pass (a busy machine), the candidate "
                                 f"{t.beside_speedup:.3f}x beside it there and {t.apart_speedup:.3f}x against the "
                                 "original apart"))
        ctx.note("timing", "the candidate's worker ran the original slower than the original's own worker for the whole "
                           "pass: measuring again in a fresh worker")
        prep = _Prepared(ctx)


def _pass(v: Verdict, p: Pass, named_sets: list, contents: list, ctx: DecisionContext, prep: _Prepared,
          ref: Reference, others: list, confirmation: bool) -> bool:
    """Load, correctness and timing in one fresh candidate worker; False (with reasons) at the first failure."""
    key = "confirmation" if confirmation else "first"
    stage = (lambda s: "confirmation") if confirmation else (lambda s: s)
    try:
        v.stage = stage("load")
        w = _load(ctx, prep, key)
        from tilesmith.gate.static import native

        reasons = [Reason(f.code, f"{v.stage}: {f.message}") for f in native(w)]  # the C++ it built, read by us
        if reasons:
            v.reasons += reasons
            return False
        v.stage = stage("correctness")
        reasons, r = _correctness(p, named_sets, ctx, w, ref, key)
        if not reasons and ctx.policy.correctness_only:  # a check, not a decision: never accepted
            return False
        if not reasons:
            v.stage = stage("timing")
            reasons = timed.run(p, contents, ctx, w, ref, r, others, key)
    except WorkerFailure as e:
        v.reasons.append(Reason(e.code, f"{v.stage}: {e.message}"))
        return False
    if p.timing:
        from tilesmith.gate import readings

        v.warnings += readings.warnings(p.timing, ctx.policy,
                                     ctx.solo_in_mode_ns or r["per_call_ns"] + p.timing.gap_us * 1e3)
    v.reasons += reasons
    return not reasons


def _load(ctx: DecisionContext, prep: _Prepared, key: str):
    ctx.note("load", "loading the candidate in a fresh worker")
    clock = ctx.clock
    with clock(f"{key}.start"):  # interpreter, imports and CUDA context, if not over yet
        w = prep.wait()
    clock.add(f"{key}.worker_imports", prep.startup_s or 0.0)  # inside the worker, overlapped with other work
    cand = w.dir / "candidate.py"  # in the worker's own folder: the only one its sandbox lets it see
    cand.write_bytes(ctx.cand.read_bytes())
    # The baseline is loaded here too, before the candidate, to be timed beside it (gate.timing.measure).
    base = {"baseline": True}
    if ctx.timing_base is not None:
        best = w.dir / "timing_baseline.py"
        best.write_bytes(ctx.timing_base.read_bytes())
        base = {"baseline_file": str(best)}
    with clock(f"{key}.load"):
        # Where the parent writes the samples' values and takes the wait for a CPU out of them (gate/refill.py), the
        # worker may start no process once the candidate has loaded (procfs.forgiven_ns needs every child's time).
        no_processes = bool(getattr(w, "stops", False)) and parent_refill.enabled()
        rep = w.request({"op": "load", "graph_dir": str(ctx.gdir), "candidate": str(cand), "device": ctx.device,
                         "no_processes": no_processes, **base}, ctx.policy.load_timeout_s)
    why = rep.get("seccomp") if isinstance(rep, dict) else None
    if why and not any(x.code == "seccomp" for x in ctx.warnings):  # the other lines still hold (gate/seccomp.py)
        ctx.warnings.append(Reason("seccomp", f"the candidate's worker runs without its seccomp filter: {why}"[:300]))
    return w


def _correctness(p: Pass, named_sets: list, ctx: DecisionContext, w, ref: Reference,
                 key: str) -> tuple[list, dict | None]:
    """The candidate's outputs on every set and the same-buffer pair, against the original's."""
    import torch

    ctx.note("correctness", f"comparing outputs on {len(named_sets)} input sets")
    clock, policy = ctx.clock, ctx.policy
    f, o = w.dir / f"sets-{p.seed}.pt", w.dir / f"cand-{p.seed}.pt"
    with clock(f"{key}.outputs"):
        save_sets(f, named_sets, torch)
        w.request({"op": "outputs", "role": "candidate", "sets_file": str(f), "out_file": str(o),
                   "pair": list(ctx.pair)}, policy.call_timeout_s)
        f.unlink(missing_ok=True)
    try:
        got = load_raw(o, torch)
    except Exception as e:
        return [Reason("protocol", f"the candidate worker's outputs are unreadable: {e}"[:300])], None
    ref.calm()  # this worker is idle until the reference is in: the original may be timed alone
    with clock("reference_wait"):
        r = ref.get()
    try:
        special = _special(ctx, w, p.seed, r["special"][p.seed], f"{key}.special")
    except WorkerFailure:
        raise
    except Exception as e:  # its outputs file unreadable
        return [Reason("protocol", f"the candidate worker's special-set outputs are unreadable: {e}"[:300])], r
    with clock(f"{key}.compare"):
        try:
            return _compare(p, named_sets, got, r["base"][p.seed], r["ref64"][p.seed], ctx.pair, special,
                            ctx), r
        except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as e:
            return [Reason("protocol", f"the candidate worker's outputs are malformed: {e!r}"[:300])], r


def _special(ctx: DecisionContext, w, seed: int, orig, clock_key: str) -> tuple | None:
    """(named special-value sets, the candidate's raw outputs on them, the original's {"names", "base", "ref64"}),
    asked of the candidate only once the original is known to run on them; None where the graph has none or the
    original itself fails on all of them (a warning names those it fails on)."""
    import torch

    if orig is None:
        return None
    if orig.get("error"):
        warn = Reason("special-sets-skipped", "the original itself fails on special-value input sets (NaN, inf, extreme "
                                              f"magnitudes in its activations); those were not compared: {orig['error']}")
        if warn not in ctx.warnings:
            ctx.warnings.append(warn)
    named = [(n, inputs) for n, inputs in ctx.specials.get(seed) or [] if n in orig["names"]]
    if not named:
        return None
    f, o = w.dir / f"sets-special-{seed}.pt", w.dir / f"special-{seed}.pt"
    with ctx.clock(clock_key):
        save_sets(f, named, torch)
        w.request({"op": "outputs", "role": "candidate", "sets_file": str(f), "out_file": str(o), "pair": []},
                  ctx.policy.call_timeout_s)
        f.unlink(missing_ok=True)
        return named, load_raw(o, torch), orig


def _compare(p: Pass, named_sets: list, got: dict, base: dict, ref64, pair, special,
             ctx: DecisionContext) -> list[Reason]:
    """Every set, the special-value sets, then the same-buffer pair; fills p.correctness (and the verdict's
    warnings) and returns the reasons to reject."""
    from tilesmith.gate import correctness

    if len(got["sets"]) != len(named_sets):
        return [Reason("protocol", f"the candidate worker returned {len(got['sets'])} sets, not {len(named_sets)}")]
    results = correctness.compare_sets([name for name, _ in named_sets], got["sets"], base["sets"], ref64)
    if special is not None:
        named, cand, orig = special
        if len(cand["sets"]) != len(named):
            return [Reason("protocol", f"the candidate worker returned {len(cand['sets'])} special sets, not {len(named)}")]
        how = correctness.Special(correctness.typical_scales(base["sets"][:2]), ctx.policy.allow_nonfinite_differences)
        results += correctness.compare_sets([name for name, _ in named], cand["sets"], orig["base"]["sets"],
                                            orig["ref64"], how)
    reasons = []
    for r in results:
        p.correctness.append(r.summary)
        reasons += r.reasons
        ctx.warnings += r.warnings
    i, j = pair
    return reasons + correctness.compare_pair((named_sets[i][0], named_sets[j][0]), got["pair"],
                                              base["sets"][i], base["sets"][j])
