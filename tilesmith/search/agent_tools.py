"""The agent's host tools (`evaluate`, `profile`) and the system context it starts each track with."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from langchain_core.tools import tool

from tilesmith.errors import TilesmithError
from tilesmith.sandbox import redact

AGENCY_RULES = {
    "low": "Agency LOW: change only launch parameters, tiling, block sizes, warps/stages, vectorization and "
           "thread counts inside the existing kernels. Keep every kernel, buffer and call as it is.",
    "medium": "Agency MEDIUM: you may also restructure buffers, fuse or split kernels, replace generated kernels "
              "with library calls or hand-written Triton/C++/CUDA, and reorder work; the algorithm stays the same.",
    "high": "Agency HIGH: you may also change the algorithm (a different but equivalent formulation, e.g. "
            "online softmax, a different reduction order) as long as results stay within the gate's tolerances.",
}


def _compact_verdict(vd: dict) -> dict:
    """The verdict without raw nanosecond samples (hundreds of numbers the agent does not need)."""
    out = json.loads(json.dumps(vd))
    for p in ("first", "confirmation"):
        t = (out.get(p) or {}).get("timing")
        if t:
            t.pop("baseline_ns", None)
            t.pop("candidate_ns", None)
    return out


def profile_table(p) -> str:
    rows = [f"wall {p.wall_ms:.4f} ms/call, kernels {p.kernel_ms:.4f} ms, launch overhead "
            f"{p.launch_overhead_ms:.4f} ms ({p.launch_overhead_share:.0%}), device {p.device}"]
    for k in p.kernels:
        extra = f", {k.flops / 1e9:.2f} GFLOP" if k.flops else ""
        rows.append(f"  {k.name:<48} {k.kind:<8} x{k.calls:<3} {k.time_ms:9.4f} ms {k.share:6.1%}"
                    f"  {k.bytes / 1e6:.2f} MB{extra}")
    return "\n".join(rows)


def make_tools(state, settings) -> list:
    """`state` (agent._TrackState) knows the graph, the current attempt and the best source so far."""

    @tool
    def evaluate() -> str:
        """Run the gate on the current attempt file: static screen, load, correctness on several input
        sets, paired timing against the best confirmed source. Returns the verdict as JSON (accepted,
        stage, reasons, timing with speedup and its lower bound). This is the same gate that will judge
        your final answer (that one also runs a confirmation pass)."""
        from tilesmith.gate import judge
        from tilesmith.gate.verdict import Policy

        pol = Policy(min_improvement=settings.min_improvement, seed=50_000 + state.evaluations, confirm=False)
        if settings.gate_time_budget_s:
            pol.time_budget_s = settings.gate_time_budget_s
        from tilesmith.search.agent_loop import guard_best

        guard_best(state.track)
        best = state.track.dir / "best.py"
        pol.timing_baseline = str(best) if best.exists() else None
        state.evaluations += 1
        try:
            v = judge(state.track.graph_dir, state.attempt, pol)
        except TilesmithError as e:
            return redact(json.dumps({"error": e.message, "hint": e.hint}))
        except Exception as e:  # never abort the agent's turn: report and let it carry on
            return redact(json.dumps({"error": f"the gate failed: {type(e).__name__}: {e}"[:2000]}))
        return redact(json.dumps(_compact_verdict(v.to_dict()), indent=1))

    @tool
    def profile() -> str:
        """Per-kernel time breakdown of the baseline (the original wrapper) and of the current attempt,
        measured on the captured inputs: name, kind, launches, ms per graph call, share, bytes, flops."""
        from tilesmith.profile import profile_graph

        try:
            base = state.track.profile or profile_graph(state.track.graph_dir)
            state.track.profile = base
            cur = profile_graph(state.track.graph_dir, Path(state.attempt).read_text())
        except TilesmithError as e:
            return redact(f"profiling failed: {e.message}")
        except Exception as e:
            return redact(f"profiling failed: {type(e).__name__}: {e}"[:2000])
        return "BASELINE (original wrapper)\n" + profile_table(base) + "\n\nCURRENT ATTEMPT\n" + profile_table(cur)

    for t in (evaluate, profile):
        t.handle_tool_error = True
    return [evaluate, profile]


WEB_SEARCH = {
    True: "Web search: AVAILABLE (the provider's web_search tool, for you and the general-purpose subagent): "
          "look up documentation, papers and known kernels when it helps; measurements here decide.",
    False: "Web search: NOT available in this session; rely on the skills, the code and your measurements.",
}

_CEILINGS: dict = {}


def device_ceilings(device: str) -> dict:
    """Measured, not looked up: copy bandwidth (GB/s) and fp32 (and bf16 on CUDA) matmul throughput
    (TFLOP/s) on this machine, once per process. Rough (a few repetitions), for the agent's
    roofline reasoning only."""
    if device in _CEILINGS:
        return _CEILINGS[device]
    import torch

    dev = torch.device(device if device.startswith("cuda") and torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def best_s(fn, reps=5):
        fn()
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    n = (256 << 20) if dev.type == "cuda" else (32 << 20)  # bytes
    src = torch.empty(n // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    out = {"device": str(dev), "copy_GBps": round(2 * n / best_s(lambda: dst.copy_(src)) / 1e9, 1)}
    m = 4096 if dev.type == "cuda" else 512
    a = torch.randn(m, m, device=dev)
    out["fp32_matmul_TFLOPs"] = round(2 * m**3 / best_s(lambda: a @ a) / 1e12, 3)
    if dev.type == "cuda":
        b = a.bfloat16()
        out["bf16_matmul_TFLOPs"] = round(2 * m**3 / best_s(lambda: b @ b) / 1e12, 1)
        props = torch.cuda.get_device_properties(dev)
        out.update(name=props.name, sms=props.multi_processor_count, memory_GB=round(props.total_memory / 1e9, 1),
                   capability=f"{props.major}.{props.minor}")
    else:
        out["threads"] = torch.get_num_threads()
        out["cpus"] = os.cpu_count()
    _CEILINGS[device] = out
    return out


def system_prompt(state, settings, skills_note: str, web_search: bool = False) -> str:
    """Who the agent is, what it may do, and the facts of this graph."""
    from tilesmith.source import split_header
    from tilesmith.workspace import load_graph_json

    meta = load_graph_json(state.track.graph_dir)
    device = str(meta.get("device") or "cpu")
    try:
        ceilings = json.dumps(device_ceilings(device))
    except Exception as e:  # the context is still useful without them
        ceilings = f"(not measured: {type(e).__name__})"
    fx, _ = split_header((state.track.graph_dir / "wrapper.py").read_text())
    base = profile_table(state.track.profile) if state.track.profile else "(not profiled yet: call `profile`)"
    return f"""You are a GPU/CPU kernel engineer optimizing one TorchInductor-generated wrapper (a Python module
defining `call(args)` plus its kernels). Make it faster while computing the same outputs.

