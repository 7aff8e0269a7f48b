"""The timing stage of a gate pass: paired samples of the original (in its own worker) and the candidate,
sized for the graph's timing mode, then the timed calls' outputs checked against the original's on the
same inputs. Called by tilesmith.gate._pass."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tilesmith import settings
from tilesmith.gate import cpulease, refill
from tilesmith.gate.context import DecisionContext
from tilesmith.gate.original import Reference, load_raw, save_sets
from tilesmith.gate.spares import calm_spares
from tilesmith.gate.verdict import Pass, Reason


def run(p: Pass, contents: list, ctx: DecisionContext, w, ref: Reference, r: dict, others: list,
        key: str) -> list[Reason]:
    """Paired samples, the baseline in the reference worker and the candidate in its own, then the
    outputs of the timed calls the parent chose, against the original's on the same inputs."""
    import torch

    from tilesmith.gate import sizing, timing
    from tilesmith.gate.inputs import parameter_indices, state_horizon

    policy, clock, mode = ctx.policy, ctx.clock, ctx.mode
    ctx.note("timing", f"timing ({mode}), paired and interleaved, the original in its own worker and beside the candidate")
    shared = parameter_indices(ctx.meta)
    gap_ns = program_gap_ns(ctx.meta, ctx.device, policy)
    # In graph timing the confirmation pass sizes from the first pass's probe (resized) directly.
    known = ctx.solo_in_mode_ns if mode == "graph" else None
    # Sized with the program's gap: each timed call spends it first (the probe in graph mode did too).
    reps, ctx.buffers = sizing.sample_size(policy, known or (r["per_call_ns"] + gap_ns), contents, shared,
                                           state_horizon(ctx.meta))

    def send(worker, roles: list, role_mode: str, pin: bool) -> dict:
        if pin and cpus:
            worker.request({"op": "pin", "cpus": cpus}, policy.call_timeout_s)
        f = worker.dir / f"contents-{p.seed}.pt"
        save_sets(f, contents, torch)
        rep = worker.request({"op": "time_setup", "sets_file": str(f), "roles": roles, "mode": role_mode,
                              "buffers": ctx.buffers}, policy.call_timeout_s)
        f.unlink(missing_ok=True)
        return rep if isinstance(rep, dict) else {}

    def setup(pin: bool) -> None:
        set_up(ctx, ref, w, mode, lambda worker, roles, m: send(worker, roles, m, pin))
        # Where a worker stops for the parent (the CPU: gate/freeze.py), the parent writes each sample's values into
        # its buffers itself, with it stopped, and times the sample from there (gate/refill.py).
        stopped = [x for x in {id(ref.timer): ref.timer, id(w): w}.values() if getattr(x, "stops", False)]
        if stopped and refill.enabled():
            values = refill.Refill([inputs for _, inputs in contents], ctx.meta)
            for worker in stopped:
                worker.values = values

    with contextlib.ExitStack() as lease:  # a CPU graph's timing holds its CPUs machine-wide (gate/cpulease.py)
        with clock(f"{key}.timing_setup"):
            cpus = sizing.shared_cpus()
            if cpus and not str(ctx.device).startswith("cuda"):
                cpus = lease.enter_context(cpulease.leased(sorted(os.sched_getaffinity(0), reverse=True), len(cpus)))
            try:
                setup(True)
            except CandidateTreesFailed as e:
                return [_trees_failed(e)]
        with clock(f"{key}.quiesce"):  # no other worker may be busy while samples are taken
            for other in others:
                other.idle()
            calm_spares()
        if mode == "graph" and not known:
            with clock(f"{key}.resize"):
                try:
                    reps = resized(ctx, ref, reps, contents, shared, setup, gap_ns)
                except CandidateTreesFailed as e:
                    return [_trees_failed(e)]
        with clock(f"{key}.timing"):
            # On a busy machine a CPU pass may run longer (timing._budget_s), with TILESMITH_GATE_BUSY=1: off by
            # default until a GPU smoke has run the code it turns on; CUDA keeps its budget either way.
            busy = settings.current().gate_busy and not str(ctx.device).startswith("cuda")
            extend = timing.BUSY_EXTEND if busy else 1.0
            p.timing, reasons, kept = timing.measure(ref.timer, w, policy, mode, reps, r["per_call_ns"], ref.base_role,
                                                     len(contents), ctx.buffers, gap_ns=gap_ns, busy_extend=extend)
        if p.timing:
            p.timing.gap_us = gap_ns / 1e3
            clock.add(f"{key}.timed", (sum(p.timing.baseline_ns) + sum(p.timing.candidate_ns)
                                             + sum(p.timing.beside_ns)) / 1e9)
    if p.timing is None:
        return reasons
    with clock(f"{key}.timing_checks"):
        bad = _timing_checks(p, ctx, w, ref, kept, contents)
    return bad or reasons


