"""Model suite: real models from libraries, every torch.compile mode and tilesmith over each.

    python benchmarks/models.py run [--models moe,gpt2,resnet18,gpt2-train] [--modes ...]
                                    [--tilesmith-on default,reduce-overhead] [--max-minutes 1] [--loops 2] [--profile-calls 50]
                                    [--no-timing] [--reuse DIR[,DIR]] [--dry-run]
    python benchmarks/models.py summary RUN1/models.json RUN2/models.json [--out suite.json]

Models are built from configs, no weights downloaded (the GPU machine has no network): `moe` (the
seed's MoE, moe_benchmark.py), `gpt2` (transformers GPT2Config, 4 layers, width 512, bf16, 8x128
tokens, logits), `llama` (LlamaConfig, same size), `resnet18` (torchvision, weights=None, fp32,
channels-last, 32x3x128x128), `vit` (timm vit_tiny_patch16_224, pretrained=False, 32 images),
`gpt2-train` (the gpt2 model's training step: forward with the LM loss, backward), and `tiny` (an
MLP without libraries, for smoke runs on CPU). Loops with state updated in place (tilesmith optimizes their graphs
like the others; TILESMITH_IN_PLACE=0 would leave them to Inductor): `resnet18-sgd` (ResNet-18 in training mode, BatchNorm, batch 32,
cross-entropy, SGD with momentum, the optimizer step compiled as its own function), `gpt2-adamw` (gpt2-train with
AdamW, its step compiled), `decode` (a Llama-style decoder, 4 layers, width 512, grouped-query attention, bf16 on a
GPU, Hugging Face's StaticCache: one token per step, its position passed as a tensor; the cache is written in place).
In the graphed modes a training step calls `torch.compiler.cudagraph_mark_step_begin()` first, the edit those modes
need in a plain loop; a path that fails anyway is reported as failed and the others are timed.

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

The GPU machine's calls last 10 minutes, less than the flows and the timing of the whole suite together: one
call runs the flows (`--no-timing`, each model with its own mode and budget: `--tilesmith-on
moe:reduce-overhead,resnet18:default --max-minutes 1.5,gpt2-train:2.5`), a later one times every model and
mode in one run over those flows (`--reuse DIR[,DIR]`: those runs' --out-dirs, their models.json and homes;
a flow they lack runs here). Each reused flow says where it came from (`reused_from`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import flow  # noqa: E402
from benchmarks import models_reuse  # noqa: E402
from benchmarks.models_table import headline, profile_table, summary  # noqa: E402,F401

MODES = ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"]
MODELS = ["moe", "gpt2", "llama", "resnet18", "vit", "gpt2-train", "tiny", "resnet18-sgd", "gpt2-adamw", "decode"]
STATEFUL = ("resnet18-sgd", "gpt2-adamw", "decode")  # graphs that update their inputs in place
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
        from benchmarks import moe_model

        model, tokens = moe_model.build(device)
        return model, (tokens,), False
    if name in ("gpt2", "llama", "gpt2-train", "gpt2-adamw"):
        train = name.endswith(("-train", "-adamw"))
        model, inputs = _lm(name.split("-")[0], device, train)
        return model, inputs, train
    if name == "resnet18-sgd":
        import torchvision

        net = torchvision.models.resnet18(weights=None).to(device).train().to(memory_format=torch.channels_last)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 3, 128, 128, generator=g).to(device).to(memory_format=torch.channels_last)
        labels = torch.randint(0, 1000, (32,), generator=g).to(device)

        class Loss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return torch.nn.functional.cross_entropy(self.net(x), labels)

        return Loss(), (x,), True
    if name == "decode":
        return _decoder(device), (), False
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
    compile_ = (lambda f: f) if mode is None else (lambda f: torch.compile(f, mode=None if mode == "default" else mode))
    if name == "decode":
        return _decode_step(model, compile_, device, mode in GRAPHED_MODES), (), False
    fn = compile_(model)
    if not train:
        return fn, inputs, False
    params = [p for p in model.parameters() if p.requires_grad]
    mark = mode in GRAPHED_MODES  # what a user of these modes adds to a training loop, or it fails
    opt_step = None
    if name in ("resnet18-sgd", "gpt2-adamw"):  # the optimizer's step compiled as its own function, as PyTorch's recipe
        opt = (torch.optim.SGD(params, lr=0.01, momentum=0.9) if name == "resnet18-sgd"
               else torch.optim.AdamW(params, lr=1e-4))
        opt_step = compile_(opt.step)

    def step(*xs):
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        for p in params:
            p.grad = None
        loss = fn(*xs)
        loss.backward()
        if opt_step is not None:
            opt_step()
        return loss

    return step, inputs, True


def _decoder(device: str):
    """A Llama-style decoder with a StaticCache already holding a 4-token prompt: (model, cache, first token)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=8192, max_position_embeddings=512)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    cache = transformers.StaticCache(config=cfg, max_cache_len=256)
    prompt = torch.randint(0, 8192, (1, 4), generator=torch.Generator().manual_seed(1)).to(device)
    pos = torch.arange(4, device=device)
    with torch.no_grad():
        out = model(input_ids=prompt, position_ids=pos.unsqueeze(0), cache_position=pos, past_key_values=cache,
                    use_cache=True)
    return model, cache, out.logits[:, -1].argmax(-1, keepdim=True)


