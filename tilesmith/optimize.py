"""`optimize`: one run over a workspace's eligible graphs; per graph a track where an optimizer
proposes candidates and the gate decides. Loops count accepted cycles; each must beat the best so far.

Layout: runs/<run-id>/run.json and runs/<run-id>/<key>/ (attempts/ ring, profiles/, best.py/json,
cache.json on an exact hit); see tilesmith/runs.py.
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal

from tilesmith import paths, runs
from tilesmith import workspace as wsmod
from tilesmith.errors import TilesmithError
from tilesmith.gate.spares import default_spares, keep_spares
from tilesmith.search import Candidate, Optimizer, Track
from tilesmith.settings import current as settings_now
from tilesmith.workspace import write_json

FINAL = runs.FINAL
OptimizerName = Literal["auto", "tuner", "agent"]
Agency = Literal["low", "medium", "high"]
# The agent's finite defaults per graph (0 on the command line: unlimited).
DEFAULT_MODEL_CALLS = 150
DEFAULT_GRAPH_MINUTES = 45.0


@dataclass
class OptimizeSettings:
    optimizer: OptimizerName = "auto"  # auto: the agent when a model is configured
    agency: Agency = "medium"  # the agent's freedom; recorded for the tuner
    loops: int = 1
    max_model_calls: int | None = None
    model: str | None = None
    graphs: list[str] = field(default_factory=list)  # key prefixes; empty = every eligible graph
    max_minutes: float | None = None
    jobs: int = 1
    min_improvement: float | None = None  # None: TILESMITH_MIN_IMPROVEMENT or 0.02
    gate_time_budget_s: float | None = None  # timing budget per gate pass (None: the gate's default)
    skills: list[str] = field(default_factory=list)  # extra SKILL.md folders for the agent (--skills)
    graph_minutes: float | None = None  # the agent's time per graph (None: DEFAULT_GRAPH_MINUTES; 0: no limit)
    reasoning_effort: str | None = None  # sent to reasoning models (minimal | low | medium | high)
    context_window: int | None = None  # the model's input window in tokens, when its profile does not say
    warm_start: bool = True  # the agent: the built-in tuner runs first (agent_warm.py)
    allow_nonfinite_differences: bool = False  # the gate's Policy field of that name (--allow-nonfinite-differences)
    # Where tracks run (tilesmith/scale). gpus is this command's, like jobs; --resume keeps the run's ray
    # and ray_cpus unless it names another cluster:
    gpus: list[str] | None = None  # GPUs of this host for CUDA graphs, one track each at a time (None: all visible)
    ray: str | None = None  # a Ray cluster's address, or "local": every graph's track a Ray task
    ray_cpus: float = 1.0  # CPUs a CPU graph's Ray task asks for (its gate times on that many threads)

    def resolved(self) -> "OptimizeSettings":
        from tilesmith.gate.verdict import default_min_improvement

        s = OptimizeSettings(**asdict(self))
        if s.min_improvement is None:
            s.min_improvement = default_min_improvement()
        if s.optimizer == "auto":
            s.model = s.model or settings_now().model
            s.optimizer = "agent" if s.model else "tuner"
        if s.optimizer not in ("tuner", "agent"):
            raise TilesmithError(f"unknown optimizer '{s.optimizer}'", code="usage", hint="use --optimizer tuner or agent")
        if s.agency not in ("low", "medium", "high"):
            raise TilesmithError(f"unknown agency '{s.agency}'", code="usage", hint="use low, medium or high")
        # Recorded in run.json, and read again by `--resume` from wherever the user is then.
        s.skills = [str(paths.absolute(d)) for d in s.skills]
        if s.loops < 1:
            raise TilesmithError("--loops must be at least 1", code="usage")
        if s.optimizer == "agent":  # finite budgets unless asked otherwise (0 = no limit)
            s.max_model_calls = DEFAULT_MODEL_CALLS if s.max_model_calls is None else s.max_model_calls
            s.graph_minutes = DEFAULT_GRAPH_MINUTES if s.graph_minutes is None else s.graph_minutes
        return s

    def provenance_match(self, prov: dict) -> bool:
        """Same settings as an installed artifact's provenance (an exact hit)."""
        return (prov.get("optimizer") == self.optimizer and prov.get("model") == self.model
                and prov.get("agency") == self.agency and prov.get("loops") == self.loops
                and prov.get("budget") == self.max_model_calls
                and abs(float(prov.get("threshold") or 0) - float(self.min_improvement)) < 1e-12
                and bool(prov.get("allow_nonfinite_differences")) == self.allow_nonfinite_differences)


