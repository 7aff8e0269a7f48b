"""The main job end to end on an embedded example, through the public CLI, as a user would run it:
capture -> optimize (built-in tuner, no model) -> report -> install -> the program again with the
runtime. Everything goes under ./demo-out (workspace and TILESMITH_HOME), so nothing else is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("TILESMITH_DEMO_OUT", ROOT / "demo-out"))
EXAMPLE = ROOT / "examples" / "oversubscribed.py"


def step(title: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    print(f"\n$ {title}", flush=True)
    p = subprocess.run(list(args), env={**os.environ, "COLUMNS": "140", **(env or {})}, text=True, capture_output=True)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr[-3000:])
    if check and p.returncode != 0:
        sys.exit(f"demo: step failed with exit code {p.returncode}")
    return p


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    os.environ["TILESMITH_HOME"] = str(OUT / "home")
    ws = OUT / "workspace"
    cli = [sys.executable, "-m", "tilesmith_cli.app"]
    step(f"tilesmith capture {EXAMPLE.name}", *cli, "capture", str(EXAMPLE), "-w", str(ws))
    opt = step("tilesmith optimize --optimizer tuner --json", *cli, "optimize", "-w", str(ws), "--optimizer", "tuner",
               "--json")
    run = json.loads(opt.stdout[opt.stdout.index("{"):])
    rid = run["run_id"]
    step(f"tilesmith report {rid}", *cli, "report", rid, "--html", str(OUT / "report.html"))
    step(f"tilesmith install {rid}", *cli, "install", rid)
    code = ("import runpy, sys, tilesmith.runtime as rt; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); s = rt.stats(); "
            "print('runtime:', s.to_dict() if hasattr(s, 'to_dict') else s)")
    step("python oversubscribed.py with `import tilesmith.runtime`", sys.executable, "-c", code, str(EXAMPLE))
    accepted = [t for t in run["tracks"] if t["loops_done"]]
    print("\nWhat the demo found:")
    for t in run["tracks"]:
        if t["loops_done"]:
            print(f"  graph {t['key'][:12]} ({t['kind']}): {t['speedup']:.2f}x faster, at least {t['speedup_low']:.2f}x "
                  f"with 99.5% confidence, after {t['candidates']} candidate(s); installed and loaded by the runtime")
        else:
            print(f"  graph {t['key'][:12]} ({t['kind']}): no candidate passed the gate ({t['status']}: {t['reason']})")
    print(f"  {len(accepted)} of {len(run['tracks'])} graph(s) improved; report page: {OUT / 'report.html'}")


if __name__ == "__main__":
    main()
