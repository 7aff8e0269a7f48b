"""`report`: what one run found, read back from its files (run.json, each track's profiles/ and
best.json, the workspace): per graph, the whole program, and every candidate the gate judged.

Nothing is measured here. A missing or corrupt file inside a run becomes a note in the report; only
a run that cannot be found or whose run.json cannot be read is a TilesmithError.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path

from tilesmith import runs
from tilesmith.errors import TilesmithError
from tilesmith.profile.baseline import BUSY_SHARE
from tilesmith.report import setting as rs
from tilesmith.report.notes import deciding_timing as _timing, is_number as _num, number as _f, timing_notes
from tilesmith.report.rows import CandidateRow, GraphReport, KernelRow, ProgramEstimate, Report

TOP_KERNELS = 8  # kernels listed per graph; the rest are summed into `other_kernels_ms`


def build_report(run_id: str | None = None) -> Report:
    """Report on run `run_id` (a unique prefix is enough), or on the newest run when None."""
    run = runs.load_run(run_id)
    rid = run.run_id
    rdir = run.dir
    notes: list[str] = []
    settings = run.settings
    ws_graphs = _workspace_graphs(run.workspace, notes)
    keys = list(run.graphs)
    keys += [k for k in ws_graphs if k not in keys]
    started = _parse_time(run.created)
    graphs, candidates = [], []
    for key in keys:
        meta = rs.graph_json(run.workspace, key)
        mode, device = rs.compile_mode(meta, ws_graphs.get(key))
        g, cands = _graph(rdir, key, run.graphs.get(key), ws_graphs.get(key), started, mode)
        g.compile_mode, g.device = mode, device
        if note := rs.gap_note(meta):
            g.notes.append(note)
        g.setting = rs.graph_setting(g, cands, rs.best_text(rdir / key, g.cached))
        graphs.append(g)
        candidates += cands
    graphs.sort(key=lambda g: (g.status == "not in run", -(g.baseline_ms or 0) * (g.seen or 1)))
    candidates.sort(key=lambda c: (c.t_s if c.t_s is not None else math.inf, c.key, c.index))
    if not graphs:
        notes.append("the run holds no graphs")
    return Report(rid, str(run.status), settings.get("optimizer"), run.created, run.ended, run.workspace,
                  run.environment, settings, graphs,
                  _program(graphs), candidates, notes, rs.program_setting(rid, graphs, _program))


def _workspace_graphs(ws_path, notes: list[str]) -> dict:
    """{key: GraphInfo} of the run's workspace; {} plus a note when it is gone or unreadable."""
    from tilesmith import workspace as wsmod

    if not ws_path:
        notes.append("run.json names no workspace: eligibility and call counts are unknown")
        return {}
    try:
        return {g.key: g for g in wsmod.load(ws_path).graphs}
    except TilesmithError as e:
        notes.append(f"workspace not readable ({e.message}): eligibility and call counts are unknown")
        return {}