@dataclass
class TrackResult:
    key: str
    kind: str
    # pending | running | done | exhausted | cached | failed | interrupted | lost (its process or node died:
    # unfinished, like interrupted; `--resume` runs it again from its last accepted source)
    status: str = "pending"
    reason: str = ""
    loops_done: int = 0
    candidates: int = 0
    rejected_by_stage: dict = field(default_factory=dict)
    baseline_ms: float | None = None
    best_ms: float | None = None
    speedup: float | None = None  # original / best, from the gate's measurement chain
    speedup_low: float | None = None
    profile_error: str = ""  # why the baseline profile failed (the track then runs without one)


@dataclass
class OptimizeResult:
    run_id: str
    status: str  # complete | interrupted
    tracks: list[TrackResult]

    def to_dict(self) -> dict:
        return asdict(self)

    def failed(self) -> list[TrackResult]:
        """The graphs that failed for a reason other than finding no faster candidate (a corrupt wrapper.py or
        graph.json, a crashed worker, every screen failing): the run did not do what was asked for them."""
        return [t for t in self.tracks if t.status == "failed"]

    def lost(self) -> list[TrackResult]:
        """The graphs whose track's process or node died before it ended (tilesmith/scale): `--resume` reruns them."""
        return [t for t in self.tracks if t.status == "lost"]


@dataclass
class _Run:
    """One optimize run as its tracks see it: what every track's steps share."""

    run_id: str
    ws: wsmod.Workspace
    settings: OptimizeSettings
    optimizer: Optimizer | None  # None: the one settings.optimizer names, loaded when a track needs it
    deadline: float | None  # time.monotonic() when --max-minutes is up
    stop: threading.Event  # set on Ctrl-C: tracks stop at their next step
    save: Callable  # save(t: TrackResult | None): run.json with t's row updated
    note: Callable  # the caller's on_event(kind, **fields)
    timing_lock: threading.Lock = field(default_factory=threading.Lock)  # measurements never overlap
    spares: object = None  # the pool of started gate workers (gate.spares.keep_spares), passed to every decision

    def expired(self) -> bool:
        return self.stop.is_set() or (self.deadline is not None and time.monotonic() > self.deadline)


def optimize(workspace: str | Path = "tilesmith-workspace", settings: OptimizeSettings | None = None, *,
             resume: str | None = None, on_event=None, optimizer: Optimizer | None = None,
             lanes: list | None = None) -> OptimizeResult:
    """Optimize every eligible graph of `workspace` (or carry on with run `resume`).

    `optimizer` replaces the one `settings.optimizer` names (which still labels the run and its
    artifacts); see tilesmith.search for the contract. `lanes` (tilesmith.scale.Lane): run every graph's
    track in a process of its own, one per lane at a time, with the lane's environment (tests and benchmarks
    spread CPU graphs over fake devices with it); None: `settings.gpus` and `settings.ray` decide."""
    note = on_event or (lambda kind, **kw: None)
    run, settings, workspace = _start(workspace, settings, resume)
    _check_placement(settings, optimizer, lanes)
    ws = wsmod.load(workspace)
    graphs = _select(ws, settings.graphs)
    if settings.optimizer == "agent" and optimizer is None:  # a missing key or unknown model: an error before any work
        from tilesmith.search.agent.provider import check_provider

        check_provider(settings)
    run = run or runs.create_run(asdict(settings), str(ws.path), ws.environment)
    tracks = {g.key: TrackResult(**{**asdict(TrackResult(g.key, g.kind)), **run.graphs.get(g.key, {})}) for g in graphs}
    lock = threading.Lock()

    def save(t: TrackResult | None = None):
        with lock:
            if t is not None:
                run.graphs[t.key] = asdict(t)
            run.save()

    for t in tracks.values():
        save(t)
    r = _Run(run.run_id, ws, settings, optimizer,
             time.monotonic() + settings.max_minutes * 60 if settings.max_minutes else None, threading.Event(), save, note)
    interrupted, ctrl_c = False, threading.Event()
    try:  # from the moment the caller learns the run id, a Ctrl-C leaves the run marked interrupted
        with _stopping_on_ctrl_c(r.stop, ctrl_c):
            note("run", run_id=run.run_id, graphs=len(graphs))
            with keep_spares(default_spares()) as r.spares:  # decisions run back to back: workers start ahead
                _work_all(r, _placed_elsewhere(r, graphs, tracks, lanes), tracks)
    except KeyboardInterrupt:
        interrupted = True
        r.stop.set()
    interrupted = interrupted or ctrl_c.is_set()  # its KeyboardInterrupt swallowed on the way: the run still stopped
    unfinished = [t for t in tracks.values() if t.status not in FINAL]
    for t in unfinished:
        if t.status == "running":
            t.status = "interrupted"
        elif t.status == "pending" and not interrupted and settings.max_minutes and (
                not t.reason or "--max-minutes" in t.reason):  # not a reason of its own (no Ray node for it)
            t.reason = f"not started: the {settings.max_minutes:g}-minute budget (--max-minutes) was spent; " \
                       f"`tilesmith optimize --resume {run.run_id}` carries on"
        save(t)
    run.status, run.ended = "interrupted" if (interrupted or unfinished) else "complete", runs.now_iso()
    save()
    if interrupted:
        raise KeyboardInterrupt
    return OptimizeResult(r.run_id, run.status, list(tracks.values()))


