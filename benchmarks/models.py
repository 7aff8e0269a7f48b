"""Model suite: real models from libraries, every torch.compile mode and tilesmith over each.

    python benchmarks/models.py run [--models moe,gpt2,resnet18,gpt2-train] [--modes ...]
                                    [--tilesmith-on default,reduce-overhead] [--max-minutes 1] [--loops 2] [--profile-calls 50]
                                    [--dry-run]

Models are built from configs, no weights downloaded (the GPU machine has no network): `moe` (the
seed's MoE, moe_benchmark.py), `gpt2` (transformers GPT2Config, 4 layers, width 512, bf16, 8x128
tokens, logits), `llama` (LlamaConfig, same size), `resnet18` (torchvision, weights=None, fp32,
channels-last, 32x3x128x128), `vit` (timm vit_tiny_patch16_224, pretrained=False, 32 images),
`gpt2-train` (the gpt2 model's training step: forward with the LM loss, backward), and `tiny` (an
MLP without libraries, for smoke runs on CPU).

Per model: for each mode in --tilesmith-on, the public flow (capture the `model` subcommand, optimize
with --max-minutes, install) into its own TILESMITH_HOME; then every path in its own process, timed in
interleaved rounds (benchmarks/flow.py; each sample at least --min-sample-ms of back-to-back steps
after a quarter as many untimed ones): eager, `compile <mode>` for each of --modes, `tilesmith on
<mode>` (the same compile with `import tilesmith.runtime`); then each path profiled over
--profile-calls steps (default 50 on CUDA, none on CPU): the time to issue a step, the GPU's busy time
per step (the union of its kernels' intervals), kernels per step, and whether the step is GPU-bound or
waits on the host and on gaps between kernels (what a ratio to a compile mode alone does not say). A
path's sample is the program's own time per step (a training step includes backward). Reported per
model: the best compile mode, each tilesmith path's ratio to it (> 1: tilesmith faster) and to its own
mode, the runtime's statistics (graphs substituted, CUDA-graph replays, plain calls and why), and the
gate's estimate of the step (own mode's measured step minus the accepted graphs' savings, in
proportion) beside the measured one (a measured step much slower than the estimate means the gate
timed something the program does not run). Then the geometric mean over models. Writes models.json
after every model (a run cut off keeps what it measured) and prints tables; never passes or fails on
time.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import flow  # noqa: E402

MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
MODELS = ["moe", "gpt2", "llama", "resnet18", "vit", "gpt2-train", "tiny"]
SUITE = "moe,gpt2,resnet18,gpt2-train"
GRAPHED_MODES = ("reduce-overhead", "max-autotune")  # Inductor replays CUDA graphs in these


def _lm(kind: str, device: str, train: bool):
    import torch

    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=256, vocab_size=8192)
        m = GPT2LMHeadModel(cfg)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=8, vocab_size=8192, max_position_embeddings=256)
        m = LlamaForCausalLM(cfg)
    m = m.to(device=device, dtype=torch.bfloat16).train(train)
    if hasattr(m.config, "use_cache"):
        m.config.use_cache = False

    class Logits(torch.nn.Module):  # a plain tensor out: logits, or the LM loss for training
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, tokens):  # tokens: [batch, seq] int64
            if train:
                return self.m(input_ids=tokens, labels=tokens).loss
            return self.m(input_ids=tokens).logits

    tokens = torch.randint(0, 8192, (8, 128), generator=torch.Generator().manual_seed(1)).to(device)
    return Logits(), (tokens,)


def build(name: str, device: str):
    """(module, inputs, is a training step) for one suite model, seeded."""
    import torch

    torch.manual_seed(0)
    if name == "moe":
        import moe_benchmark

        model, tokens = moe_benchmark.build(device)
        return model, (tokens,), False
    if name in ("gpt2", "llama", "gpt2-train"):
        train = name.endswith("-train")
        model, inputs = _lm(name.removesuffix("-train"), device, train)
        return model, inputs, train
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(weights=None).to(device).eval().to(memory_format=torch.channels_last)
        x = torch.randn(32, 3, 128, 128, generator=torch.Generator().manual_seed(1)).to(device)
        return model, (x.to(memory_format=torch.channels_last),), False
    if name == "vit":
        import timm

        model = timm.create_model("vit_tiny_patch16_224", pretrained=False).to(device).eval()
        return model, (torch.randn(32, 3, 224, 224, generator=torch.Generator().manual_seed(1)).to(device),), False
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to(device)
        return model.eval(), (torch.randn(16, 32, device=device),), False
    raise SystemExit(f"unknown model {name!r} (one of {', '.join(MODELS)})")


def step_fn(name: str, device: str, mode: str | None):
    """The program's step for `mode` (None: eager): (step(*inputs), inputs, training)."""
    import torch

    model, inputs, train = build(name, device)
    fn = model if mode is None else torch.compile(model, mode=None if mode == "default" else mode)
    if not train:
        return fn, inputs, False
    params = [p for p in model.parameters() if p.requires_grad]
    mark = mode in GRAPHED_MODES  # what a user of these modes adds to a training loop, or it fails

    def step(*xs):
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        loss = fn(*xs)
        loss.backward()
        return loss

    return step, inputs, True