def _graph(rdir: Path, key: str, entry, info, started, mode: str) -> tuple[GraphReport, list[CandidateRow]]:
    notes: list[str] = []
    t = entry if isinstance(entry, dict) else {}
    tdir = rdir / key
    prof = _read_json(tdir / "profiles" / "baseline.json", notes, "baseline profile") if tdir.is_dir() else None
    verdicts = _verdicts(tdir / "profiles", notes)
    cands = [_candidate(key, i, v, f, started) for i, v, f in verdicts]
    accepted = [c for c in cands if c.accepted]
    if entry is None:
        status = "not in run" if info is None or info.eligible else "ineligible"
    elif "status" in t:
        status = str(t["status"])
    else:  # a submit run records {"accepted", "stage", "reasons"} per graph
        status = "accepted" if t.get("accepted") else ("rejected" if cands else "failed")
    rejected = t.get("rejected_by_stage")
    if not isinstance(rejected, dict):
        rejected = {}
        for c in cands:
            if not c.accepted:
                rejected[c.stage] = rejected.get(c.stage, 0) + 1
    baseline_ms, source, bmode = None, None, None
    # the gate's median of the original (verdicts judged against the best so far name its sha256)
    gate = next((_timing(v) for _, v, _ in verdicts if _num(_timing(v).get("baseline_ms"))
                 and not v.get("timing_baseline_sha256")), {})
    if mode == rs.CUDAGRAPHS and gate.get("mode") == "graph":  # the profile times plain launches
        baseline_ms, source, bmode = float(gate["baseline_ms"]), "gate", "graph"
    elif isinstance(prof, dict) and _num(prof.get("wall_ms")):
        baseline_ms, source, bmode = float(prof["wall_ms"]), "profile", "launch"
    elif _num(t.get("baseline_ms")):
        baseline_ms, source, bmode = float(t["baseline_ms"]), "profile", "launch"
    elif gate:  # no profile (e.g. a submit run)
        baseline_ms, source, bmode = float(gate["baseline_ms"]), "gate", str(gate.get("mode") or "launch")
    notes += timing_notes(verdicts)
    busy = prof.get("busy_share") if isinstance(prof, dict) else None
    if _num(busy) and busy >= BUSY_SHARE:
        notes.append(f"the baseline profile ran on a busy machine (some task waited for a CPU {busy:.0%} of its time): "
                     "its times and the kernels' order may be another program's; the gate's own verdicts are "
                     "judged apart. Run `tilesmith optimize` again on a quiet machine for a faithful profile")
    if mode == rs.CUDAGRAPHS and bmode == "launch":
        notes.append("compiled with CUDA graphs, but no verdict timed Inductor's replay of the original: "
                     "the baseline (and best) here are plain launches")
    sp, lo, hi = _chain(accepted)
    if _num(t.get("speedup")):  # the driver's own credit wins where it recorded one
        sp, lo = float(t["speedup"]), float(t["speedup_low"]) if _num(t.get("speedup_low")) else lo
    cached = _read_json(tdir / "cache.json", notes, "cache.json") if (tdir / "cache.json").exists() else None
    if cached and sp is None and _num(cached.get("speedup")):
        sp = float(cached["speedup"])
        lo, hi = _cached_interval(cached, notes)
    best_ms = baseline_ms / sp if baseline_ms and sp else None
    kernels, other_ms, kernel_ms, overhead_ms = _kernels(prof, notes, _jsonl(tdir / "profiles" / "tuner_variants.jsonl"))
    pr = prof if isinstance(prof, dict) else {}
    return GraphReport(profile_class=str(pr.get("klass") or ""), gap_ms=_f(pr.get("gap_ms")),
        headroom_ms=_f(pr.get("headroom_ms")), ceilings=_ceilings_text(pr.get("ceilings")),
        counters=str(pr.get("counters") or ""),
        key=key, kind=str(t.get("kind") or (info.kind if info else "?")),
        eligible=info.eligible if info else None,
        ineligible_reason=info.reason if info else "", seen=info.seen if info else None,
        status=status, reason=str(t.get("reason") or ""), baseline_ms=baseline_ms, baseline_source=source,
        baseline_mode=bmode,
        best_ms=best_ms, speedup=sp, speedup_low=lo, speedup_high=hi,
        loops_done=int(t.get("loops_done", len(accepted)) or 0), candidates=int(t.get("candidates", len(cands)) or 0),
        rejected_by_stage=rejected, variants_screened=_count_lines(tdir / "profiles" / "tuner_variants.jsonl"),
        model_calls=_model_calls(tdir / "profiles", t, notes), cached=cached, kernel_ms=kernel_ms,
        launch_overhead_ms=overhead_ms, top_kernels=kernels, other_kernels_ms=other_ms, notes=notes), cands


def _verdicts(pdir: Path, notes: list[str]) -> list[tuple[int, dict, Path]]:
    out = []
    for f in sorted(pdir.glob("verdict_*.json")) if pdir.is_dir() else []:
        v = _read_json(f, notes, f.name)
        try:
            index = int(f.stem.split("_", 1)[1])
        except ValueError:
            notes.append(f"{f.name}: not a verdict file name")
            continue
        if isinstance(v, dict):
            out.append((index, v, f))
    return out


