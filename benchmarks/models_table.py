"""The model suite's tables (benchmarks/models.py): where each path's step goes, each tilesmith path against
the best compile mode and its own, the gate's estimate of the step beside the measured one, and the
geometric mean over models. `python benchmarks/models.py summary A.json B.json ...` prints them for the
models of several runs together (one device call fits two models, not the suite)."""

from __future__ import annotations

import collections
import math
import statistics


def profile_table(profiles: dict) -> dict:
    """Print where each path's step goes (flow.profile) and whether it is GPU-bound: the GPU busy for
    most of the step, or a step that waits on the host issuing it or on gaps between kernels (what
    CUDA graphs and fewer, larger kernels remove). Returns the profiles, each with its "bound"."""
    print(f"{'path':34} {'wall ms':>9} {'host ms':>9} {'GPU busy ms':>12} {'kernels/step':>13} {'bound':>10}")
    cell = lambda x, w, f: f"{x:{w}.{f}f}" if x is not None else f"{'-':>{w}}"  # noqa: E731
    for k, pr in profiles.items():
        busy, wall = pr.get("gpu_busy_ms"), pr.get("wall_ms")
        pr["bound"] = None if busy is None or not wall else "GPU" if busy >= 0.8 * wall else "host/gaps"
        print(f"{k:34} {cell(wall, 9, 4)} {cell(pr.get('host_ms'), 9, 4)} {cell(busy, 12, 4)} "
              f"{cell(pr.get('kernels_per_step'), 13, 1)} {pr['bound'] or '-':>10}"
              + (f"  error: {pr['error'][:120]}" if pr.get("error") else ""))
    return profiles


def headline(res: dict) -> dict:
    """Best compile mode; each tilesmith path's ratio to it and to its own mode; the gate's estimate."""
    med = {r["path"]: r["median_ms"] for r in res["rows"]}
    compiled = {k: v for k, v in med.items() if k.startswith("compile ")}
    if not compiled:
        return {}
    best = min(compiled, key=compiled.get)
    ts = {}
    for m, info in res["tilesmith"].items():
        ms = med.get(f"tilesmith on {m}")
        own = med.get(f"compile {m}")
        if ms is None:
            continue
        # The gate's estimate of the step: the own mode's measured step minus what the accepted graphs
        # save, each graph's saving (baseline - best, from the optimize run) scaled by measured step /
        # the graphs' summed baselines (the runs time graphs alone; each graph runs once per step here).
        # Scaled only when every graph has a baseline: a graph never profiled (a track that did not
        # start) has an unknown share of the step, and scaling by the others' sum alone inflates the
        # saving (the GPT-2 training step on the H200: 1.05 ms saved per graph read as 4.6 ms).
        timed = [t for t in info["tracks"] if t.get("baseline_ms")]
        total = sum(t["baseline_ms"] for t in timed)
        saved = sum(t["baseline_ms"] - t["best_ms"] for t in timed if t.get("best_ms") and (t.get("speedup") or 1) > 1)
        scaled = bool(own and total and len(timed) == len(info["tracks"]))
        saved = saved * own / total if scaled else saved
        accepted = [round(t["speedup"], 3) for t in info["tracks"] if (t.get("speedup") or 1) > 1]
        statuses = collections.Counter(t["status"] for t in info["tracks"])
        # Nothing accepted means nothing installed: the path runs the own mode's code, and any gap between the
        # two is noise (GPT-2 under reduce-overhead on the H200, session 14: 1.036x with nothing installed).
        # Its ratio is then the own mode's measured step, not a win; the measured one is kept beside it.
        idle = not accepted and own is not None
        ts[m] = {"step_ms": own if idle else ms, "measured_step_ms": ms, "nothing_installed": not accepted,
                 "counted_as_own_mode": idle,
                 "vs_best_mode": compiled[best] / (own if idle else ms),
                 "vs_own_mode": 1.0 if idle else own / ms if own else None,
                 "track_statuses": dict(statuses),
                 "gate_accepted_speedups": accepted,
                 "gate_estimate_ms": own - saved if own else None, "estimate_scaled": scaled, "measured_vs_estimate": (own - saved) / ms
                 if own and own - saved > 0 else None}
    return {"best_mode": best, "best_ms": compiled[best], "tilesmith_paths": ts,
            "tilesmith_best_vs_best_mode": max((t["vs_best_mode"] for t in ts.values()), default=None)}


def summary(results: list[dict]) -> dict:
    print(f"\n{'model':12} {'best mode':30} {'best ms':>9} " + " ".join(f"{'ts on ' + m:>24}" for m in _ts_modes(results))
          + f" {'ts best/best':>13}")
    for r in results:
        if "best_mode" not in r:
            print(f"{r['model']:12} failed: {'; '.join(r['errors'])[:200]}")
            continue
        cells = []
        for m in _ts_modes(results):
            t = r["tilesmith_paths"].get(m)
            cells.append(f"{t['step_ms']:8.4f} ms {t['vs_best_mode']:6.3f}x{'*' if t.get('counted_as_own_mode') else ''}"
                         if t else f"{'-':>24}")
        best = r.get("tilesmith_best_vs_best_mode")
        print(f"{r['model']:12} {r['best_mode']:30} {r['best_ms']:9.4f} " + " ".join(f"{c:>24}" for c in cells)
              + (f" {best:12.3f}x" if best else f" {'-':>13}"))
        for m, t in r["tilesmith_paths"].items():  # a ratio near 1 can mean nothing was optimized: say so
            if t.get("track_statuses", {}).keys() - {"done", "cached"}:
                print(f"{'':12} tilesmith on {m}: graphs by track status {t['track_statuses']}")
            if t.get("gate_estimate_ms") and not t.get("nothing_installed"):  # the program's step beside the gate's word
                print(f"{'':12} tilesmith on {m}: step {t['measured_step_ms']:.4f} ms in the program, "
                      f"{t['gate_estimate_ms']:.4f} estimated from the gate's per-graph timings "
                      f"(estimate / measured {t['measured_vs_estimate']:.3f})")
            if t.get("counted_as_own_mode"):
                print(f"{'':12} * tilesmith on {m}: nothing accepted, nothing installed: the row is compile {m}'s "
                      f"step (its own path measured {t['measured_step_ms']:.4f} ms, the same code)")
            elif t.get("nothing_installed"):
                print(f"{'':12} tilesmith on {m}: nothing accepted, nothing installed (compile {m} not timed: the "
                      f"row is the path's own measured step, the same code as that mode)")
    ratios = [r["tilesmith_best_vs_best_mode"] for r in results if r.get("tilesmith_best_vs_best_mode")]
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None
    print(f"geometric mean of tilesmith's best vs each model's best compile mode: "
          f"{geo:.3f}x over {len(ratios)} models" if geo else "no tilesmith path measured")
    return {"geomean_vs_best_mode": geo, "models_measured": len(ratios)}


def _ts_modes(results: list[dict]) -> list[str]:
    return sorted({m for r in results for m in r.get("tilesmith_paths", {})})
