"""`install`: put a run's accepted sources into the artifact store.

Trust boundary: a source gets in only when its track's best.json carries a gate verdict that says
accepted, and best.py's bytes still hash to both best.json's sha256 and the verdict's
candidate_sha256 (the exact bytes the gate judged). Anything else is skipped with the reason.
The bytes must also pass the gate's allowlist (tilesmith/gate/allowlist.py) here, whatever the verdict
says: an artifact runs in the user's own process, and a verdict from a gate without the allowlist (or one
written by hand) proves nothing about what it reaches. One that fails is refused, with the findings. The
runtime loads only bytes that hash to their manifest, so what it runs is what was checked here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tilesmith import paths, runs, store


@dataclass
class GraphInstall:
    key: str
    status: str  # installed | replaced | kept | skipped | refused | would-install | would-replace
    reason: str
    kind: str = ""
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None


@dataclass
class InstallResult:
    run_id: str
    dry_run: bool
    graphs: list[GraphInstall] = field(default_factory=list)
    native: str | None = None  # the replay's C address check: built, built already, or why not (CUDA only)

    @property
    def installed(self) -> list[GraphInstall]:
        return [g for g in self.graphs if g.status in ("installed", "replaced")]

    def to_dict(self) -> dict:
        return asdict(self)


def install(run_id: str | None = None, *, dry_run: bool = False, force: bool = False) -> InstallResult:
    """Install every accepted source of run `run_id` (a unique prefix; default: the newest run)."""
    run = runs.load_run(run_id)
    rid = run["run_id"]
    rdir = paths.run_dir(rid)
    result = InstallResult(rid, dry_run)
    tracks = sorted(p for p in rdir.iterdir() if p.is_dir() and store.is_key(p.name))
    for t in tracks:
        result.graphs.append(_install_track(run, t, dry_run=dry_run, force=force))
    if not dry_run and _cuda():
        # The CUDA-graph replay's address check in C (tilesmith.replay.native): built here, once per machine and torch,
        # because the runtime never compiles inside the user's program (without it the check runs in Python).
        from tilesmith.replay import native

        result.native = native.build()[1]
    return result


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _install_track(run: dict, track: Path, *, dry_run: bool, force: bool) -> GraphInstall:
    key = track.name
    best_json, best_py = track / "best.json", track / "best.py"
    if not best_json.exists():
        return GraphInstall(key, "skipped", "no accepted source in this run")
    try:
        best = json.loads(best_json.read_text())
    except json.JSONDecodeError as e:
        return GraphInstall(key, "skipped", f"best.json is corrupt: {e}")
    verdict = best.get("verdict") or {}
    kind = best.get("kind") or ""
    if best.get("key") != key or (verdict.get("graph_key") and verdict.get("graph_key") != key):
        return GraphInstall(key, "skipped", "best.json names another graph", kind)
    if verdict.get("accepted") is not True:
        return GraphInstall(key, "skipped", "the gate verdict in best.json is not accepted", kind)
    try:
        data = best_py.read_bytes()
    except FileNotFoundError:
        return GraphInstall(key, "skipped", "best.py is missing", kind)
    digest = store.sha256_bytes(data)
    if digest != best.get("sha256") or digest != verdict.get("candidate_sha256"):
        return GraphInstall(key, "skipped", "best.py's bytes do not hash to what the gate judged (modified after the verdict)", kind)
    refusal = _allowlist_refusal(data)
    if refusal:
        return GraphInstall(key, "refused", refusal, kind)
    try:
        evidence = evidence_from_verdict(verdict)
    except (KeyError, TypeError, ValueError) as e:
        return GraphInstall(key, "skipped", f"the verdict carries no usable timing evidence ({e})", kind)
    environment = _environment(best, run)
    if not environment:
        return GraphInstall(key, "skipped", "no environment recorded for this graph", kind)
    res = store.put(key, data, kind=kind, environment=environment, evidence=evidence,
                    provenance=_provenance(run, best), force=force, dry_run=dry_run)
    shown = res.manifest.evidence if res.manifest is not None else evidence
    return GraphInstall(key, res.action, res.reason, kind, shown.speedup, shown.speedup_low, shown.speedup_high)


def _allowlist_refusal(data: bytes) -> str:
    """Why the artifact's bytes fail the gate's allowlist ("" when they pass)."""
    from tilesmith.gate.allowlist import check

    try:
        found = check(data.decode())
    except UnicodeDecodeError:
        return "the artifact is not UTF-8 text"
    if not found:
        return ""
    shown = "; ".join(f"line {f.line}: {f.message} [{f.code}]" for f in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return (f"it reaches what a kernel wrapper never needs, which the gate's allowlist rejects: {shown}{more}. "
            "Judge it again with this tilesmith (`tilesmith optimize`) to install a source that passes")


def evidence_from_verdict(verdict: dict) -> store.Evidence:
    """The numbers a manifest keeps, from a gate Verdict dict (tilesmith.gate.verdict.Verdict)."""
    passes = [p for p in (verdict.get("first"), verdict.get("confirmation")) if p]
    timed = [p["timing"] for p in passes if p.get("timing")]
    if not timed:
        raise KeyError("timing")
    # One definition everywhere (driver, report, store): the point estimate of the deciding pass (the
    # confirmation), and an interval that covers both passes (lowest low, highest high). Replacement
    # decisions compare the low end.
    t = timed[-1]
    low, high = min(float(x["speedup_low"]) for x in timed), max(float(x["speedup_high"]) for x in timed)
    sets = [c for p in passes for c in (p.get("correctness") or [])]
    abs_errs = [float(c.get("max_abs_error") or 0.0) for c in sets]
    rel_errs = [float(c.get("max_rel_error") or 0.0) for c in sets]
    return store.Evidence(
        speedup=float(t["speedup"]), speedup_low=low, speedup_high=high,
        mode=str(t.get("mode", "")), samples=int(t.get("samples", 0)),
        baseline_ms=t.get("baseline_ms"), candidate_ms=t.get("candidate_ms"),
        max_abs_error=max(abs_errs) if abs_errs else None, max_rel_error=max(rel_errs) if rel_errs else None,
        correctness_sets=len(sets),
    )


def _environment(best: dict, run: dict) -> dict:
    """The environment the graph was captured on (graph.json), else the run's."""
    gdir = best.get("graph_dir")
    if gdir:
        try:
            env = json.loads((Path(gdir) / "graph.json").read_text()).get("environment")
            if env:
                return env
        except (OSError, json.JSONDecodeError):
            pass
    return run.get("environment") or {}


def _provenance(run: dict, best: dict) -> dict:
    s = {**(run.get("settings") or {}), **(best.get("settings") or {})}
    v = best.get("verdict") or {}
    return {
        "optimizer": s.get("optimizer"), "model": s.get("model"), "agency": s.get("agency"),
        "loops": s.get("loops"), "budget": s.get("max_model_calls", s.get("budget")),
        "threshold": v.get("min_improvement", s.get("threshold")), "run_id": run["run_id"],
        "allow_nonfinite_differences": bool(v.get("allow_nonfinite_differences", s.get("allow_nonfinite_differences"))),
        "graph_dir": best.get("graph_dir"), "workspace": run.get("workspace"),
    }