def program_gap_ns(meta: dict, device: str, policy) -> int:
    """The host time the program spends between this graph's calls, where capture measured it and found it the
    graph's own (capture/gaps.py): spent before each timed call of every role, so the samples run as the
    program's steps do. A candidate that only saves host time wins only where the program's step is host-bound
    with it; a GPU-side win is diluted where that host time hides it. 0 where unknown or unusable."""
    gap = meta.get("program_gap") if isinstance(meta.get("program_gap"), dict) else {}
    if not policy.program_gap or not str(device).startswith("cuda") or gap.get("usable") is not True:
        return 0
    try:
        us = float(gap.get("host_us") or 0.0)
    except (TypeError, ValueError):
        return 0
    from tilesmith.gate.clock import MAX_GAP_NS

    return int(min(max(us * 1e3, 0.0), MAX_GAP_NS))


class CandidateTreesFailed(Exception):
    """The candidate's calls failed through the cudagraph trees where the original's did not."""


def _trees_failed(e: Exception) -> Reason:
    return Reason("trees-failed", "the candidate failed through Inductor's cudagraph trees, which run it in the "
                                  f"program (the original's did not): {str(e)[:300]}")


def set_up(ctx: DecisionContext, ref: Reference, w, mode: str, send) -> None:
    """time_setup for every role (`send(worker, roles, mode)` -> the worker's reply), in the modes ctx.modes
    names. Where a role asked for the trees was set up in graph mode instead (the reply's trees_fallback,
    per role): a candidate meant to run through the trees as the original does is never timed against the
    original in another mode. Its own failure there rejects it (CandidateTreesFailed: the program runs it
    through the trees); the original's sets every role up again as bare replays. Where only the original
    was to run through the trees (against a candidate that replays itself), a bare replay of it is kept,
    cheaper than the program's trees, with a warning."""
    failed: dict = {}
    for worker, roles, role_mode in _setups(ctx, ref, w, mode):
        why = send(worker, roles, role_mode).get("trees_fallback") or {}
        for role, reason in (why.items() if isinstance(why, dict) else [("?", str(why))]):
            failed.setdefault("candidate" if worker is w and role == "candidate" else "original", str(reason))
    if not failed:
        return
    if ctx.modes.get("candidate") == "trees":
        if "original" not in failed:
            raise CandidateTreesFailed(failed["candidate"])
        ctx.modes = {}  # every role as a bare replay, from here on (the confirmation pass too)
        ctx.solo_in_mode_ns = None  # sized through the trees: the next pass sizes anew
        ctx.warnings[:] = [x for x in ctx.warnings if x.code != "trees"]
        ctx.warnings.append(Reason("trees-unavailable", "the original and the candidate were timed as bare "
                                   f"CUDA-graph replays: the cudagraph trees could not be set up ({failed['original'][:200]})"))
        set_up(ctx, ref, w, mode, send)
    elif not any(x.code == "trees-unavailable" for x in ctx.warnings):
        ctx.warnings.append(Reason("trees-unavailable", "the original was timed as a bare CUDA-graph replay: "
                                   f"Inductor's cudagraph trees could not be set up ({next(iter(failed.values()))[:200]})"))


def _setups(ctx: DecisionContext, ref: Reference, w, mode: str) -> list[tuple]:
    """(worker, roles, mode) per time_setup request: the original in the reference worker, then the candidate
    and the original beside it in the candidate's worker, both in one request where both run through the
    trees (an earlier setup's trees are then freed first, once, for both)."""
    cand, base = ctx.modes.get("candidate", mode), ctx.modes.get("baseline", mode)
    both = cand == base == "trees"
    beside = [(w, ["candidate", "baseline"], cand)] if both else [(w, ["candidate"], cand), (w, ["baseline"], base)]
    return [(ref.timer, [ref.base_role], base)] + beside


def resized(ctx: DecisionContext, ref: Reference, reps: int, contents: list, shared: set, setup,
            gap_ns: int = 0) -> int:
    """Calls per sample in graph timing. The sizes came from the original's plain launches (the solo time),
    which a replay runs several times faster: on the H200 the MoE's samples were 2 calls, 0.3 ms where 2 ms
    is the aim, and each sample's fixed costs (the syncs around it, a first launch from an idle GPU) pulled
    both ratios towards 1. Sized again from the original timed alone in its own mode, the buffers set up
    anew (`setup`) where more calls need more of them (never more calls than buffer sets)."""
    from tilesmith.gate import inputs, sizing

    policy = ctx.policy
    try:
        probe = sizing.solo_ns(ref.timer, ref.base_role, policy.call_timeout_s, gap_ns=gap_ns)
    except RuntimeError:  # a failing call shows in the timed samples themselves, with its reason
        return reps
    reps, buffers, again = sizing.resize(policy, reps, ctx.buffers, probe, contents, shared,
                                         inputs.state_horizon(ctx.meta))
    ctx.solo_in_mode_ns = probe  # what the baseline-slowed warning compares with
    if again:
        ctx.buffers = buffers
        setup(False)
    return reps


def _random_graph(gdir: Path) -> bool:
    import re

    text = (gdir / "wrapper.py").read_text(errors="replace")
    return re.search(r"inductor_seeds|inductor_random|inductor_lookup_seed|philox|\brand(n|int|perm|_like)?\(", text) is not None