def _candidate(key: str, index: int, v: dict, f: Path, started) -> CandidateRow:
    tm = _timing(v)
    passes = [p["timing"] for p in (v.get("first"), v.get("confirmation"))
              if isinstance(p, dict) and isinstance(p.get("timing"), dict)]
    lows = [x for x in (_f(p.get("speedup_low")) for p in passes) if x is not None]
    highs = [x for x in (_f(p.get("speedup_high")) for p in passes) if x is not None]
    try:
        t_s = max(0.0, f.stat().st_mtime - started.timestamp()) if started else None
    except OSError:
        t_s = None
    return CandidateRow(key, index, str(v.get("label") or ("submitted" if index == 0 else f"candidate {index}")),
                        t_s, float(v["wall_s"]) if _num(v.get("wall_s")) else None, bool(v.get("accepted")),
                        str(v.get("stage") or "?"), [str(r.get("code")) for r in v.get("reasons") or [] if isinstance(r, dict)],
                        _f(tm.get("speedup")), min(lows) if lows else None, max(highs) if highs else None,
                        _why(v), str(v.get("sandbox") or ""), str(tm.get("mode") or ""))


def _why(v: dict) -> str:
    if v.get("accepted"):
        return ""
    r = next((r for r in v.get("reasons") or [] if isinstance(r, dict) and r.get("message")), None)
    return str(r["message"])[:300] if r else ""


def _ceilings_text(c) -> str:
    if not isinstance(c, dict) or not c:
        return ""
    bw = f"{c['bandwidth_gbps']:.0f} GB/s" if _num(c.get("bandwidth_gbps")) else "bandwidth unknown"
    fl = ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in (c.get("tflops") or {}).items() if _num(v))
    return f"{c.get('name') or c.get('device') or '?'}: {bw}{', ' + fl if fl else ''} ({c.get('source') or '?'})"


def _chain(accepted: list[CandidateRow]):
    """Speedup over the original: each accepted loop was measured against the previous best, so
    the chain multiplies (as the driver credits it); the interval multiplies its ends."""
    if not accepted or any(c.speedup is None for c in accepted):
        return None, None, None
    sp = lo = hi = 1.0
    for c in accepted:
        sp, lo, hi = sp * c.speedup, lo * (c.speedup_low or c.speedup), hi * (c.speedup_high or c.speedup)
    return sp, lo, hi


def _cached_interval(cached: dict, notes: list[str]):
    m = _read_json(Path(cached["manifest"]), notes, "the installed manifest") if cached.get("manifest") else None
    ev = m.get("evidence") if isinstance(m, dict) else None
    if isinstance(ev, dict):
        return _f(ev.get("speedup_low")), _f(ev.get("speedup_high"))
    return None, None


def _kernels(prof, notes: list[str], screened: list[dict]):
    """The top kernels of the baseline profile, each with what the tuner tried on it (`screened`: the track's
    tuner_variants.jsonl); the time of the others; the kernel and launch-overhead totals."""
    if not isinstance(prof, dict):
        return [], 0.0, None, None
    try:
        rows = [KernelRow(str(k["name"]), str(k.get("kind", "?")), int(k.get("calls", 0)), float(k["time_ms"]),
                          float(k.get("share", 0.0)), int(k.get("bytes") or 0), int(k.get("flops") or 0),
                          _f(k.get("gbps")), _f(k.get("tflops")), _f(k.get("bw_frac")), _f(k.get("flop_frac")),
                          _f(k.get("headroom_ms")), str(k.get("klass") or ""), _site(k.get("sites")))
                for k in prof.get("kernels") or []]
    except (KeyError, TypeError, ValueError) as e:
        notes.append(f"baseline profile: unreadable kernel list ({type(e).__name__}: {e})")
        return [], 0.0, None, None
    rows.sort(key=lambda k: -k.time_ms)
    for k in rows[:TOP_KERNELS]:
        k.tried = tried_text([v for v in screened if v.get("kernel") == k.name])
    other = float(sum(k.time_ms for k in rows[TOP_KERNELS:]))
    return rows[:TOP_KERNELS], other, _f(prof.get("kernel_ms")), _f(prof.get("launch_overhead_ms"))


