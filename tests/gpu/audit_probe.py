"""Evidence for the gate worker's audit hook: which function attributes library code sets on an honest load and
launch path. For each captured graph under the given folders, a fresh process set up as a gate worker is (torch,
Inductor's runtime and the device warmed by gate.worker.warm) records every `object.__setattr__`/`__delattr__` of a
function's `__code__`, `__defaults__` or `__kwdefaults__` while it loads the original wrapper and calls it three
times, then its whole-call replay (CUDA): the attribute, the function's module and name, whether the function
existed before the load (a swap) or was made during it (a new function), and where the set happened.

    python tests/gpu/audit_probe.py DIR [DIR ...] --out events.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import collections, gc, json, sys, types
sys.path.insert(0, ROOT)
import torch
from tilesmith.gate.worker.warm import warm_device, warm_inductor
device = "cuda" if torch.cuda.is_available() else "cpu"
warm_inductor(device); warm_device(device)
from tilesmith.capture import loading
before = {id(o) for o in gc.get_objects() if isinstance(o, types.FunctionType)}
events = collections.Counter()
def hook(event, args):
    if event in ("object.__setattr__", "object.__delattr__") and type(args[0]) is types.FunctionType \
            and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
        fn, f = args[0], sys._getframe(1)
        while f is not None and f.f_code.co_filename.endswith(("collections/__init__.py", "typing.py")):
            f = f.f_back
        where = f"{f.f_code.co_filename.split('site-packages/')[-1]}:{f.f_lineno}" if f else "?"
        events[(args[1], getattr(fn, "__module__", "?"), fn.__qualname__, id(fn) in before, where)] += 1
sys.addaudithook(hook)
data = loading.load_graph_data(GDIR)
consts = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in data.constants.items()}
text = open(GDIR + "/wrapper.py").read()
texts = [("original", text)]
if device == "cuda":
    from tilesmith.search.graphed import graphed_text
    texts.append(("replay", graphed_text(text)))
for role, t in texts:
    call = loading.load_module(t, consts).call
    with torch.no_grad():
        for _ in range(3):
            call(loading.clone_args(data.inputs))
    if device == "cuda":
        torch.cuda.synchronize()
print(json.dumps([list(k) + [n] for k, n in events.items()]))
"""


def _probe(gdir: Path) -> dict:
    meta = json.loads((gdir / "graph.json").read_text())
    code = CHILD.replace("ROOT", repr(str(ROOT))).replace("GDIR", repr(str(gdir)))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return {"graph": gdir.name[:12], "kind": meta.get("kind"), "error": p.stderr[-1500:]}
    events = json.loads(p.stdout.strip().splitlines()[-1])
    return {"graph": gdir.name[:12], "kind": meta.get("kind"), "events": [
        dict(zip(("attr", "module", "name", "existed_before", "where", "count"), e)) for e in events]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    graphs = [g.parent for d in a.dirs for g in sorted(Path(d).rglob("graph.json"))
              if json.loads(g.read_text()).get("eligible")]
    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(_probe, graphs))
    for r in rows:
        events = r.get("events", [])
        swaps = [e for e in events if e["existed_before"]]
        print(f"{r['graph']} {r.get('kind')}: {sum(e['count'] for e in events)} sets, "
              f"{sum(e['count'] for e in swaps)} on functions that existed before the load {r.get('error', '')[-300:]}")
        for e in swaps[:10]:
            print("   ", e)
    Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
