"""Warm start: the built-in tuner runs on the track before the agent's first turn.

Launch parameters are what the tuner does well and cheaply (no model calls); the agent then starts
from its best source and reads its log instead of spending turns rediscovering block sizes. The
tuner's candidates go through the same judging function as the agent's (the driver's submit), so an
accepted one is a confirmed win: it becomes /best.py and is credited like any other. The agent's own
`loops` still count from where they were: the warm start's win is on top, never instead of them.
"""

from __future__ import annotations

import json


def warm_start(track, submit, expired, max_candidates: int = 4, screen_budget_s: float | None = None) -> str:
    """Run the tuner until it has nothing more, one candidate is accepted, `max_candidates` were judged,
    or time is up; return a note for the agent's first message. screen_budget_s: the tuner's timing
    seconds per kernel screen (None: the tuner's default)."""
    from tilesmith.search.tuner import TunerConfig, search

    cfg = TunerConfig()
    if screen_budget_s:
        cfg.screen_budget_s = screen_budget_s
    gen = search(track, cfg)
    verdict, judged, accepted = None, [], None
    try:
        while len(judged) < max_candidates and not expired():
            cand = gen.send(verdict) if verdict is not None else next(gen)
            verdict = submit(cand)
            judged.append((cand.label, verdict))
            if verdict.get("accepted"):
                accepted = cand.label
                break
    except StopIteration:
        pass
    finally:
        gen.close()
    log = track.profiles / "tuner_variants.jsonl"
    screened = len(log.read_text().splitlines()) if log.exists() else 0
    parts = [f"Warm start: the built-in tuner screened {screened} launch-parameter variant(s) "
             "(all in /profiles/tuner_variants.jsonl) and the gate judged {n} candidate(s).".format(n=len(judged))]
    for label, vd in judged:
        tm = (vd.get("confirmation") or vd.get("first") or {}).get("timing") or {}
        res = (f"accepted, {tm.get('speedup', 0):.3f}x" if vd.get("accepted") else
               f"rejected at {vd.get('stage')}: " + ", ".join(r.get("code", "") for r in vd.get("reasons", [])))
        parts.append(f"- {label[:160]}: {res}")
    if accepted:
        parts.append("Its accepted source is /best.py, your starting point: do not redo its launch parameters.")
    elif not judged:
        parts.append("No variant screened faster than the original: its launch parameters are already good.")
    _best_screens(log, parts)
    return "\n".join(parts)


def _best_screens(log, parts: list, top: int = 5) -> None:
    """The fastest screened variants per kernel, so the agent sees what launch parameters did."""
    if not log.exists():
        return
    rows = []
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("median_ms") and e.get("current_ms"):
            rows.append((e["current_ms"] / e["median_ms"], e.get("kernel"), e.get("variant")))
    for gain, kernel, variant in sorted(rows, reverse=True)[:top]:
        parts.append(f"  screened {gain:.3f}x vs current: {kernel}: {variant}")