## Workspace (your files; paths are virtual, rooted at this graph's track folder)
- /attempts/attempt_NN.py: the ring of recent sources. Each turn names ONE current attempt: edit that file
  in place (edit_file / write_file). The host judges exactly that file when you give your final answer.
- /profiles/ (read-only): baseline.json, verdict_*.json (every host verdict), turn_*.json (traces),
  original_wrapper.py (the captured original). /best.py: the best confirmed source so far, if any.
- /scratch/: your notes, microbenchmarks, experiments. The shell (`execute`) runs in the track folder
  with a minimal environment; use `python` there to run Triton, torch, profilers, microbenchmarks.
- /skills/: reference skills (read-only). Read the ones that apply before editing.

## Tools
- evaluate: runs the gate on the current attempt and returns the verdict JSON. Call it after each
  meaningful edit. profile: per-kernel times of the baseline and of the current attempt.
- write_todos to plan; task to delegate (the kernel-tuner subagent tunes one kernel's launch
  parameters and reports the best variant it measured).
- {WEB_SEARCH[web_search]}

## Contract the gate enforces (see /skills/inductor-wrapper-abi)
Keep `call(args)`, the inputs it consumes, the outputs' shapes, dtypes, strides, devices and aliasing;
no caching across calls, no reading the environment or files, no threads or processes, no patching
torch or timers. Results must match the original on fresh random inputs within the gate's tolerances.

## Rules
{AGENCY_RULES[settings.agency]}
A turn ends with your final answer (a short summary of what you changed and why). The host gate then
judges the current attempt with a confirmation pass; it must beat the best so far by at least
{settings.min_improvement:.1%} (lower confidence bound). If it rejects, you get its report and continue.

## Facts
- Graph {state.track.key[:16]} ({meta.get('kind', 'forward')}), device {device}; stack {json.dumps(meta.get('environment', {}))[:600]}
- Measured ceilings: {ceilings}
- Baseline profile:
{base}
- FX program (what the wrapper computes):
{fx.strip()[:12000]}
{skills_note}"""
