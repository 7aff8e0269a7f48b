"""Seconds from asking for a gate worker to its first answer: a new interpreter versus a fork of the zygote.

    python benchmarks/worker_start.py [--workers 5] [--device cpu] [--out worker_start.json]

Each way starts `--workers` gate workers one after another (the sandbox the machine allows, the scrubbed
environment, exactly as the gate does) and times each from the constructor to the answer of its `ready`
request; the first forked worker includes starting the zygote itself. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _start_times(n: int, device: str, fork: str) -> list[float]:
    os.environ["TILESMITH_FORK_WORKERS"] = fork
    from tilesmith.gate.proc import Worker

    out = []
    with tempfile.TemporaryDirectory(prefix="tilesmith-worker-start-") as tmp:
        for _ in range(n):
            t0 = time.monotonic()
            with Worker("bench", Path(tmp), device) as w:
                w.request({"op": "ready"}, 600.0)
                out.append(time.monotonic() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import torch

    from tilesmith.launch import sandbox

    rows = []
    for label, fork in (("new interpreter", "off"), ("forked from the zygote", "on")):
        s = _start_times(a.workers, a.device, fork)
        rows.append({"way": label, "first_s": s[0], "median_after_first_s": statistics.median(s[1:]) if len(s) > 1 else None,
                     "all_s": s})
    print(f"{'way':<24} {'first s':>8} {'median after first s':>22}")
    for r in rows:
        after = "-" if r["median_after_first_s"] is None else f"{r['median_after_first_s']:.2f}"
        print(f"{r['way']:<24} {r['first_s']:>8.2f} {after:>22}")
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.node(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "torch": torch.__version__, "device": a.device,
           "sandbox": sandbox.level(), "workers": a.workers, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
