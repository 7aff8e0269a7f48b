"""`submit`: judge a hand-written wrapper with the full gate and record it as a run of its own.

The run looks like any optimizer's run (settings.optimizer = "manual"): the candidate as
attempts/attempt_00.py, the verdict as profiles/verdict_000.json, and, when accepted,
best.py + best.json, so `tilesmith install RUN_ID` takes it like any other run. The gate judges the
copy in attempts/, never the user's file, so editing the file while the gate runs changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tilesmith import paths, runs
from tilesmith.errors import TilesmithError
from tilesmith.workspace import Graph, write_json


@dataclass
class SubmitResult:
    run_id: str
    key: str
    accepted: bool
    verdict: dict  # the gate's Verdict as a dict
    best_path: str | None = None  # runs/<id>/<key>/best.py when accepted

    def to_dict(self) -> dict:
        return asdict(self)


def submit(graph_dir: str | Path, candidate_path: str | Path, policy=None) -> SubmitResult:
    """Run the gate on `candidate_path` for the captured graph in `graph_dir`; record the run."""
    from tilesmith.gate import judge
    from tilesmith.gate.verdict import Policy

    graph = Graph(paths.absolute(graph_dir))
    gdir, meta = graph.dir, graph.meta
    cand = paths.absolute(candidate_path)
    try:
        text = cand.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TilesmithError(f"cannot read the candidate {paths.shown(cand)}: {e}", code="candidate-unreadable",
                             hint="pass the path of a Python wrapper file") from None
    policy = policy or Policy()
    key = meta["key"]
    settings = {"optimizer": "manual", "candidate": str(cand.resolve()), "policy": policy.to_dict()}
    run = runs.create_run(settings, str(gdir.resolve().parent.parent), meta.get("environment") or {})
    attempt = runs.push_attempt(run.run_id, key, text)
    status = "failed"
    try:
        verdict = judge(gdir, attempt, policy)
        vd = verdict.to_dict() if hasattr(verdict, "to_dict") else dict(verdict)
        profiles = runs.track_dir(run.run_id, key) / "profiles"
        profiles.mkdir(parents=True, exist_ok=True)
        write_json(profiles / "verdict_000.json", vd)
        best = None
        if vd.get("accepted"):
            best = runs.record_best(run.run_id, key, attempt.read_text(), vd, str(gdir.resolve()),
                                    meta.get("kind", ""), settings)
            if runs.sha256_file(best) != vd.get("candidate_sha256"):
                # The gate hashed other bytes than the ones recorded: install would refuse them anyway.
                raise TilesmithError("the recorded best.py does not hash to what the gate judged",
                                     code="hash-mismatch")
        run.graphs[key] = {"accepted": bool(vd.get("accepted")), "stage": vd.get("stage"),
                              "reasons": [r.get("code") for r in vd.get("reasons") or []]}
        status = "complete"
    finally:
        run.status, run.ended = status, runs.now_iso()
        run.save()
    return SubmitResult(run.run_id, key, bool(vd.get("accepted")), vd, str(best) if best else None)
