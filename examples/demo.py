"""The main job end to end on an embedded example, through the public CLI, as a user would run it:
capture -> optimize (built-in tuner, no model) -> report -> install -> the program again with the
runtime. It runs from the repository root with relative paths, the way a user types them, and keeps
everything under ./demo-out (workspace and TILESMITH_HOME), so nothing else is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("TILESMITH_DEMO_OUT", "demo-out"))  # relative to the repository root
EXAMPLE = Path("examples") / "oversubscribed.py"


def step(title: str, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    print(f"\n$ {title}", flush=True)
    p = subprocess.run(list(args), env={**os.environ, "COLUMNS": "140", **(env or {})}, text=True, capture_output=True)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr[-3000:])
    if check and p.returncode != 0:
        sys.exit(f"demo: step failed with exit code {p.returncode}")
    return p


def main() -> None:
    os.chdir(ROOT)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    os.environ["TILESMITH_HOME"] = str(OUT / "home")  # relative, like every path below
    ws = OUT / "workspace"
    exe = Path(sys.executable).with_name("tilesmith")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "tilesmith_cli.app"]
    step(f"tilesmith capture {EXAMPLE} -w {ws}", *cli, "capture", str(EXAMPLE), "-w", str(ws))
    opt = step(f"tilesmith optimize -w {ws} --optimizer tuner --json", *cli, "optimize", "-w", str(ws), "--optimizer",
               "tuner", "--json")
    run = json.loads(opt.stdout[opt.stdout.index("{"):])
    rid = run["run_id"]
    step(f"tilesmith report {rid}", *cli, "report", rid, "--html", str(OUT / "report.html"))
    step(f"tilesmith install {rid}", *cli, "install", rid)
    code = ("import json, runpy, sys, tilesmith.runtime as rt; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); print('runtime:', json.dumps(rt.stats().to_dict()))")
    again = step(f"python {EXAMPLE} with `import tilesmith.runtime`", sys.executable, "-c", code, str(EXAMPLE))
    stats = json.loads(again.stdout.split("runtime:", 1)[1])
    loaded = set(stats["substituted_keys"])
    accepted = [t for t in run["tracks"] if t["loops_done"]]
    print("\nWhat the demo found:")
    for t in run["tracks"]:
        if t["loops_done"]:
            used = "installed and loaded by the runtime" if t["key"] in loaded else "installed, but the runtime did NOT load it"
            print(f"  graph {t['key'][:12]} ({t['kind']}): {t['speedup']:.2f}x faster, at least {t['speedup_low']:.2f}x "
                  f"with 99.5% confidence, after {t['candidates']} candidate(s); {used}")
        else:
            print(f"  graph {t['key'][:12]} ({t['kind']}): no candidate passed the gate ({t['status']}: {t['reason']})")
    print(f"  {len(accepted)} of {len(run['tracks'])} graph(s) improved; report page: {OUT / 'report.html'}")


if __name__ == "__main__":
    main()