def cmd_model(a) -> None:
    """The user's program (what tilesmith captures): a few steps of one model in one mode."""
    import torch

    step, inputs, train = step_fn(a.name, a.device, None if a.mode == "eager" else a.mode)
    with torch.enable_grad() if train else torch.no_grad():
        for _ in range(a.steps):
            out = step(*inputs)
    print(f"{a.name} ({a.mode}): output {tuple(out.shape)}, checksum {float(out.float().sum()):.4f}")


def cmd_worker(a) -> None:
    """One measured path in its own process."""
    import torch

    extra = None
    if a.path.startswith("tilesmith on "):
        import tilesmith.runtime as rt  # before compiling: Inductor's graphs get the installed artifacts

        extra = lambda: rt.stats().to_dict()  # noqa: E731
    mode = None if a.path == "eager" else a.path.split(" ")[-1]
    step, inputs, train = step_fn(a.name, a.device, mode)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    flow.serve(step, inputs, sync, a.out, extra, grad=train)


def plan(a, device: str) -> dict:
    models = [m for m in a.models.split(",") if m]
    modes = [m for m in (a.modes or ",".join(MODES if device.startswith("cuda") else MODES[::2])).split(",") if m]
    ts = [m for m in a.tilesmith_on.split(",") if m and m != "none"]
    bad = [m for m in models if m not in MODELS] + [m for m in modes + ts if m not in MODES]
    if bad:
        raise SystemExit(f"unknown model or mode: {', '.join(bad)}")
    paths = ["eager"] + [f"compile {m}" for m in modes] + [f"tilesmith on {m}" for m in ts]
    profile_calls = a.profile_calls if a.profile_calls is not None else 50 if device.startswith("cuda") else 0
    return {"models": models, "modes": modes, "tilesmith_on": ts, "paths": paths, "device": device,
            "max_minutes": a.max_minutes, "loops": a.loops, "seconds": a.seconds, "calls": a.calls, "optimizer": a.optimizer,
            "profile_calls": profile_calls}


def run_model(name: str, p: dict, out: Path, a) -> dict:
    """The flow for each tilesmith mode, then every path interleaved; one model's results."""
    res: dict = {"model": name, "tilesmith": {}, "errors": []}
    homes = {}
    for m in p["tilesmith_on"]:
        home = out / name / m / "home"
        shutil.rmtree(home, ignore_errors=True)  # a fresh store: the whole flow runs, no exact hit
        os.environ["TILESMITH_HOME"] = homes[m] = str(home)
        extra = (["--max-minutes", str(a.max_minutes)] if a.max_minutes else []) + ["--loops", str(a.loops)]
        try:
            run, secs = flow.capture_optimize_install(
                __file__, ["model", "--name", name, "--mode", m, "--device", p["device"], "--steps", "3"],
                str(out / name / m / "workspace"), a.optimizer, extra)
        except SystemExit as e:  # one model's failure is a row, not the end of the suite
            res["errors"].append(f"tilesmith on {m}: {str(e)[-1500:]}")
            continue
        res["tilesmith"][m] = {"run_id": run["run_id"], "pipeline_s": round(secs, 1), "phases_s": run.get("phases_s"),
                               "tracks": [{k: t.get(k) for k in ("key", "kind", "status", "reason", "speedup",
                                                                  "speedup_low", "baseline_ms", "best_ms")}
                                          for t in run.get("tracks", [])]}
    names = [n for n in p["paths"] if not n.startswith("tilesmith on ") or n.split(" ")[-1] in res["tilesmith"]]

    def cmd(n: str, f: str) -> list[str]:
        env = ["env", f"TILESMITH_HOME={homes[n.split(' ')[-1]]}"] if n.startswith("tilesmith on ") else []
        return env + [sys.executable, __file__, "worker", "--name", name, "--path", n, "--device", p["device"], "--out", f]

    (out / name).mkdir(parents=True, exist_ok=True)
    try:
        samples, errors, extras = flow.measure_in_processes(cmd, names, str(out / name), a.seconds, a.calls,
                                                            min_rounds=a.min_rounds, profile_calls=p["profile_calls"],
                                                            min_sample_ms=a.min_sample_ms,
                                                            ready_s=a.ready_minutes * 60 if a.ready_minutes else None)
    except SystemExit as e:
        res["errors"].append(f"timing: {e}")
        return res
    for n in [n for n in names if n not in samples]:  # left out: not compiled within --ready-minutes
        res["errors"].append(f"{n}: {extras.pop(n)['error']}")
        print(f"{name}: {res['errors'][-1]}", flush=True)
    names = [n for n in names if n in samples]
    print(f"\n{name}: per step, interleaved rounds")
    res["rows"] = flow.table(samples, errors, "eager", "compile default" if "compile default" in samples else None)
    if p["profile_calls"]:
        print(f"\n{name}: where a step goes, {p['profile_calls']} steps profiled per path")
        res["profile"] = profile_table({n: extras[n].pop("profile") for n in names})
    res["sampling"] = {n: extras[n].pop("sampling", None) for n in names}
    res["runtime"] = {n: extras[n] for n in names if n.startswith("tilesmith on ")}
    res.update(headline(res))
    return res


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


