"""Makespan of one optimize run whose tracks are Ray tasks, over N task slots against one slot.

    python benchmarks/scale_makespan.py WS [WS ...] [--slots 1 4] [--gate-budget-s 2] [--local] [--out scale.json]

The graphs of the workspaces go into one workspace (copied). For each slot count a Ray head on loopback with that
many CPUs (`ray start --head --num-cpus N --block`: one task slot per CPU, each CPU graph's task asks for one)
runs `tilesmith optimize --ray ADDRESS --optimizer tuner` in a fresh TILESMITH_HOME and a fresh Inductor cache,
then stops. `--local` adds the same run without Ray (the run's own process, one track at a time, all cores).
Prints the makespan per configuration and each graph's decision in each (the candidates the gate accepted);
writes JSON. Needs `pip install 'tilesmith[ray]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ports(n: int) -> list[int]:
    """n distinct free ports (all bound at once: one bound and closed at a time can come back twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def merged(dest: Path, sources: list[str]) -> Path:
    from tilesmith import workspace as wsmod

    loaded = [wsmod.load(s) for s in sources]
    graphs = []
    for w in loaded:
        for g in w.graphs:
            if g.eligible and not wsmod.graph_dir(dest, g.key).exists():
                shutil.copytree(w.graph_dir(g.key), wsmod.graph_dir(dest, g.key))
                graphs.append(g)
    w = loaded[0]
    wsmod.save(wsmod.Workspace(path=dest, script=w.script, argv=w.argv, created=w.created,
                               environment=w.environment, graphs=graphs))
    return dest


def fresh_compile_cache(work: Path, name: str) -> None:
    """An empty Inductor cache for one configuration: the variants one configuration compiled would otherwise be
    cache hits for the next, and the configuration run later would look faster."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-cache-{name}")


def start_head(slots: int, tmp: str) -> tuple[subprocess.Popen, str]:
    """A one-node Ray cluster with `slots` CPUs; (its `ray start --block` process, its address)."""
    names = ("node-manager", "object-manager", "metrics-export", "runtime-env-agent", "dashboard-agent-listen",
             "dashboard-agent-grpc", "ray-client-server")
    port, *free = _ports(len(names) + 1)
    ports = [f"--{name}-port={n}" for name, n in zip(names, free)]
    ray = str(Path(sys.executable).with_name("ray"))
    p = subprocess.Popen([ray, "start", "--head", f"--port={port}", f"--num-cpus={slots}", "--num-gpus=0", "--block",
                          "--include-dashboard=false", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                          f"--temp-dir={tmp}", "--object-store-memory=200000000", *ports],
                         stdout=open(Path(tmp) / "head.log", "wb"), stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    code = (f"import ray, time; ray.init(address={address!r}, logging_level='ERROR')\n"
            f"while ray.cluster_resources().get('CPU', 0) < {slots}: time.sleep(0.5)")
    deadline = time.monotonic() + 180
    while True:
        try:
            if subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True).returncode == 0:
                return p, address
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline or p.poll() is not None:  # not up in 3 minutes, or it died
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=120)
            raise SystemExit(f"the Ray head did not come up; see {tmp}/head.log")
        time.sleep(2)  # the head was not listening yet


def one_run(ws: Path, ray_address: str | None, gate_budget_s: float) -> dict:
    from tilesmith import optimize as opt
    from tilesmith import runs

    home = tempfile.mkdtemp(prefix="tilesmith-makespan-home-")
    os.environ["TILESMITH_HOME"] = home
    load_before = os.getloadavg()[0]  # the machine's other work shows here (the cores are shared)
    t0 = time.monotonic()
    r = opt.optimize(ws, opt.OptimizeSettings(optimizer="tuner", gate_time_budget_s=gate_budget_s, ray=ray_address))
    wall = time.monotonic() - t0
    tracks = {}
    for t in r.tracks:
        tdir = runs.track_dir(r.run_id, t.key)
        where = json.loads((tdir / "placement.json").read_text()) if (tdir / "placement.json").exists() else {}
        # The decisions themselves: each candidate the gate judged (its label, accepted or the stage that rejected it).
        verdicts = [json.loads(v.read_text()) for v in sorted((tdir / "profiles").glob("verdict_*.json"))]
        tracks[t.key] = {"status": t.status, "loops_done": t.loops_done, "candidates": t.candidates,
                         "speedup": t.speedup, "speedup_low": t.speedup_low, "baseline_ms": t.baseline_ms,
                         "rejected_by_stage": t.rejected_by_stage, "where": where.get("where", "this process"),
                         "verdicts": [[v.get("label"), "accepted" if v.get("accepted") else v.get("stage")]
                                      for v in verdicts],
                         "reasons": [[f"{x.get('code')}: {x.get('message')}"[:300] for x in v.get("reasons") or []]
                                     for v in verdicts]}
    shutil.rmtree(home, ignore_errors=True)
    return {"status": r.status, "makespan_s": round(wall, 1), "load_1min": [load_before, os.getloadavg()[0]],
            "tracks": tracks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspaces", nargs="+")
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--gate-budget-s", type=float, default=2.0, help="timing budget per gate pass")
    ap.add_argument("--local", action="store_true", help="also run without Ray, in the run's own process")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    # A loopback cluster of this benchmark's own: no token written into ~/.ray (Ray's default for a new local
    # instance), which the next `ray start` on this machine would then require.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch

    work = Path(tempfile.mkdtemp(prefix="tilesmith-makespan-"))
    ws = merged(work / "ws", a.workspaces)
    results = {}
    if a.local:
        fresh_compile_cache(work, "local")
        results["local"] = one_run(ws, None, a.gate_budget_s)
        print(f"local: {results['local']['makespan_s']} s", flush=True)
    for n in a.slots:
        fresh_compile_cache(work, f"ray-{n}")  # before the head starts: its workers, and their tracks, inherit it
        tmp = tempfile.mkdtemp(prefix="tsray-", dir="/tmp")
        head, address = start_head(n, tmp)
        try:
            results[f"ray, {n} slot(s)"] = one_run(ws, address, a.gate_budget_s)
            print(f"ray, {n} slot(s): {results[f'ray, {n} slot(s)']['makespan_s']} s", flush=True)
        finally:
            head.send_signal(signal.SIGTERM)
            head.wait(timeout=120)
            shutil.rmtree(tmp, ignore_errors=True)
    keys = sorted({k for res in results.values() for k in res["tracks"]})
    print(f"{len(keys)} graphs; gate budget {a.gate_budget_s:g} s per pass; {os.cpu_count()} cores; "
          f"torch {torch.__version__}, ray {ray.__version__}, Python {platform.python_version()}")
    print("| configuration | makespan s | load avg at start, end | " + " | ".join(k[:8] for k in keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for name, res in results.items():
        cells = []
        for k in keys:
            t = res["tracks"][k]
            cells.append(f"{t['status']} {t['speedup']:.2f}x" if t["speedup"] else t["status"])
        load = ", ".join(f"{x:.1f}" for x in res["load_1min"])
        print(f"| {name} | {res['makespan_s']} | {load} | " + " | ".join(cells) + " |")
    print("\nDecisions: the candidates the gate accepted, in order (of how many judged)")
    print("| graph | " + " | ".join(results) + " | same |")
    print("|---|" + "---|" * len(results) + "---|")
    for k in keys:
        row = []
        for res in results.values():
            v = res["tracks"][k]["verdicts"]
            row.append(", ".join(label for label, what in v if what == "accepted") or "none")
            row[-1] += f" ({len(v)})"
        print(f"| {k[:8]} | " + " | ".join(row) + f" | {'yes' if len(set(row)) == 1 else 'no'} |")
    if a.out:
        a.out.write_text(json.dumps({"graphs": keys, "gate_budget_s": a.gate_budget_s, "cores": os.cpu_count(),
                                     "results": results}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
