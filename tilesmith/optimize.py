"""`optimize`: one run over a workspace's eligible graphs; per graph a track where an optimizer
proposes candidates and the gate decides. Loops count accepted cycles; each must beat the best so far.

Layout: runs/<run-id>/run.json and runs/<run-id>/<key>/ (attempts/ ring, profiles/, best.py/json,
cache.json on an exact hit); see tilesmith/runs.py.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import runs, store
from tilesmith import workspace as wsmod
from tilesmith.errors import TilesmithError
from tilesmith.gate.proc import default_spares, keep_spares
from tilesmith.workspace import write_json

FINAL = ("done", "exhausted", "cached", "failed")


@dataclass
class OptimizeSettings:
    optimizer: str = "auto"  # auto | tuner | agent (auto: the agent when a model is configured)
    agency: str = "medium"  # low | medium | high (the agent's freedom; recorded for the tuner)
    loops: int = 1
    max_model_calls: int | None = None
    model: str | None = None
    graphs: list[str] = field(default_factory=list)  # key prefixes; empty = every eligible graph
    max_minutes: float | None = None
    jobs: int = 1
    min_improvement: float | None = None  # None: TILESMITH_MIN_IMPROVEMENT or 0.02
    gate_time_budget_s: float | None = None  # timing budget per gate pass (None: the gate's default)
    skills: list[str] = field(default_factory=list)  # extra SKILL.md folders for the agent (--skills)

    def resolved(self) -> "OptimizeSettings":
        from tilesmith.gate.verdict import default_min_improvement

        s = OptimizeSettings(**asdict(self))
        if s.min_improvement is None:
            s.min_improvement = default_min_improvement()
        if s.optimizer == "auto":
            s.model = s.model or os.environ.get("TILESMITH_MODEL")
            s.optimizer = "agent" if s.model else "tuner"
        if s.optimizer not in ("tuner", "agent"):
            raise TilesmithError(f"unknown optimizer '{s.optimizer}'", code="usage", hint="use --optimizer tuner or agent")
        if s.agency not in ("low", "medium", "high"):
            raise TilesmithError(f"unknown agency '{s.agency}'", code="usage", hint="use low, medium or high")
        if s.loops < 1:
            raise TilesmithError("--loops must be at least 1", code="usage")
        return s

    def provenance_match(self, prov: dict) -> bool:
        """Same settings as an installed artifact's provenance (an exact hit)."""
        return (prov.get("optimizer") == self.optimizer and prov.get("model") == self.model
                and prov.get("agency") == self.agency and prov.get("loops") == self.loops
                and prov.get("budget") == self.max_model_calls
                and abs(float(prov.get("threshold") or 0) - float(self.min_improvement)) < 1e-12)


@dataclass
class TrackResult:
    key: str
    kind: str
    status: str = "pending"  # pending | running | done | exhausted | cached | failed | interrupted
    reason: str = ""
    loops_done: int = 0
    candidates: int = 0
    rejected_by_stage: dict = field(default_factory=dict)
    baseline_ms: float | None = None
    best_ms: float | None = None
    speedup: float | None = None  # original / best, from the gate's measurement chain
    speedup_low: float | None = None


@dataclass
class OptimizeResult:
    run_id: str
    status: str  # complete | interrupted
    tracks: list[TrackResult]

    def to_dict(self) -> dict:
        return asdict(self)


class _Track:
    """What an optimizer sees of one graph: its folder, the best source so far, the profile."""

    def __init__(self, run_id: str, key: str, graph_dir: Path, deadline: float | None, stop: threading.Event):
        self.run_id, self.key, self.graph_dir = run_id, key, graph_dir
        self.dir = runs.track_dir(run_id, key)
        self.profiles = self.dir / "profiles"
        self.profiles.mkdir(parents=True, exist_ok=True)
        self.best_text = (graph_dir / wsmod.WRAPPER_FILE).read_text()
        self.profile = None
        self._deadline, self._stop = deadline, stop
        self._log = self.profiles / "tuner_variants.jsonl"

    def record(self, event: dict) -> None:
        with self._log.open("a") as f:
            f.write(json.dumps({"t": runs.now_iso(), **event}) + "\n")

    def expired(self) -> bool:
        return self._stop.is_set() or (self._deadline is not None and time.monotonic() > self._deadline)


