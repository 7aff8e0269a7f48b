"""One step of `make gpu-smoke`: the README's flow as a user types it, in a fresh folder, on a GPU.

    python tests/gpu/smoke_flow.py --mode reduce-overhead --dir /tmp/smoke-ro [--minutes 1] [--script S] [-- ARGS]

`tilesmith capture examples/moe.py -- --mode MODE` (or script S with ARGS: tests/fixtures/train_step.py, whose
graphs update their inputs in place), `tilesmith optimize --optimizer tuner --max-minutes M`,
`tilesmith install RUN`, then the script again with the runtime. It passes only if a candidate was accepted,
installed, and substituted by the runtime in the program, whose output matches the run without the runtime, and
TILESMITH_VERIFY=2 checks it against Inductor's code in the program without a difference. Prints what it found and exits non-zero on the first step that fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "moe.py"


def tilesmith() -> list[str]:
    exe = Path(sys.executable).with_name("tilesmith")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tilesmith_cli.app"]


def run(title: str, cmd: list[str], env: dict | None = None, timeout: int = 400) -> subprocess.CompletedProcess:
    print(f"$ {title}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "160", **(env or {})})
    print(p.stdout[-3000:], p.stderr[-3000:], sep="\n", flush=True)
    if p.returncode != 0:
        sys.exit(f"smoke: `{title}` exited {p.returncode}")
    return p


def checksum(stdout: str) -> float:
    m = re.search(r"checksum (-?[\d.]+)", stdout)
    if not m:
        sys.exit("smoke: the example printed no checksum")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="default")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--script", type=Path, default=EXAMPLE)
    ap.add_argument("--long", default="", help="the script's arguments for a longer run after the checks (e.g. "
                    "'--steps 300'): plain and with the runtime, their checksums compared")
    ap.add_argument("args", nargs="*", help="the script's own arguments (after --)")
    a = ap.parse_args()
    script = a.script.resolve()
    d = Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    os.chdir(d)  # a fresh folder: the workspace and home are the defaults a user gets there
    os.environ["TILESMITH_HOME"] = str(d / "home")
    mode = ([] if a.mode == "default" else ["--mode", a.mode]) + a.args
    ts = tilesmith()
    run(f"tilesmith capture {script} -- {' '.join(mode)}", ts + ["capture", str(script), "--", *mode])
    opt = run(f"tilesmith optimize --optimizer tuner --max-minutes {a.minutes} --json",
              ts + ["optimize", "--optimizer", "tuner", "--max-minutes", str(a.minutes), "--json"])
    result = json.loads(opt.stdout[opt.stdout.index("{"):])
    won = [t for t in result["tracks"] if t.get("loops_done")]
    for t in result["tracks"]:
        print(f"graph {t['key'][:12]}: {t['status']} {t.get('speedup') or ''} {t.get('reason') or ''}")
    if not won:
        sys.exit("smoke: the tuner's optimize accepted nothing")
    run(f"tilesmith install {result['run_id']}", ts + ["install", result["run_id"]])
    plain = run(f"python {script.name} {' '.join(mode)}", [sys.executable, str(script), *mode])
    code = ("import json, runpy, sys, tilesmith.runtime as rt; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); print('runtime:', json.dumps(rt.stats().to_dict()))")
    again = run(f"python {script.name} {' '.join(mode)} with the runtime", [sys.executable, "-c", code, str(script), *mode])
    stats = json.loads(again.stdout.split("runtime:", 1)[1])
    used = set(stats.get("substituted_keys") or [])
    if not used & {t["key"] for t in won}:
        sys.exit(f"smoke: the runtime substituted none of the installed wins ({stats})")
    a_sum, b_sum = checksum(plain.stdout), checksum(again.stdout)
    if abs(a_sum - b_sum) > 1e-2 * max(1.0, abs(a_sum)):
        sys.exit(f"smoke: the program's output changed with the runtime ({a_sum} vs {b_sum})")
    checked = run(f"TILESMITH_VERIFY=2 python {script.name} {' '.join(mode)} with the runtime",
                  [sys.executable, "-c", code, str(script), *mode], env={"TILESMITH_VERIFY": "2"})
    v = json.loads(checked.stdout.split("runtime:", 1)[1]).get("verified") or {}
    if not v or any(x.get("failed") or not x.get("verified_calls") for x in v.values()):
        sys.exit(f"smoke: TILESMITH_VERIFY did not check the installed win against Inductor's code cleanly ({v})")
    long = ""
    if a.long:
        # The program run far longer than it was captured (a training loop for hundreds of steps): the installed
        # graphs carry its state the whole way, as Inductor's would.
        extra = ([] if a.mode == "default" else ["--mode", a.mode]) + a.long.split()
        plain = run(f"python {script.name} {a.long}", [sys.executable, str(script), *extra])
        again = run(f"python {script.name} {a.long} with the runtime", [sys.executable, "-c", code, str(script), *extra])
        stats = json.loads(again.stdout.split("runtime:", 1)[1])
        l_a, l_b = checksum(plain.stdout), checksum(again.stdout)
        if not set(stats.get("substituted_keys") or []) & {t["key"] for t in won}:
            sys.exit(f"smoke: in the longer run ({a.long}) the runtime substituted none of the installed wins ({stats})")
        if abs(l_a - l_b) > 1e-2 * max(1.0, abs(l_a)):
            sys.exit(f"smoke: the longer run's output ({a.long}) changed with the runtime ({l_a} vs {l_b})")
        long = f"; {a.long}: {len(stats['substituted_keys'])} graph(s) substituted, checksums {l_a} / {l_b}"
    print(f"smoke: {len(won)} win(s) accepted, installed and substituted; best "
          f"{max(t['speedup'] for t in won):.2f}x; checksums {a_sum} / {b_sum}{long}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