def cmd_run(a) -> int:
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    p = plan(a, device)
    if a.dry_run:
        print(json.dumps(p, indent=2))
        return 0
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"plan": p, "torch": torch.__version__, "results": [], "date": time.strftime("%Y-%m-%d"),
           "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"}
    t0 = time.monotonic()
    for name in p["models"]:
        if a.deadline_minutes and time.monotonic() - t0 > a.deadline_minutes * 60:
            doc["results"].append({"model": name, "errors": ["skipped: --deadline-minutes reached"], "tilesmith": {}})
            continue
        doc["results"].append(run_model(name, p, out, a))
        doc["summary"] = summary(doc["results"])
        (out / "models.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {out / 'models.json'}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="the user's program (what tilesmith captures)")
    m.add_argument("--name", required=True, choices=MODELS)
    m.add_argument("--mode", default="default", choices=MODES + ["eager"])
    m.add_argument("--steps", type=int, default=3)
    m.add_argument("--device", default=None)
    w = sub.add_parser("worker", help="one measured path (run starts these)")
    w.add_argument("--name", required=True, choices=MODELS)
    w.add_argument("--path", required=True)
    w.add_argument("--device", default=None)
    w.add_argument("--out", required=True)
    r = sub.add_parser("run", help="the flow per model and mode, then every path interleaved; tables and JSON")
    r.add_argument("--models", default=SUITE, help=f"comma-separated, of: {', '.join(MODELS)} (default {SUITE})")
    r.add_argument("--modes", default=None, help="compile modes timed (default: all four on CUDA)")
    r.add_argument("--tilesmith-on", default="default,reduce-overhead",
                   help="the user's modes tilesmith starts from ('none': no tilesmith path)")
    r.add_argument("--max-minutes", type=float, default=1.0, help="optimize budget per model and mode")
    r.add_argument("--loops", type=int, default=2,
                   help="accepted candidates per graph before its track ends (the README's flow: 2; the tuner's "
                        "second loop is where re-lowering and kernel settings go on top of a replay)")
    r.add_argument("--seconds", type=float, default=8.0, help="timing budget per model, interleaved rounds")
    r.add_argument("--calls", type=int, default=10, help="steps per timed sample")
    r.add_argument("--ready-minutes", type=float, default=None,
                   help="a path not compiled and ready this long after its model's workers start is left out "
                        "and the others are timed (default: wait for every path)")
    r.add_argument("--min-rounds", type=int, default=10)
    r.add_argument("--min-sample-ms", type=float, default=25.0,
                   help="each timed sample is as many steps (at least --calls) as last this long, after a quarter "
                        "as many untimed ones (0: --calls steps, no warm-up)")
    r.add_argument("--profile-calls", type=int, default=None,
                   help="steps profiled per path after the timing, host- or GPU-bound (default: 50 on CUDA, 0 on CPU)")
    r.add_argument("--optimizer", default="tuner", choices=["tuner", "agent"])
    r.add_argument("--device", default=None)
    r.add_argument("--deadline-minutes", type=float, default=None, help="start no new model after this")
    r.add_argument("--out-dir", default="models-bench-out")
    r.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
    a = ap.parse_args()
    if a.cmd != "run" and a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.cmd == "model":
        cmd_model(a)
        return 0
    if a.cmd == "worker":
        cmd_worker(a)
        return 0
    return cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