def tried_text(variants: list[dict]) -> str:
    """What the tuner's screen made of one kernel's variants (its rows of tuner_variants.jsonl): how many ran and
    the best against the current source on the whole call, how many did not run and why (the first error)."""
    if not variants:
        return "not tried"
    ran = [v for v in variants if _num(v.get("median_ms")) and _num(v.get("current_ms")) and v["median_ms"] > 0]
    parts = []
    if ran:
        best = max(ran, key=lambda v: v["current_ms"] / v["median_ms"])
        x = best["current_ms"] / best["median_ms"]
        parts.append(f"{len(ran)} variant(s) screened, best {best.get('variant')} at {x:.3f}x the call"
                     + ("" if x > 1 else ": none faster"))
    if len(ran) < len(variants):
        error = next((str(v["error"]) for v in variants if v not in ran and v.get("error")), "")
        parts.append(f"{len(variants) - len(ran)} did not run" + (f" ({error[:80]})" if error else ""))
    return "; ".join(parts)


def _jsonl(f: Path) -> list[dict]:
    """The dict lines of a JSON-lines file (a line cut off by a killed run is skipped); [] when there is none."""
    rows = []
    for line in f.read_text(errors="replace").splitlines() if f.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _site(sites) -> str:
    if not isinstance(sites, dict) or not sites:
        return ""
    line = min(sites, key=lambda x: int(x) if str(x).isdigit() else 0)
    more = f" (+{len(sites) - 1} more)" if len(sites) > 1 else ""
    return f"L{line}: {sites[line]}{more}"


def _model_calls(pdir: Path, t: dict, notes: list[str]) -> int | None:
    """The agent's model calls: the track's own count if the driver recorded one, else the sum of
    `model_calls` over profiles/turn_*.json (one file per turn); None when no agent ran."""
    if isinstance(t.get("model_calls"), int):
        return t["model_calls"]
    turns = sorted(pdir.glob("turn_*.json")) if pdir.is_dir() else []
    if not turns:
        return None
    total = 0
    for f in turns:
        d = _read_json(f, notes, f.name)
        if isinstance(d, dict) and isinstance(d.get("model_calls"), int):
            total += d["model_calls"]
    return total


def _program(graphs: list[GraphReport]) -> ProgramEstimate | None:
    measured = [g for g in graphs if g.baseline_ms and g.status not in ("not in run", "ineligible")]
    if not measured:
        return None
    base = opt = opt_high = 0.0
    improved = 0
    for g in measured:
        w = g.seen or 1
        base += g.baseline_ms * w
        if g.best_ms and g.speedup and g.speedup > 1.0:
            improved += 1
            opt += g.best_ms * w
            # the pessimistic end: the speedup at its lower bound (never worse than the original)
            opt_high += g.baseline_ms / max(1.0, g.speedup_low or 1.0) * w
        else:
            opt += g.baseline_ms * w
            opt_high += g.baseline_ms * w
    unweighted = [g.key[:12] for g in measured if g.seen is None]
    note = (f"estimate from per-graph measurements of {len(measured)} of {len(graphs)} graphs (one call each, "
            "weighted by how often the program compiled the graph), not an end-to-end measurement: time outside "
            "compiled graphs and in unmeasured graphs is not included; the low end takes each graph at its "
            "speedup's lower confidence bound")
    if unweighted:
        note += f"; call counts unknown for {', '.join(unweighted)} (counted once)"
    return ProgramEstimate(base, opt, opt_high, base / opt, base / opt_high, len(measured), len(graphs), improved, note)


def _read_json(f: Path, notes: list[str], what: str):
    try:
        return json.loads(Path(f).read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        notes.append(f"{what} ({Path(f).name}) is unreadable: {type(e).__name__}: {e}")
        return None


def _count_lines(f: Path) -> int:
    try:
        return sum(1 for line in f.read_text().splitlines() if line.strip())
    except (OSError, UnicodeDecodeError):
        return 0


def _parse_time(iso):
    try:
        return _dt.datetime.fromisoformat(iso) if isinstance(iso, str) else None
    except ValueError:
        return None


def agent_budgets(settings: dict) -> str | None:
    """The agent's budgets per graph as the run used them (None for a tuner run)."""
    if settings.get("optimizer") != "agent":
        return None
    calls, minutes = settings.get("max_model_calls"), settings.get("graph_minutes")
    return (f"agent budgets per graph: {calls or 'unlimited'} model calls, "
            f"{f'{minutes:g} minutes' if minutes else 'no time limit'}; model {settings.get('model') or '?'}, "
            f"reasoning effort {settings.get('reasoning_effort') or 'default'}, "
            f"warm start {'on' if settings.get('warm_start', True) else 'off'}")