@contextmanager
def _stopping_on_ctrl_c(stop: threading.Event, seen: threading.Event):
    """While in it, SIGINT also sets `stop` (tracks end at their next step) and `seen`, then raises its
    KeyboardInterrupt as before. Code under the driver may swallow that exception, both met while torch._inductor
    is imported (launch/sandbox.py vec_isa_settled): mpmath's bare `except:` around `import gmpy`, and Python
    3.11's RuntimeError around an error in a `__set_name__`, caught there as any Exception. The run then went on
    to its end and `tilesmith optimize` exited 0 (2 of 30 Ctrl-Cs in its first second on a loaded 2-core
    machine). Off the main thread, or where SIGINT is ignored, at its default or not Python's, nothing changes."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def on_sigint(signum, frame):
        seen.set()
        stop.set()
        previous(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _start(workspace, settings: OptimizeSettings | None, resume: str | None):
    """(run `resume`, marked running again, or None; the resolved settings; the workspace)."""
    if not resume:
        return None, (settings or OptimizeSettings()).resolved(), workspace
    run = runs.load_run(resume)
    given = settings
    settings = OptimizeSettings(**{k: v for k, v in run.settings.items() if k in OptimizeSettings.__dataclass_fields__})
    # What limits this command is the caller's, not the interrupted run's.
    settings.max_minutes = given.max_minutes if given else None
    settings.jobs = given.jobs if given else settings.jobs
    settings.gpus = given.gpus if given else None
    if given and given.ray:  # else the run's own cluster (a lost track goes back where it came from)
        settings.ray, settings.ray_cpus = given.ray, given.ray_cpus
    run.status, run.ended = "running", None
    return run, settings.resolved(), run.workspace


def _check_placement(settings: OptimizeSettings, optimizer, lanes) -> None:
    """--gpus / --ray / lanes can be had here (tilesmith/scale): checked before the run exists."""
    if settings.ray or settings.gpus or lanes is not None:
        from tilesmith.scale import check

        check(settings, optimizer, lanes)


def _placed_elsewhere(r: _Run, graphs, tracks: dict[str, TrackResult], lanes) -> list:
    """The graphs this process runs: the others go to other GPUs or a Ray cluster (tilesmith/scale), which
    bring their results into this run; with one GPU, none, or only CPU graphs, all of them, as always."""
    if not (r.settings.ray or lanes is not None or any(str(g.device).startswith("cuda") for g in graphs)):
        return graphs
    from tilesmith.scale import place

    return place(r, graphs, tracks, lanes)


def _work_all(r: _Run, graphs, tracks: dict[str, TrackResult]) -> None:
    order = _order_by_time(r, [g for g in graphs if tracks[g.key].status not in FINAL])

    def work(g, settings=None):
        t = tracks[g.key]
        try:
            _run_track(r, g, t, settings or r.settings)
        except Exception as e:  # one graph's failure never ends the run
            t.status, t.reason = "failed", f"{type(e).__name__}: {e}"[:500]
            r.save(t)
            r.note("track", key=g.key, track=t)

    if r.settings.jobs <= 1:
        if r.deadline is not None and r.settings.loops > 1 and len(order) > 1:
            # Under a time limit, every graph's first win before any graph's second: on the H200 a training
            # step's backward took its second loop's re-lowering search through the rest of a 4-minute budget,
            # and its three other graphs never started (benchmarks/RESULTS-history.md, 2026-12-02).
            first = replace(r.settings, loops=1)
            for g in order:
                if r.expired():
                    break
                work(g, first)
            order = [g for g in order if tracks[g.key].status == "done" and 0 < tracks[g.key].loops_done < r.settings.loops]
        for g in order:
            if r.expired():
                break
            work(g)
    else:
        pool = ThreadPoolExecutor(r.settings.jobs)
        try:
            list(pool.map(work, order))
        finally:  # on Ctrl-C: tracks stop at their next step; queued ones never start
            r.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)


def _select(ws, prefixes: list[str]):
    graphs = [g for g in ws.graphs if g.eligible]
    if prefixes:
        chosen = {ws.find(p).key for p in prefixes}
        bad = [g for g in ws.graphs if g.key in chosen and not g.eligible]
        if bad:
            raise TilesmithError(f"graph {bad[0].short} is not eligible: {bad[0].reason}", code="not-eligible")
        graphs = [g for g in graphs if g.key in chosen]
    if not graphs:
        raise TilesmithError(f"no eligible graph in {paths.shown(ws.path)}", code="no-eligible-graphs",
                             hint="`tilesmith capture --json` says why each graph was skipped")
    return graphs


def _order_by_time(r: _Run, graphs):
    """Baseline-profile each graph (profiles/baseline.json) and order them biggest share first. The
    graphs not profiled yet are profiled together, in one worker process (profile_graphs)."""
    from tilesmith.profile.baseline import Profile, profile_graphs

    times, todo = {}, []
    for g in graphs:
        f = runs.track_dir(r.run_id, g.key) / "profiles" / "baseline.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        if f.exists():
            try:
                times[g.key] = Profile.from_dict(json.loads(f.read_text())).wall_ms * g.seen
            except (ValueError, TypeError, KeyError):
                times[g.key] = 0.0
        else:
            todo.append(g)
    # Once the budget is spent no profile starts (a worker process; ~20 s a graph on a GPU): the graphs
    # left keep the capture's order after the profiled ones, and their tracks never start.
    if todo and not r.expired():
        for g in todo:
            r.note("profile", key=g.key)
        with r.timing_lock:
            t0 = time.monotonic()
            profiles = profile_graphs([r.ws.graph_dir(g.key) for g in todo])
            batch_s = round(time.monotonic() - t0, 1)  # the worker's whole run, its start included, all graphs
        for g, p in zip(todo, profiles):
            prof = runs.track_dir(r.run_id, g.key) / "profiles"
            if isinstance(p, TilesmithError):  # the track still runs, without a profile, and says why
                times[g.key] = 0.0
                write_json(prof / "baseline_error.json", {"error": str(p), "code": p.code})
                r.note("profile-failed", key=g.key, error=str(p))
                continue
            p.phases_s.update(batch_wall_s=batch_s, batch_graphs=len(todo))
            write_json(prof / "baseline.json", p.to_dict())
            (prof / "baseline_error.json").unlink(missing_ok=True)
            times[g.key] = p.wall_ms * g.seen
    return sorted(graphs, key=lambda g: -times.get(g.key, 0.0))


def _policy(settings: OptimizeSettings, seed: int, timing_baseline: Path | None):
    from tilesmith.gate.verdict import Policy

    p = Policy(min_improvement=settings.min_improvement, seed=seed,
               allow_nonfinite_differences=settings.allow_nonfinite_differences)
    if settings.gate_time_budget_s:
        p.time_budget_s = settings.gate_time_budget_s
    p.timing_baseline = str(timing_baseline) if timing_baseline else None  # the best so far, not the original
    return p


def _exact_hit(rid: str, g, settings: OptimizeSettings) -> bool:
    return runs.exact_hit(rid, g.key, settings.provenance_match)


def _run_track(r: _Run, g, t: TrackResult, settings: OptimizeSettings) -> None:
    """One graph's track under `settings` (the run's, or with fewer loops for a first pass over every graph)."""
    if _exact_hit(r.run_id, g, r.settings):
        t.status, t.reason = "cached", "an artifact made with the same settings is installed"
        r.save(t)
        r.note("track", key=g.key, track=t)
        return
    track = Track(r.run_id, g.key, r.ws.graph_dir(g.key), r.deadline, r.stop, r.timing_lock)
    base = json.loads((track.profiles / "baseline.json").read_text()) if (track.profiles / "baseline.json").exists() else None
    if base:
        from tilesmith.profile.baseline import Profile

        track.profile = Profile.from_dict(base)
        t.baseline_ms = track.profile.wall_ms
        t.profile_error = ""  # a resumed run profiled it since
    elif (track.profiles / "baseline_error.json").exists():
        t.profile_error = str(json.loads((track.profiles / "baseline_error.json").read_text()).get("error", ""))
    best_file = track.dir / "best.py"
    if best_file.exists():  # resuming: carry on from the best confirmed source
        track.best_text = best_file.read_text()
    t.status = "running"
    r.save(t)
    r.note("track", key=g.key, track=t)
    if t.loops_done >= settings.loops:
        t.status = "done"
    else:
        submit = functools.partial(_submit, r, g, t, track)
        optimizer = r.optimizer or _named_optimizer(r.settings.optimizer)
        t.status, t.reason = optimizer(track, settings, submit, loops_done=t.loops_done)
        if t.status == "exhausted" and t.loops_done > 0:
            t.status = "done"
        if t.candidates == 0:  # nothing reached the gate: say what failed on the way, not only "nothing to try"
            errors = [x for x in (track.failed_screens(),
                                  f"the baseline profile failed: {t.profile_error}" if t.profile_error else "") if x]
            t.reason = "; ".join(x for x in (t.reason, *errors) if x)
            if errors and t.status == "exhausted":  # it ran out of ideas because nothing would run: a failure
                t.status = "failed"
    r.save(t)
    r.note("track", key=g.key, track=t)


def _submit(r: _Run, g, t: TrackResult, track: Track, cand: Candidate) -> dict:
    """Judge one candidate with the gate (against the best so far), record the verdict under profiles/,
    and on acceptance make it the best so far and credit the loop. Returns the verdict dict."""
    from tilesmith.gate import judge

    if track.expired():  # whichever optimizer proposed it (the agent's warm start and gate node too)
        return {"accepted": False, "stage": "budget", "graph_key": g.key, "reasons": [{
            "code": "budget", "message": "not judged: the --max-minutes budget was spent before this decision "
                                         f"could start; `tilesmith optimize --resume {r.run_id}` carries on"}]}
    best_file = track.dir / "best.py"
    n_verdicts = len(list(track.profiles.glob("verdict_*.json")))
    path = cand.path if getattr(cand, "path", None) else runs.push_attempt(r.run_id, g.key, cand.text)
    t.candidates += 1
    r.note("candidate", key=g.key, label=cand.label, track=t)
    with r.timing_lock:
        v = judge(track.graph_dir, path, _policy(r.settings, 1000 + n_verdicts, best_file if best_file.exists() else None),
                  spares=r.spares)
    vd = v.to_dict()
    vd["label"], vd["written"] = cand.label, runs.now_iso()
    write_json(track.profiles / f"verdict_{n_verdicts:03d}.json", vd)
    if v.accepted:
        t.loops_done += 1
        track.best_text = cand.text
        _credit(t, vd, loop=t.loops_done)
        runs.record_best(r.run_id, g.key, cand.text, vd, str(track.graph_dir), g.kind, asdict(r.settings))
        r.note("accepted", key=g.key, track=t)
    else:
        t.rejected_by_stage[v.stage] = t.rejected_by_stage.get(v.stage, 0) + 1
    r.save(t)
    return vd


def _credit(t: TrackResult, vd: dict, loop: int) -> None:
    """Speedup over the original: loop 1 is measured against it; later loops multiply (each was
    measured against the previous best), which is what the chain of verdicts supports. The numbers
    per verdict are the store's (install.evidence_from_verdict), so run, report and store agree."""
    from tilesmith.install import evidence_from_verdict

    try:
        ev = evidence_from_verdict(vd)
    except KeyError:
        return
    if loop == 1 or t.speedup is None:
        t.speedup, t.speedup_low = ev.speedup, ev.speedup_low
        if ev.mode == "graph" and ev.baseline_ms:
            # A graph compiled with CUDA graphs: the speedup is over Inductor's replay of the original, as
            # the gate timed it, not over the baseline profile's plain launches; best_ms follows from it.
            t.baseline_ms = float(ev.baseline_ms)
    else:
        t.speedup, t.speedup_low = t.speedup * ev.speedup, (t.speedup_low or 1.0) * ev.speedup_low
    if t.baseline_ms:
        t.best_ms = t.baseline_ms / t.speedup


def _named_optimizer(name: str) -> Optimizer:
    """The tuner, or the agent (which runs its own loop: a LangGraph graph that calls submit per turn)."""
    if name == "tuner":
        from tilesmith.search.tuner import run_track

        return run_track
    try:
        from tilesmith.search.agent.optimizer import run_track
    except ImportError as e:
        raise TilesmithError(f"the agent optimizer is not available: {e}", code="no-agent",
                             hint="use --optimizer tuner (no model needed)") from None
    return run_track
