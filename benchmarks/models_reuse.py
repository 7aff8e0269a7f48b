"""benchmarks/models.py's flows across device calls: a run with --no-timing leaves its flows (models.json and
each model's home), a later run with --reuse times them. Which code made a flow is known by a digest of the
files (the GPU machine's copy of the tree has no git history)."""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def code_digest() -> str:
    """The code a run measures: a digest of tilesmith's and the benchmarks' Python files."""
    h = hashlib.sha256()
    for f in sorted([*ROOT.glob("tilesmith/**/*.py"), *ROOT.glob("tilesmith_cli/**/*.py"), *ROOT.glob("benchmarks/*.py")]):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def load(reuse: str | None) -> list[tuple[str, dict]]:
    """The earlier runs named by --reuse (comma-separated --out-dirs), read once, before any flow or timing runs:
    (folder, its models.json), in the order given."""
    docs = []
    for d in [x for x in (reuse or "").split(",") if x]:
        try:
            docs.append((d, json.loads((Path(d) / "models.json").read_text())))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--reuse {d}: no models.json from `models.py run` there ({e}); pass an --out-dir "
                             "that a run (e.g. with --no-timing) wrote") from None
    return docs


def reused(name: str, m: str, docs: list[tuple[str, dict]], code: str) -> dict | None:
    """The flow of (model, mode) that an earlier run made (the first of `docs` that has it wins), with its home,
    where it came from and whether this run's code (`code`) made it; None when none has it (no result there,
    or its home is gone)."""
    for d, doc in docs:
        for r in doc.get("results", []):
            flow_ = r.get("model") == name and (r.get("tilesmith") or {}).get(m)
            home = Path(d) / name / m / "home"
            if flow_ and home.is_dir():
                same = doc.get("code") == code
                if not same:
                    print(f"{name}: tilesmith on {m}: the flow in {d} was made by other code than this run's (code "
                          f"{doc.get('code')} there, {code} here): its gate numbers are another version's", flush=True)
                return {**flow_, "home": str(home.resolve()), "reused_from": f"{d} ({doc.get('date', '?')})",
                        "same_code": same}
    return None


def flows_table(r: dict) -> None:
    """--no-timing: what each flow did (a later run with --reuse times it)."""
    for m, t in r["tilesmith"].items():
        statuses = dict(collections.Counter(tr["status"] for tr in t["tracks"]))
        best = [f"{tr['key'][:10]} {tr['speedup']:.3f}x" for tr in t["tracks"] if tr.get("speedup")]
        print(f"{r['model']:12} tilesmith on {m}: run {t['run_id']} in {t['pipeline_s']} s, graphs by status "
              f"{statuses}; accepted: {', '.join(best) or 'none'}", flush=True)
    for e in r["errors"]:
        print(f"{r['model']:12} {e[:300]}", flush=True)