def optimize(workspace: str | Path = "tilesmith-workspace",
             settings: OptimizeSettings | None = None, *, resume: str | None = None, on_event=None) -> OptimizeResult:
    """Optimize every eligible graph of `workspace` (or carry on with run `resume`)."""
    note = on_event or (lambda kind, **kw: None)
    if resume:
        run = runs.load_run(resume)
        given = settings
        settings = OptimizeSettings(**{k: v for k, v in run["settings"].items() if k in OptimizeSettings.__dataclass_fields__})
        # What limits this session is the caller's, not the interrupted run's.
        settings.max_minutes = given.max_minutes if given else None
        settings.jobs = given.jobs if given else settings.jobs
        workspace = run["workspace"]
    settings = (settings or OptimizeSettings()).resolved()
    ws = wsmod.load(workspace)
    graphs = _select(ws, settings.graphs)
    if settings.optimizer == "agent":  # a missing key or unknown model is an error before any work
        from tilesmith.search.agent_provider import check_provider

        check_provider(settings)
    if resume:
        run["status"], run["ended"] = "running", None
    else:
        rdir = runs.create_run(asdict(settings), str(Path(workspace).resolve()), ws.environment)
        run = runs.load_run(rdir.name)
    rid = run["run_id"]
    tracks = {g.key: TrackResult(**{**asdict(TrackResult(g.key, g.kind)), **run["graphs"].get(g.key, {})}) for g in graphs}
    lock = threading.Lock()

    def save(t: TrackResult | None = None):
        with lock:
            if t is not None:
                run["graphs"][t.key] = asdict(t)
            runs.save_run(run)

    for t in tracks.values():
        save(t)
    note("run", run_id=rid, graphs=len(graphs))
    deadline = time.monotonic() + settings.max_minutes * 60 if settings.max_minutes else None
    stop = threading.Event()
    timing_lock = threading.Lock()  # measurements never overlap: they would disturb each other

    spares = None  # the pool of started gate workers, passed to every decision explicitly

    def work(g):
        t = tracks[g.key]
        try:
            _run_track(rid, ws, g, t, settings, deadline, stop, timing_lock, save, note, spares=spares)
        except Exception as e:  # one graph's failure never ends the run
            t.status, t.reason = "failed", f"{type(e).__name__}: {e}"[:500]
            save(t)
            note("track", key=g.key, track=t)

    interrupted = False
    try:
        with keep_spares(default_spares()) as spares:  # decisions run back to back: workers start ahead of them
            _work_all(rid, ws, graphs, tracks, settings, deadline, stop, timing_lock, note, work)
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
    unfinished = [t for t in tracks.values() if t.status not in FINAL]
    for t in unfinished:
        if t.status == "running":
            t.status = "interrupted"
        save(t)
    run["status"] = "interrupted" if (interrupted or unfinished) else "complete"
    run["ended"] = runs.now_iso()
    save()
    if interrupted:
        raise KeyboardInterrupt
    return OptimizeResult(rid, run["status"], list(tracks.values()))


def _work_all(rid, ws, graphs, tracks, settings, deadline, stop, timing_lock, note, work) -> None:
    order = _order_by_time(rid, ws, [g for g in graphs if tracks[g.key].status not in FINAL], timing_lock, note)
    if settings.jobs <= 1:
        for g in order:
            if stop.is_set() or (deadline and time.monotonic() > deadline):
                break
            work(g)
    else:
        pool = ThreadPoolExecutor(settings.jobs)
        try:
            list(pool.map(work, order))
        finally:  # on Ctrl-C: tracks stop at their next step; queued ones never start
            stop.set()
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
        raise TilesmithError(f"no eligible graph in {ws.path}", code="no-eligible-graphs",
                             hint="`tilesmith capture --json` says why each graph was skipped")
    return graphs


def _order_by_time(rid, ws, graphs, timing_lock, note):
    """Baseline-profile each graph (profiles/baseline.json) and order them biggest share first."""
    from tilesmith.profile import Profile, profile_graph

    times = {}
    for g in graphs:
        f = runs.track_dir(rid, g.key) / "profiles" / "baseline.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        try:
            if f.exists():
                p = Profile.from_dict(json.loads(f.read_text()))
            else:
                note("profile", key=g.key)
                with timing_lock:
                    p = profile_graph(ws.graph_dir(g.key))
                write_json(f, p.to_dict())
            times[g.key] = p.wall_ms * g.seen
        except TilesmithError:
            times[g.key] = 0.0
    return sorted(graphs, key=lambda g: -times.get(g.key, 0.0))


def _policy(settings: OptimizeSettings, seed: int, timing_baseline: Path | None):
    from tilesmith.gate.verdict import Policy

    p = Policy(min_improvement=settings.min_improvement, seed=seed)
    if settings.gate_time_budget_s:
        p.time_budget_s = settings.gate_time_budget_s
    p.timing_baseline = str(timing_baseline) if timing_baseline else None  # the best so far, not the original
    return p