def _decode_step(built, compile_, device: str, mark: bool = False):
    """Greedy decoding, one token per call: the token it makes is the next call's input; the position moves on by one
    each call (a tensor made once per position) and wraps before the cache's end, so any number of steps can be timed.
    At the wrap the cache's own write position goes back to the prompt's end too: transformers' StaticCache layers
    count the tokens written in a tensor of their own (`cumulative_length`, updated in place) and write there, not at
    `cache_position` (on the H100 and here, step 253 indexed the cache out of bounds). `mark`: a graphed mode's loop
    marks each step's start and keeps the token as its own tensor, as a user of those modes writes it (torch
    otherwise finds the token, an output of the CUDA graph, overwritten by the next replay)."""
    import torch

    model, cache, first = built

    def one(token, position):
        out = model(input_ids=token, position_ids=position.unsqueeze(0), cache_position=position,
                    past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    fn = compile_(one)
    positions = [torch.tensor([p], device=device) for p in range(4, 256)]
    counters = [c for c in (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", ()))
                if isinstance(c, torch.Tensor)]
    state = {"token": first, "i": 0}

    def step():
        i = state["i"] % len(positions)
        if i == 0 and state["i"]:
            for c in counters:
                c.fill_(4)
        state["i"] += 1
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        token = fn(state["token"], positions[i])
        state["token"] = token.clone() if mark else token
        return state["token"]

    return step


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


def per_model(spec: str, models: list[str], what: str) -> dict[str, str]:
    """A per-model option: comma-separated items, `VALUE` for every model or `MODEL:VALUE` for one (the
    model's own items replace the common ones for it; several of either kind make a list). Returns model ->
    the comma-joined values ("" when none)."""
    common, own = [], {}
    for item in [x.strip() for x in spec.split(",") if x.strip()]:
        name, sep, value = item.rpartition(":")
        if not sep:
            common.append(item)
        elif name not in MODELS:
            raise SystemExit(f"{what}: '{item}' names no model (of: {', '.join(MODELS)}); write VALUE or MODEL:VALUE")
        else:
            own.setdefault(name, []).append(value)
    return {m: ",".join(own.get(m, common)) for m in models}


def plan(a, device: str) -> dict:
    models = [m for m in a.models.split(",") if m]
    modes = [m for m in (a.modes or ",".join(MODES if device.startswith("cuda") else MODES[::2])).split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise SystemExit(f"unknown model or mode: {', '.join(bad)}")
    ts_by = {m: [x for x in v.split(",") if x and x != "none"] for m, v in per_model(a.tilesmith_on, models,
                                                                                       "--tilesmith-on").items()}
    ts = list(dict.fromkeys(x for v in ts_by.values() for x in v))
    bad = [x for x in modes + ts if x not in MODES]
    if bad:
        raise SystemExit(f"unknown model or mode: {', '.join(bad)}")
    minutes_by = {}
    for m, v in per_model(str(a.max_minutes), models, "--max-minutes").items():
        try:
            minutes_by[m] = float(v) if v else None
        except ValueError:
            raise SystemExit(f"--max-minutes: '{v}' for {m} is not a number of minutes") from None
    jobs_by = {}
    for m, v in per_model(str(a.jobs), models, "--jobs").items():
        if not v.isdigit() or int(v) < 1:
            raise SystemExit(f"--jobs: '{v}' for {m} is not a whole number of graphs (1 or more)")
        jobs_by[m] = int(v)
    one = set(minutes_by.values())
    paths = ["eager"] + [f"compile {m}" for m in modes] + [f"tilesmith on {m}" for m in ts]
    profile_calls = a.profile_calls if a.profile_calls is not None else 50 if device.startswith("cuda") else 0
    return {"models": models, "modes": modes, "tilesmith_on": ts, "tilesmith_on_by_model": ts_by, "paths": paths,
            "device": device, "max_minutes": one.pop() if len(one) == 1 else minutes_by, "max_minutes_by_model": minutes_by,
            "jobs_by_model": jobs_by,
            "loops": a.loops, "seconds": a.seconds, "calls": a.calls, "optimizer": a.optimizer,
            "profile_calls": profile_calls, "timing": not a.no_timing, "reuse": a.reuse}


def run_model(name: str, p: dict, out: Path, a, reuse: list, code: str) -> dict:
    """The flow for each tilesmith mode, then every path interleaved; one model's results."""
    res: dict = {"model": name, "tilesmith": {}, "errors": []}
    homes = {}
    # On a GPU, enough steps for capture to measure the program's host time between a graph's calls (the gate
    # spends it: tilesmith/capture/gaps.py); on the CPU it is not used.
    capture_steps = "30" if p["device"].startswith("cuda") else "3"
    minutes = p["max_minutes_by_model"][name]
    for m in p["tilesmith_on_by_model"][name]:
        earlier = models_reuse.reused(name, m, reuse, code)
        if earlier is not None:  # this code's flow, run by an earlier call (the device's 10-minute calls)
            homes[m] = earlier.pop("home")
            res["tilesmith"][m] = earlier
            print(f"{name}: tilesmith on {m}: the flow of {earlier['reused_from']}, run {earlier['run_id']}", flush=True)
            continue
        home = out / name / m / "home"
        shutil.rmtree(home, ignore_errors=True)  # a fresh store: the whole flow runs, no exact hit
        os.environ["TILESMITH_HOME"] = homes[m] = str(home)
        extra = (["--max-minutes", str(minutes)] if minutes else []) + ["--loops", str(a.loops),
                                                                        "--jobs", str(p["jobs_by_model"][name])]
        try:
            run, secs = flow.capture_optimize_install(
                __file__, ["model", "--name", name, "--mode", m, "--device", p["device"], "--steps", capture_steps],
                str(out / name / m / "workspace"), a.optimizer, extra)
        except SystemExit as e:  # one model's failure is a row, not the end of the suite
            res["errors"].append(f"tilesmith on {m}: {str(e)[-1500:]}")
            continue
        res["tilesmith"][m] = {"run_id": run["run_id"], "pipeline_s": round(secs, 1), "phases_s": run.get("phases_s"),
                               "tracks": [{k: t.get(k) for k in ("key", "kind", "status", "reason", "speedup",
                                                                  "speedup_low", "baseline_ms", "best_ms")}
                                          for t in run.get("tracks", [])]}
    if not p["timing"]:
        return res
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
    print(f"{name}: ready (compiled, first output) after, s, at most: " + ", ".join(
        f"{n} {(res['sampling'][n] or {}).get('ready_after_s')}" for n in names), flush=True)
    res["runtime"] = {n: extras[n] for n in names if n.startswith("tilesmith on ")}
    res.update(headline(res))
    return res


def cmd_run(a) -> int:
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    p = plan(a, device)
    if a.dry_run:
        print(json.dumps(p, indent=2))
        return 0
    reuse, code = models_reuse.load(p["reuse"]), models_reuse.code_digest()  # before any flow or timing
    if device.startswith("cuda") and p["timing"]:
        from tilesmith.replay import native

        # The replay's address check in C, as `tilesmith install` on this machine builds it (a reused flow's
        # install ran on another machine): every tilesmith path's worker loads it.
        print(f"the CUDA-graph replay's address check in C: {native.build()[1]}", flush=True)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"plan": p, "torch": torch.__version__, "results": [], "date": time.strftime("%Y-%m-%d"),
           "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", "code": code}
    t0 = time.monotonic()
    for name in p["models"]:
        if a.deadline_minutes and time.monotonic() - t0 > a.deadline_minutes * 60:
            doc["results"].append({"model": name, "errors": ["skipped: --deadline-minutes reached"], "tilesmith": {}})
            continue
        doc["results"].append(run_model(name, p, out, a, reuse, code))
        if p["timing"]:
            doc["summary"] = summary(doc["results"])
        else:
            models_reuse.flows_table(doc["results"][-1])
        (out / "models.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {out / 'models.json'}")
    return 0


def cmd_summary(a) -> int:
    """The tables of several runs' models.json together: each model's latest result (the files in the order
    given, later ones win), the geometric mean over all of them; --out writes that as JSON."""
    latest: dict = {}
    for f in a.files:
        try:
            doc = json.loads(Path(f).read_text())
            results = doc["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{f}: not a models.json from `models.py run` ({e}); pass the files `run` wrote") from None
        for r in results:
            if r.get("rows"):  # the ratios again by this code's rules (a file from older code had others)
                r.update(headline(r))
            if "best_mode" in r or r.get("model") not in latest:  # a failed model never hides a measured one
                latest[r["model"]] = {**r, "from": f"{f} ({doc.get('date', '?')}, torch {doc.get('torch', '?')})"}
    for r in latest.values():
        print(f"{r['model']}: {r['from']}")
    doc = {"results": list(latest.values()), "summary": summary(list(latest.values()))}
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2))
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
    sm = sub.add_parser("summary", help="the tables and geometric mean of several runs' models.json together")
    sm.add_argument("files", nargs="+", help="models.json files that `run` wrote, oldest first")
    sm.add_argument("--out", default=None, help="write the combined results and summary as JSON")
    r = sub.add_parser("run", help="the flow per model and mode, then every path interleaved; tables and JSON")
    r.add_argument("--models", default=SUITE, help=f"comma-separated, of: {', '.join(MODELS)} (default {SUITE})")
    r.add_argument("--modes", default=None, help="compile modes timed (default: all four on CUDA)")
    r.add_argument("--tilesmith-on", default="default,reduce-overhead",
                   help="the user's modes tilesmith starts from ('none': no tilesmith path); MODEL:MODE items "
                        "for one model, e.g. moe:reduce-overhead,resnet18:default")
    r.add_argument("--max-minutes", default="1.0",
                   help="optimize budget per model and mode; MODEL:MINUTES items for one model, e.g. 1.5,gpt2-train:3")
    r.add_argument("--jobs", default="1",
                   help="graphs optimize works on at once (its --jobs: their measurements never overlap); MODEL:N "
                        "items for one model, e.g. 1,gpt2-train:2")
    r.add_argument("--no-timing", action="store_true",
                   help="run the flows only (capture, optimize, install); a later run times them with --reuse")
    r.add_argument("--reuse", default=None, metavar="DIR[,DIR]",
                   help="take each model's flow from DIR (an earlier run's --out-dir: its models.json and homes; "
                        "several, comma-separated) where it has one, and run the others; every path is then timed "
                        "in this run")
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
    if a.cmd == "summary":
        return cmd_summary(a)
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
