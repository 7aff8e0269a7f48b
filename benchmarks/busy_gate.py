"""The gate's decisions on a busy machine: full decisions with CPU hogs running beside them.

    python benchmarks/busy_gate.py [--hogs 2] [--trials 100] [--win 1.4] [--slower 0.85] [--budget-s 3600]
        [--kinds aa,slower,win] [--graph GRAPH_DIR] [--arms "LABEL:VAR=VALUE,...;LABEL:..."] [--out FILE.json]

Three kinds of candidate, judged in turn (A/A, slower, win, A/A, ...) by the whole gate with the screen on, each
decision a fresh `judge` with its own seed, while `--hogs` processes spin on the CPUs (pure Python loops, never
pinned: the scheduler puts them where the gate's workers are):
- A/A: the original against itself. Every accept is a false accept.
- slower: the original with redundant work (benchmarks/gate_calibration.slowed_graph), measured to run at about
  `--slower` of the original's speed. Every accept is a false accept.
- win: the original against a copy of itself slowed to `--win` times its time: a genuine win of that size.
The graph is examples/inference.py's on the CPU unless --graph names one. Prints per kind the decisions, accepts
(with exact one-sided 95 % bounds), the reasons of the rejections, how many were called forged or unstable, how many
were accepted only by a pass that ran past the plain budget on the busy machine (timing._budget_s) and the median
share of the time some task waited for a CPU;
writes JSON. With --arms, every kind is judged under each arm's environment in turn, decision by decision (the
machine's conditions drift within the hour: arms compared one after the other would compare two hours). Never passes or fails: it measures. The slowed copies' measured ratios are printed: they are measured
before the hogs start, on the machine as it is.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gate_calibration import capture_example, clopper_pearson, slowed_graph  # noqa: E402

HOG = "while True:\n    pass\n"
FORGED = {"timing-forged", "wrong-values-in-timing"}


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        p.kill()
    for p in hogs:
        p.wait()


def decide(graph: Path, candidate: Path, seed: int, time_budget_s: float | None, policy: dict | None = None) -> dict:
    from tilesmith.gate import Policy, judge

    t0 = time.monotonic()
    v = judge(graph, candidate, Policy(seed=seed, **({"time_budget_s": time_budget_s} if time_budget_s else {}),
                                       **(policy or {})))
    t = v.first.timing if v.first and v.first.timing else None
    c = v.confirmation.timing if v.confirmation and v.confirmation.timing else None
    return {"accepted": v.accepted, "stage": v.stage, "codes": v.codes, "wall_s": round(time.monotonic() - t0, 2),
            "speedup": t.speedup if t else None, "low": t.speedup_low if t else None,
            "stall_share": getattr(t, "busy_share", None), "budget_s": getattr(t, "budget_s", None),
            "plain_budget_s": Policy(**({"time_budget_s": time_budget_s} if time_budget_s else {})).time_budget_s,
            "seconds": [round(getattr(x, "seconds", 0.0), 2) for x in (t, c) if x],
            "retried": len(getattr(v, "retried", [])),  # passes a busy machine lost, measured again (gate._measured)
            "why": "; ".join(f"{r.code}: {r.message[:400]}" for r in v.reasons)}


def parse_arms(text: str) -> dict[str, dict[str, str]]:
    """'label:VAR=value,VAR=value;label:' -> {label: {VAR: value}}; an empty value unsets the variable."""
    arms = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        label, _, assigns = part.partition(":")
        arms[label.strip()] = dict(kv.split("=", 1) for kv in filter(None, (x.strip() for x in assigns.split(","))))
    return arms


class environment:
    """os.environ with `env` applied (an empty value unsets), put back as it was on exit."""

    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, {}

    def __enter__(self):
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ.pop(k, None) if v == "" else os.environ.__setitem__(k, v)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def summary(rows: list[dict]) -> dict:
    acc = sum(r["accepted"] for r in rows)
    lo, hi = clopper_pearson(acc, len(rows)) if rows else (None, None)
    codes = collections.Counter(c for r in rows if not r["accepted"] for c in (r["codes"] or [r["stage"]]))
    return {"decisions": len(rows), "accepted": acc, "accept_low95": lo, "accept_high95": hi,
            "forged": sum(bool(FORGED & set(r["codes"])) for r in rows),
            "unstable": sum("unstable-timing" in r["codes"] for r in rows),
            "extended": sum(r["accepted"] and max(r.get("seconds") or [0]) > (r.get("plain_budget_s") or 1e9)
                            for r in rows),
            "median_stall_share": sorted(r.get("stall_share") or 0 for r in rows)[len(rows) // 2] if rows else None,
            "rejections_by_code": dict(codes),
            "retried": sum(r.get("retried") or 0 for r in rows),
            "accepted_after_retry": sum(bool(r["accepted"] and r.get("retried")) for r in rows),
            "median_wall_s": sorted(r["wall_s"] for r in rows)[len(rows) // 2] if rows else None}


def table(results: dict) -> str:
    lines = ["| candidate | decisions | accepted | 95 % bounds | forged | unstable | accepted after the budget "
             "| passes measured again (accepted after) | CPU stall share | rejections by reason | median s |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for kind, s in results["kinds"].items():
        b = f"[{s['accept_low95']:.3f}, {s['accept_high95']:.3f}]" if s["decisions"] else "-"
        why = ", ".join(f"{k} {v}" for k, v in sorted(s["rejections_by_code"].items())) or "-"
        lines.append(f"| {kind} | {s['decisions']} | {s['accepted']} | {b} | {s['forged']} | {s['unstable']} | "
                     f"{s['extended']} | {s.get('retried', 0)} ({s.get('accepted_after_retry', 0)}) | "
                     f"{s['median_stall_share'] or 0:.2f} | {why} | "
                     f"{s['median_wall_s']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes beside the gate")
    ap.add_argument("--trials", type=int, default=100, help="decisions per kind (fewer if --budget-s runs out)")
    ap.add_argument("--win", type=float, default=1.4, help="the genuine win: the baseline copy runs this much longer")
    ap.add_argument("--slower", type=float, default=0.85, help="the slower candidate's speed against the original")
    ap.add_argument("--budget-s", type=float, default=3600.0, help="wall seconds for the decisions: no round of the three kinds starts after it")
    ap.add_argument("--time-budget", type=float, default=None, help="timing seconds per gate pass (default: the gate's)")
    ap.add_argument("--kinds", default="aa,slower,win", help="which kinds to judge, in turn: aa, slower, win")
    ap.add_argument("--graph", type=Path, help="a captured graph dir (default: capture examples/inference.py, CPU)")
    ap.add_argument("--arms", default="", help="environments to compare, interleaved: 'label:VAR=value,VAR=value;label:' "
                                               "(an arm with no assignment is the environment as it is; "
                                               "policy.FIELD=N sets an integer field of the gate's Policy)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    arms = parse_arms(a.arms) if a.arms else {"": {}}

    import torch

    work = Path(tempfile.mkdtemp(prefix="busy-gate-"))
    graph = a.graph or capture_example("cpu", work / "cpu", None)
    original = graph / "wrapper.py"
    slow_graph, win_cost = slowed_graph(graph, work / "win", a.win)
    slower_graph, slower_cost = slowed_graph(graph, work / "slower", 1 / a.slower)
    slower = slower_graph / "wrapper.py"  # as a candidate for the original graph
    print(f"win: the baseline copy measured {win_cost['measured']:.3f}x the original's time; slower candidate: "
          f"{1 / slower_cost['measured']:.3f}x the original's speed (both measured before the hogs start)", file=sys.stderr)
    kinds = {"A/A (the original)": (graph, original), f"slower ({1 / slower_cost['measured']:.2f}x)": (graph, slower),
             f"win ({win_cost['measured']:.2f}x)": (slow_graph, original)}
    wanted = {"aa", "slower", "win"} & set(a.kinds.split(","))
    if not wanted:
        ap.error(f"--kinds {a.kinds!r} names none of aa, slower, win")
    kinds = {k: v for k, v in kinds.items() if k.split()[0].replace("A/A", "aa") in wanted}
    rows: dict = {(f"{k}, {arm}" if arm else k): [] for k in kinds for arm in arms}
    hogs = start_hogs(a.hogs)
    start = time.monotonic()
    try:
        for i in range(a.trials):  # whole rounds: every kind gets as many decisions
            if time.monotonic() - start > a.budget_s:
                break
            for (kind, (g, cand)), (arm, env) in ((k, arm) for k in kinds.items() for arm in arms.items()):
                # policy.FIELD=value sets a field of the gate's Policy (e.g. policy.busy_retries=0); the rest are variables
                policy = {k[7:]: int(v) for k, v in env.items() if k.startswith("policy.")}
                with environment({k: v for k, v in env.items() if not k.startswith("policy.")}):
                    r = decide(g, cand, 1000 + i, a.time_budget, policy)
                kind = f"{kind}, {arm}" if arm else kind
                rows[kind].append(r)
                print(f"  {kind} {i + 1}: {'ACCEPT' if r['accepted'] else 'reject'} at {r['stage']} "
                      f"{','.join(r['codes'])} speedup {r['speedup'] or float('nan'):.3f} "
                      f"low {r['low'] or float('nan'):.3f} ({r['wall_s']} s)"
                      + (f", {r['retried']} pass(es) measured again" if r["retried"] else ""), file=sys.stderr)
    finally:
        stop_hogs(hogs)
    results = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
               "torch": torch.__version__, "python": platform.python_version(), "hogs": a.hogs, "arms": arms,
               "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
               "win_measured": win_cost["measured"], "slower_measured": 1 / slower_cost["measured"],
               "original_ms": win_cost["original_ms"], "kinds": {k: summary(v) for k, v in rows.items()}, "rows": rows}
    print(table(results))
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
