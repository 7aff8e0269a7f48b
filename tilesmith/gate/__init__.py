"""The gate: `judge(graph_dir, candidate_path, policy) -> Verdict`, proving a candidate wrapper correct
and faster than the original, stage by stage, cheapest first (DESIGN.md "The gate").

Candidate code runs only in worker subprocesses (gate/worker.py via gate/proc.py). The original's
outputs come from a separate reference worker that never loads the candidate, and every comparison
and statistic is computed here, from raw tensors and raw nanosecond samples.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

from tilesmith.errors import TilesmithError
from tilesmith.gate.verdict import MODES, STAGES, Pass, Policy, Reason, SetCorrectness, Timing, Verdict
from tilesmith.workspace import WRAPPER_FILE, load_graph_json

__all__ = ["judge", "Policy", "Verdict", "Reason", "Pass", "SetCorrectness", "Timing", "STAGES", "MODES"]


def judge(graph_dir, candidate_path, policy: Policy | None = None, on_progress=None) -> Verdict:
    """Judge one candidate wrapper for a captured graph; never raises for a bad candidate, only for bad usage.

    on_progress(stage, message) is called as stages start.
    """
    policy = policy or Policy()
    t0 = time.monotonic()
    gdir = Path(graph_dir)
    meta = load_graph_json(gdir)
    try:
        raw = Path(candidate_path).read_bytes()
    except OSError as e:
        raise TilesmithError(f"cannot read the candidate {candidate_path}: {e.strerror}", code="no-candidate",
                             hint="pass the path of a Python file defining call(args)") from None
    mode = resolve_mode(policy.mode, meta)
    v = Verdict(False, "static", meta.get("key", gdir.name), hashlib.sha256(raw).hexdigest(),
                min_improvement=policy.min_improvement)
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


def _device(meta: dict) -> str:
    for i in meta.get("inputs", []):
        if i.get("kind") == "tensor" and str(i.get("device", "")).startswith("cuda"):
            return i["device"]
    return "cpu"


def _run(v: Verdict, gdir: Path, meta: dict, raw: bytes, scratch: Path, policy: Policy, mode: str, note) -> None:
    import torch

    from tilesmith import loading
    from tilesmith.gate.inputs import derive_seed, make_sets
    from tilesmith.gate.proc import Worker, WorkerFailure

    cand = scratch / "candidate.py"
    cand.write_bytes(raw)  # the judged bytes: later edits of the user's file cannot change what runs
    timing_base = None
    if policy.timing_baseline:
        base_raw = Path(policy.timing_baseline).read_bytes()
        timing_base = scratch / "timing_baseline.py"
        timing_base.write_bytes(base_raw)
        v.timing_baseline_sha256 = hashlib.sha256(base_raw).hexdigest()
    data = loading.load_graph_data(gdir, device_map="cpu")
    device = _device(meta)
    seeds = [policy.seed, derive_seed(policy.seed, "confirmation") % (1 << 31)]
    sets = {s: make_sets(meta, data.inputs, s, policy.random_sets) for s in seeds}
    pair = (1, 2) if policy.random_sets >= 2 else (0, len(sets[seeds[0]]) - 1)
    note("load", "running the original in a reference worker")
    # The first candidate worker starts now: its interpreter and imports overlap the reference run.
    first_worker = Worker("candidate", scratch)
    try:
        ref = _cached_reference(gdir, sets, pair, scratch, device, policy)
    except WorkerFailure as e:
        first_worker.close()
        raise TilesmithError(f"the original wrapper fails in a gate worker ({e.code}): {e.message}",
                             code="baseline-failed", hint="check `tilesmith replay GRAPH_DIR` first") from None
    except BaseException:
        first_worker.close()
        raise
    v.reference64 = ref["ref64"][seeds[0]] is not None
    reps = max(1, min(100000, round(policy.target_sample_ms * 1e6 / ref["per_call_ns"])))
    ctx = dict(gdir=gdir, cand=cand, timing_base=timing_base, scratch=scratch, device=device, policy=policy, mode=mode, pair=pair,
               reps=reps, ref=ref, note=note, torch=torch, Worker=Worker, WorkerFailure=WorkerFailure)
    v.first = Pass(seed=seeds[0])
    if not _pass(v, v.first, sets[seeds[0]], ctx, confirmation=False, worker=first_worker):
        return
    if not policy.confirm:
        v.accepted = True
        return
    v.confirmation = Pass(seed=seeds[1])
    v.accepted = _pass(v, v.confirmation, sets[seeds[1]], ctx, confirmation=True)
    t1, t2 = v.first.timing, v.confirmation.timing
    if v.accepted and max(t1.speedup, t2.speedup) > policy.suspicious_speedup \
            and not 0.5 <= t2.speedup / t1.speedup <= 2.0:
        v.accepted = False
        v.reasons.append(Reason("suspicious-speedup", f"a {t1.speedup:.1f}x speedup did not reproduce in the "
                                                      f"confirmation ({t2.speedup:.1f}x)"))


def _save_sets(path: Path, named_sets: list, torch) -> None:
    torch.save({"inputs": [inputs for _, inputs in named_sets]}, path)


def _load_raw(path: Path, torch):
    """Raw results a worker wrote: tensors and plain containers only (weights_only), then the file goes."""
    try:
        return torch.load(path, weights_only=True)
    finally:
        path.unlink(missing_ok=True)


def _reference(gdir, sets: dict, pair, scratch: Path, device: str, policy: Policy) -> dict:
    """The original alone, in its own worker: outputs on every set of every pass, float64 reference,
    and a solo per-call time that sizes timed samples and bounds the paired baseline."""
    import statistics

    import torch

    from tilesmith.gate.proc import Worker

    out = {"base": {}, "ref64": {}}
    text = (Path(gdir) / WRAPPER_FILE).read_text()
    with Worker("reference", scratch) as w:
        w.request({"op": "load", "graph_dir": str(gdir), "baseline": True, "device": device}, policy.load_timeout_s)
        for seed, named in sets.items():
            f, o = scratch / f"sets-{seed}.pt", scratch / f"ref-{seed}.pt"
            _save_sets(f, named, torch)
            w.request({"op": "outputs", "role": "baseline", "sets_file": str(f), "out_file": str(o),
                       "pair": list(pair)}, policy.call_timeout_s)
            out["base"][seed] = _load_raw(o, torch)
            r = w.request({"op": "ref64", "sets_file": str(f), "out_file": str(o), "wrapper_text": text},
                          policy.call_timeout_s)
            out["ref64"][seed] = _load_raw(o, torch)["outputs"] if r.get("available") else None
            f.unlink()
        first = next(iter(sets.values()))
        f = scratch / "rotating.pt"
        _save_sets(f, _rotating(first, policy), torch)
        w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline"], "mode": "launch"},
                  policy.call_timeout_s)
        f.unlink()
        r = w.request({"op": "time", "rounds": 7, "reps": 1, "roles": ["baseline"]}, policy.call_timeout_s)
        out["per_call_ns"] = max(1000.0, float(statistics.median(r["ns"]["baseline"])))
    return out


_REF_CACHE: dict = {}


def _cached_reference(gdir: Path, sets: dict, pair, scratch: Path, device: str, policy: Policy) -> dict:
    """The original's results depend only on the graph files and the input sets: judging many candidates
    for one graph (an optimizer's loop, a test suite) runs the reference worker once per seed."""
    stat = [(f, os.stat(gdir / f).st_mtime_ns, os.stat(gdir / f).st_size) for f in (WRAPPER_FILE, "data.pt")]
    key = (str(gdir.resolve()), tuple(stat), tuple(sets), policy.random_sets, tuple(pair), device,
           policy.rotating_sets)
    if key not in _REF_CACHE:
        if len(_REF_CACHE) >= 4:
            _REF_CACHE.pop(next(iter(_REF_CACHE)))
        _REF_CACHE[key] = _reference(gdir, sets, pair, scratch, device, policy)
    return _REF_CACHE[key]


def _rotating(named_sets: list, policy: Policy) -> list:
    randoms = [s for s in named_sets if s[0] not in ("captured", "zeros", "large")]
    return (randoms or named_sets)[: max(1, policy.rotating_sets)]


def _pass(v: Verdict, p: Pass, named_sets: list, ctx: dict, confirmation: bool, worker=None) -> bool:
    """Load, correctness and timing in one fresh candidate worker; False (with reasons) at the first failure."""
    from tilesmith.gate import timing

    torch, policy, scratch, note = ctx["torch"], ctx["policy"], ctx["scratch"], ctx["note"]
    stage = (lambda s: "confirmation") if confirmation else (lambda s: s)
    base, ref64 = ctx["ref"]["base"][p.seed], ctx["ref"]["ref64"][p.seed]
    with worker or ctx["Worker"]("candidate", scratch) as w:
        try:
            v.stage = stage("load")
            note(v.stage, "loading the candidate in a fresh worker")
            w.request({"op": "load", "graph_dir": str(ctx["gdir"]), "baseline": True, "candidate": str(ctx["cand"]),
                       "baseline_file": str(ctx["timing_base"]) if ctx["timing_base"] else None,
                       "device": ctx["device"]}, policy.load_timeout_s)
            v.stage = stage("correctness")
            note(v.stage, f"comparing outputs on {len(named_sets)} input sets")
            f, o = scratch / f"sets-{p.seed}.pt", scratch / f"cand-{p.seed}.pt"
            _save_sets(f, named_sets, torch)
            w.request({"op": "outputs", "role": "candidate", "sets_file": str(f), "out_file": str(o),
                       "pair": list(ctx["pair"])}, policy.call_timeout_s)
            f.unlink()
            try:
                got = _load_raw(o, torch)
            except Exception as e:
                v.reasons.append(Reason("protocol", f"the candidate worker's outputs are unreadable: {e}"[:300]))
                return False
            try:
                reasons = _compare(p, named_sets, got, base, ref64, ctx["pair"])
            except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as e:
                reasons = [Reason("protocol", f"the candidate worker's outputs are malformed: {e!r}"[:300])]
            if reasons:
                v.reasons += reasons
                return False
            v.stage = stage("timing")
            note(v.stage, f"timing ({ctx['mode']}), paired and interleaved")
            f = scratch / f"rotating-{p.seed}.pt"
            _save_sets(f, _rotating(named_sets, policy), torch)
            w.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline", "candidate"],
                       "mode": ctx["mode"]}, policy.call_timeout_s)
            f.unlink()
            p.timing, reasons = timing.measure(w, policy, ctx["mode"], ctx["reps"], ctx["ref"]["per_call_ns"])
        except ctx["WorkerFailure"] as e:
            v.reasons.append(Reason(e.code, f"{v.stage}: {e.message}"))
            return False
    if p.timing and p.timing.speedup > policy.suspicious_speedup:
        v.warnings.append(Reason("suspicious-speedup", f"{p.timing.speedup:.1f}x is above "
                                 f"{policy.suspicious_speedup:g}x: confirmed in a fresh worker before acceptance"))
    solo_ms = ctx["ref"]["per_call_ns"] / 1e6
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