def _exact_hit(rid: str, g, settings: OptimizeSettings) -> bool:
    m = store.get(g.key)
    if m is None or not settings.provenance_match(m.provenance):
        return False
    write_json(runs.track_dir(rid, g.key) / "cache.json",
               {"key": g.key, "artifact": str(store.artifact_path(g.key)), "manifest": str(store.manifest_path(g.key)),
                "speedup": m.evidence.speedup, "from_run": m.provenance.get("run_id")})
    return True


def _run_track(rid, ws, g, t: TrackResult, settings, deadline, stop, timing_lock, save, note, spares=None) -> None:
    if _exact_hit(rid, g, settings):
        t.status, t.reason = "cached", "an artifact made with the same settings is installed"
        save(t)
        note("track", key=g.key, track=t)
        return
    track = _Track(rid, g.key, ws.graph_dir(g.key), deadline, stop)
    base = json.loads((track.profiles / "baseline.json").read_text()) if (track.profiles / "baseline.json").exists() else None
    if base:
        from tilesmith.profile import Profile

        track.profile = Profile.from_dict(base)
        t.baseline_ms = track.profile.wall_ms
    best_file = track.dir / "best.py"
    if best_file.exists():  # resuming: carry on from the best confirmed source
        track.best_text = best_file.read_text()
    t.status = "running"
    save(t)
    note("track", key=g.key, track=t)
    submit = functools.partial(_submit, rid, g, t, track, settings, timing_lock, save, note, spares=spares)
    if t.loops_done >= settings.loops:
        t.status = "done"
    elif settings.optimizer == "agent":  # the agent's own loop (a LangGraph graph) calls submit per turn
        t.status, t.reason = _agent().run_track(track, settings, submit, loops_done=t.loops_done)
        if t.status == "exhausted" and t.loops_done > 0:
            t.status = "done"
    else:
        _generator_loop(_optimizer(settings, track), track, settings, t, submit)
    save(t)
    note("track", key=g.key, track=t)


def _generator_loop(optimizer, track: _Track, settings, t: TrackResult, submit) -> None:
    """Drive a generator optimizer (the tuner): each candidate it yields is judged, and the verdict
    goes back to it through send(); `loops` accepted candidates end the track."""
    verdict = None
    while t.loops_done < settings.loops:
        if track.expired():
            t.status = "interrupted"
            return
        try:
            cand = optimizer.send(verdict) if verdict is not None else next(optimizer)
        except StopIteration:
            t.status = "exhausted" if t.loops_done == 0 else "done"
            t.reason = "the optimizer has nothing more to try"
            return
        verdict = submit(cand)
    t.status = "done"


def _submit(rid, g, t: TrackResult, track: _Track, settings, timing_lock, save, note, cand, spares=None) -> dict:
    """Judge one candidate with the gate (against the best so far), record the verdict under profiles/,
    and on acceptance make it the best so far and credit the loop. Returns the verdict dict."""
    from tilesmith.gate import judge

    best_file = track.dir / "best.py"
    n_verdicts = len(list(track.profiles.glob("verdict_*.json")))
    path = cand.path if getattr(cand, "path", None) else runs.push_attempt(rid, g.key, cand.text)
    t.candidates += 1
    note("candidate", key=g.key, label=cand.label, track=t)
    with timing_lock:
        v = judge(track.graph_dir, path, _policy(settings, 1000 + n_verdicts, best_file if best_file.exists() else None),
                  spares=spares)
    vd = v.to_dict()
    vd["label"], vd["written"] = cand.label, runs.now_iso()
    write_json(track.profiles / f"verdict_{n_verdicts:03d}.json", vd)
    if v.accepted:
        t.loops_done += 1
        track.best_text = cand.text
        _credit(t, vd, loop=t.loops_done)
        runs.record_best(rid, g.key, cand.text, vd, str(track.graph_dir), g.kind, asdict(settings))
        note("accepted", key=g.key, track=t)
    else:
        t.rejected_by_stage[v.stage] = t.rejected_by_stage.get(v.stage, 0) + 1
    save(t)
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
    else:
        t.speedup, t.speedup_low = t.speedup * ev.speedup, (t.speedup_low or 1.0) * ev.speedup_low
    if t.baseline_ms:
        t.best_ms = t.baseline_ms / t.speedup


def _agent():
    try:
        from tilesmith.search import agent
    except ImportError as e:
        raise TilesmithError(f"the agent optimizer is not available: {e}", code="no-agent",
                             hint="use --optimizer tuner (no model needed)") from None
    return agent


def _optimizer(settings: OptimizeSettings, track: _Track):
    """The generator optimizer for a track (the tuner; the agent runs its own loop, see _agent)."""
    from tilesmith.search.tuner import search

    return search(track)
