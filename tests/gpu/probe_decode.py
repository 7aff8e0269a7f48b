"""A diagnostic, not a test: the CUDA decode step (tests/fixtures/decode_step.py, reduce-overhead) captured into
$PROBE_WS (default /tmp/probe-ws), then its original (or, with PROBE_REPLAY=1, tilesmith's whole-call replay of it)
judged against the original in each timing mode named, printing every reason and each gate worker's error lines.
Found the cache run out of bounds and, with it, the replay's `wrong-values-in-timing` (the gate's checks read by the
graph's timing mode, not the replay's: gate.timed.kept_late), both 2026-12-07:

    PROBE_REPLAY=1 python tests/gpu/probe_decode.py launch graph
"""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
import torch
ws = Path(os.environ.get("PROBE_WS", "/tmp/probe-ws"))
if not (ws / "graphs").exists():
    p = subprocess.run([sys.executable, "-m", "tilesmith_cli.app", "capture", "tests/fixtures/decode_step.py", "-w", str(ws),
                        "--force", "--", "--device", os.environ.get("PROBE_DEVICE", "cuda"), "--mode", "reduce-overhead", "--tokens", "8"],
                       capture_output=True, text=True)
    print("capture rc", p.returncode, p.stdout[-1500:], p.stderr[-3000:])
from tilesmith.capture import loading
from tilesmith.gate import Policy, judge
from tilesmith.gate import proc as _proc
_close = _proc.Worker.close
def _dump(self):
    try:
        t = self.log_path.read_text(errors="replace").splitlines()
        keep = [l for l in t if "ssert" in l or "rror" in l or "Traceback" in l]
        print(f"   --- worker {self.name} log: {len(t)} lines; assert/error lines:", *keep[:25], *t[-8:], sep="\n      ")
    except OSError:
        pass
    _close(self)
_proc.Worker.close = _dump
for g in sorted((ws / "graphs").iterdir()):
    meta = json.loads((g / "graph.json").read_text())
    if not meta.get("mutated_inputs"):
        continue
    print("graph", g.name, "mutated", meta["mutated_inputs"], "static", meta.get("inductor_static_inputs"),
          "from_graphs", meta.get("inputs_from_graphs"))
    data = loading.load_graph_data(g)
    for i, (x, d) in enumerate(zip(data.inputs, meta.get("inputs") or [])):
        if isinstance(x, torch.Tensor) and i in meta["mutated_inputs"]:
            print(f"  in{i} {tuple(x.shape)} {x.dtype} param={d.get('parameter')} range={d.get('range')}")
    w = (g / "wrapper.py").read_text()
    if os.environ.get("PROBE_REPLAY"):
        from tilesmith.search.graphed import graphed_text
        w = graphed_text(w)
    print("  asserts in wrapper:", w.count("device_assert"), [l.strip()[:160] for l in w.splitlines() if "device_assert" in l][:6])
    for mode in sys.argv[1:] or ["auto"]:
        tmp = Path(f"/tmp/probe-{mode}"); shutil.rmtree(tmp, ignore_errors=True); tmp.mkdir()
        cand = tmp / "aa.py"; cand.write_text(w)
        kw = dict(time_budget_s=4.0, mode=mode, confirm=False)
        t0 = time.monotonic()
        v = judge(g, cand, Policy(**kw))
        print(f"  [{mode}] accepted={v.accepted} stage={v.stage} {time.monotonic()-t0:.0f}s codes={v.codes}")
        for r in v.reasons:
            print("   reason", r.code, r.message[:3000])
        for r in getattr(v, "warnings", []) or []:
            print("   warn", getattr(r, "code", r), str(getattr(r, "message", ""))[:300])
    break