def _timing_checks(p: Pass, ctx: DecisionContext, w, ref: Reference, kept: list, contents: list) -> list[Reason]:
    """The outputs of the timed calls the parent kept, against the original's outputs on exactly the same
    inputs, computed in the reference worker (which never loads the candidate)."""
    import torch

    from tilesmith.gate.correctness import compare_values

    policy, buffers = ctx.policy, ctx.buffers
    o = w.dir / f"checks-{p.seed}.pt"
    w.request({"op": "checks", "out_file": str(o), "keep": True}, policy.call_timeout_s)
    got = load_raw(o, torch)
    if _random_graph(ctx.gdir):  # outputs depend on the RNG state, which timed calls advance
        return []
    reps = p.timing.calls_per_sample
    if not isinstance(got, list) or len(got) != len(kept) or not all(_kept_ok(g, s, reps) for g, s in zip(got, kept)):
        # Each kept sample names two calls (one drawn, and the last) with an output list each: the files the
        # worker wrote them to are in the candidate's folder, and a sample emptied there must not pass unchecked.
        return [Reason("protocol", "the candidate worker's kept timed samples do not match the ones chosen")]
    # No call of a sample reads a buffer set another call of it read (sizing.sample_size), and each set was
    # refilled before the sample; each call's outputs end with the inputs it updates in place as it left them
    # (gate/worker/checks.py: op_original_checks replays the sample's calls up to each kept one where a parameter
    # updated in place carries state from call to call).
    calls = [[c for c in g["calls"] if 0 <= c < buffers] for g in got]
    samples = [{"start": s.start, "fill": s.fill, "perturb": s.perturb, "calls": cs} for s, cs in zip(kept, calls)]
    f, o = ref.worker.dir / f"contents-{p.seed}.pt", ref.worker.dir / f"original-checks-{p.seed}.pt"
    save_sets(f, contents, torch)  # the pass's pool and buffers, in the worker that runs the original
    ref.worker.request({"op": "time_setup", "sets_file": str(f), "roles": ["baseline"], "mode": "launch",
                        "buffers": buffers}, policy.call_timeout_s)
    ref.worker.request({"op": "original_checks", "samples": samples, "out_file": str(o), "bufs_role": "baseline",
                        "late": kept_late(ctx)}, policy.call_timeout_s)
    want = load_raw(o, torch)
    p.timing.checked_calls = 0  # counted as compared: a rejected pass says how many calls were checked
    for g, s, cs, ws in zip(got, kept, calls, want):
        for c, orig in zip(cs, ws):
            outs = g["outputs"][g["calls"].index(c)]
            p.timing.checked_calls += 1
            what = _first_difference(outs, orig, compare_values)
            if what:
                return [Reason("wrong-values-in-timing", f"call {s.start + c} of the timed stream returned outputs "
                                                         f"that differ from the original's on the same inputs ({what})")]
    return []


def _first_difference(outs: list, orig: list, compare_values) -> str:
    """Which value of a checked call differs first, and how: '' where none does. Its outputs come first, then the
    inputs it updates in place (as gate/worker/checks.py lists them)."""
    if len(outs) != len(orig):
        return f"{len(outs)} values where the original has {len(orig)}"
    for k, (a, b) in enumerate(zip(outs, orig)):
        v = compare_values(a, b)
        if not v.ok:
            shape = f"{tuple(b.shape)} {str(b.dtype).removeprefix('torch.')}" if hasattr(b, "shape") else type(b).__name__
            return f"value {k} of {len(orig)}, {shape}: {v.why or 'values'}, worst difference {v.abs_error:.3g}"
    return ""


def kept_late(ctx: DecisionContext) -> bool:
    """Whether the candidate's kept calls were read as the sample's last call left them: in launch timing its worker
    holds a kept call's outputs, and the inputs that call updated in place, without a copy until the sample ends
    (gate/worker/checks.py _sample_replayed reads the original's the same way). The candidate's own mode decides,
    not the graph's: a candidate that replays its own CUDA graph is timed in launch mode on a graph compiled with CUDA
    graphs (gate/modes.py role_modes). Read by the graph's mode, a decode step's whole-call replay had its held cache
    compared, as the sample's last call left it, with the original's as the kept call left it, and was rejected as
    `wrong-values-in-timing` on every run on the H100 and H200."""
    return ctx.modes.get("candidate", ctx.mode) == "launch"


def _kept_ok(g, s, reps: int) -> bool:
    """A kept sample as the worker records it: its start, [a drawn call, the last call], an output list each,
    and those outputs the ones the digest bound when the sample ended (CheckedSample `s`); where the parent chose the
    call, that call."""
    from tilesmith.gate.worker.tensors import outputs_digest

    try:
        calls, outs = g["calls"], g["outputs"]
        shape = (g.get("start") == s.start and isinstance(calls, list) and len(calls) == 2 and calls[1] == reps - 1
                 and isinstance(calls[0], int) and 0 <= calls[0] < reps and isinstance(outs, list) and len(outs) == 2
                 and (s.call is None or calls[0] == s.call))
        return shape and s.digest is not None and outputs_digest(outs) == s.digest
    except (TypeError, KeyError, AttributeError, RuntimeError, ValueError):
        return False
