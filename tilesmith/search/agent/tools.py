"""The agent's host tools (`evaluate`, `profile`) and the system context it starts each track with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from langchain_core.tools import tool

from tilesmith.errors import TilesmithError

AGENCY_RULES = {
    "low": "Agency LOW: change only launch parameters, tiling, block sizes, warps/stages, vectorization and "
           "thread counts inside the existing kernels. Keep every kernel, buffer and call as it is.",
    "medium": "Agency MEDIUM: you may also restructure buffers, fuse or split kernels, replace generated kernels "
              "with library calls or hand-written Triton (C++ through async_compile.cpp_pybinding on CPU; no "
              "CUDA C++ extensions: see /skills/cuda-extensions), and reorder work; the algorithm stays the same.",
    "high": "Agency HIGH: you may also change the algorithm (a different but equivalent formulation, e.g. "
            "online softmax, a different reduction order) in the original's precision (see the tolerances below).",
}


def profile_table(p) -> str:
    rows = [f"wall {p.wall_ms:.4f} ms/call, kernels {p.kernel_ms:.4f} ms, launch overhead "
            f"{p.launch_overhead_ms:.4f} ms ({p.launch_overhead_share:.0%}), device {p.device}"]
    if getattr(p, "klass", ""):
        gap = f", device idle between kernels {p.gap_ms:.4f} ms" if p.gap_ms is not None else ""
        c = p.ceilings or {}
        rows.append(f"graph class {p.klass}{gap}; roofline headroom {p.headroom_ms:.4f} ms; ceilings "
                    f"{c.get('bandwidth_gbps') or 0:.0f} GB/s, {c.get('tflops') or {}} TFLOP/s ({c.get('source', '?')})")
        rows.append(f"counters: {p.counters}")
    for k in p.kernels:
        # A zero is "not measured" (the profile could not attribute bytes to this kernel), never 0 bytes.
        moved = f"  {k.bytes / 1e6:.2f} MB" if k.bytes else "  bytes n/a"
        extra = f", {k.flops / 1e9:.2f} GFLOP" if k.flops else ""
        rate = f", {k.gbps:.1f} GB/s" + (f" ({k.bw_frac:.0%} of peak)" if k.bw_frac is not None else "") if k.gbps else ""
        rate += f", {k.tflops:.2f} TFLOP/s" + (f" ({k.flop_frac:.0%})" if k.flop_frac is not None else "") if k.tflops else ""
        head = f", headroom {k.headroom_ms:.4f} ms" if k.headroom_ms is not None else ""
        rows.append(f"  {k.name:<48} {k.kind:<8} x{k.calls:<3} {k.time_ms:9.4f} ms {k.share:6.1%}"
                    f"{moved}{extra}{rate}  [{k.klass}{head}]")
        for line, code in list(k.sites.items())[:2]:
            rows.append(f"      wrapper line {line}: {code}")
    return "\n".join(rows)


def make_tools(state, settings) -> list:
    """`state` (agent._TrackState) knows the graph, this turn's attempt files, the best source so far,
    the ledger and the timing lock. The fast inner loop (check, screen) and the exploration tools
    (ideas, finish) are in agent_inner.py."""
    from tilesmith.search.agent.inner import _judge, _path, make_inner_tools
    from tilesmith.search.agent.ledger import sha, virtual

    @tool
    def evaluate(path: str = "") -> str:
        """Run the gate on one attempt file (default: your current attempt): static screen, load,
        correctness on several input sets, paired timing against the best confirmed source. Returns
        the verdict as JSON (accepted, stage, reasons, timing with speedup and its lower bound). The
        same gate judges the turn's chosen attempt (that one also runs a confirmation pass). Slower
        than check and screen: use it on an attempt that already passed both."""
        try:
            p = _path(state, path)
            judged_sha = sha(p.read_text())
            v = _judge(state, p, settings)
        except ValueError as e:
            return f"evaluate: {e}"
        except TilesmithError as e:
            return json.dumps({"error": e.message, "hint": e.hint})
        except Exception as e:  # never abort the agent's turn: report and let it carry on
            return json.dumps({"error": f"the gate failed: {type(e).__name__}: {e}"[:2000]})
        vd = v.to_dict()
        if v.stage in ("static", "load", "correctness", "timing"):  # how far it got is a check result too
            state.ledger.update(virtual(state.track.dir, p), check_sha=judged_sha,
                                check="ok" if v.stage == "timing" else f"failed: {', '.join(dict.fromkeys(v.codes))}")
        from tilesmith.gate.verdict import compact_verdict

        return json.dumps(compact_verdict(vd), indent=1)

    @tool
    def profile(path: str = "") -> str:
        """Per-kernel time breakdown of the baseline (the original wrapper) and of one attempt file
        (default: your current attempt), measured on the captured inputs: name, kind, launches, ms per
        graph call, share, and the bytes and FLOPs the profile measured for each kernel."""
        from tilesmith.profile.baseline import profile_graph

        try:
            text = Path(_path(state, path)).read_text()
            with state.timing_lock:
                base = state.track.profile or profile_graph(state.track.graph_dir)
                state.track.profile = base
                cur = profile_graph(state.track.graph_dir, text)
        except ValueError as e:
            return f"profile: {e}"
        except TilesmithError as e:
            return f"profiling failed: {e.message}"
        except Exception as e:
            return f"profiling failed: {type(e).__name__}: {e}"[:2000]
        return "BASELINE (original wrapper)\n" + profile_table(base) + "\n\nATTEMPT\n" + profile_table(cur)

    for t in (evaluate, profile):
        t.handle_tool_error = True
    tools = [evaluate, profile] + make_inner_tools(state, settings)
    for t in tools:  # every tool result goes to the model: known secret values never do
        t.func = _redacting(t.func)
    return tools


def _redacting(fn):
    import functools

    from tilesmith.launch.secrets import redact

    @functools.wraps(fn)
    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        return redact(out) if isinstance(out, str) else out

    return run


WEB_SEARCH = {
    True: "Web search: AVAILABLE (the provider's web_search tool, for you and the general-purpose subagent): "
          "look up documentation, papers and known kernels when it helps; measurements here decide.",
    False: "Web search: NOT available in this run; rely on the skills, the code and your measurements.",
}

_CEILINGS: dict = {}


def device_ceilings(device: str) -> dict:
    """Measured, not looked up (tilesmith.profile.roofline.measure, the profile's ceilings): copy bandwidth (GB/s)
    and matmul throughput per dtype (TFLOP/s) on this machine, once per process, for the agent's
    roofline reasoning."""
    if device in _CEILINGS:
        return _CEILINGS[device]
    import torch

    from tilesmith.profile import roofline

    dev = device if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    c = roofline.measure(dev)
    out = {"device": dev, "name": c.name, "copy_GBps": round(c.bandwidth_gbps, 1) if c.bandwidth_gbps else None,
           **{f"{k}_matmul_TFLOPs": round(v, 3) for k, v in c.tflops.items()}, "source": c.source}
    if dev.startswith("cuda"):
        props = torch.cuda.get_device_properties(dev)
        out.update(sms=props.multi_processor_count, memory_GB=round(props.total_memory / 1e9, 1),
                   capability=f"{props.major}.{props.minor}")
    else:
        out.update(threads=torch.get_num_threads(), cpus=os.cpu_count())
    _CEILINGS[device] = out
    return out


FX_CHARS = 12_000  # the FX program's share of the system prompt, for models with large windows


def gate_facts(meta: dict, settings) -> str:
    """The gate's numbers for this graph, read from the gate itself: threshold, timing mode, tolerances."""
    import torch

    from tilesmith.gate import correctness as C
    from tilesmith.gate import resolve_mode

    mode = resolve_mode("auto", meta)
    timing = ("CUDA-graph replay (this graph was compiled with CUDA graphs): launch overhead is NOT timed, so "
              "`graphed`, fewer launches for their own sake and other launch-overhead fixes gain nothing here; "
              "only kernel time and bytes moved count" if mode == "graph" else
              "plain launches, each call timed as the user runs it: launch overhead and Python between launches "
              "count (on CUDA, `graphed` and fewer, bigger kernels can win when the profile is launch-bound)")
    tol = ", ".join(f"{str(dt).removeprefix('torch.')} (rtol {r:g}, atol {a:g} x max|output|)"
                    for dt, (r, a) in C._TOL.items() if dt in (torch.float32, torch.float16, torch.bfloat16))
    return f"""- Threshold: the fastest screened attempt must beat the best source so far by at least
  {settings.min_improvement:.1%} at the lower confidence bound of paired, interleaved timing, and again in a
  confirmation pass with new seeds in a fresh worker.
- Timing mode for this graph: {timing}.
- Correctness: every output (and every input the original mutates) on the captured inputs and 4 random
  input sets. Without a float64 run of the FX program: |candidate - original| <= rtol*|original| +
  atol*max|original| per dtype: {tol}. With one (the usual case): the candidate's max error against float64
  may be at most {C.REF64_FACTOR:g}x the original's plus one epsilon of the output dtype times its magnitude (fp16/bf16
  outputs: also RMS error at most {C.REF64_RMS_FACTOR:g}x). Reordered sums pass; computing in lower precision does not:
  fp32 matmuls stay fp32 (no TF32, no bf16/fp16, no --use_fast_math), bf16 stays bf16 with fp32 accumulation."""


def fx_excerpt(fx: str, limit: int) -> str:
    """The FX program, cut at `limit` characters with a marker saying so and where the rest is."""
    fx = fx.strip()
    if len(fx) <= limit:
        return fx
    return (fx[:limit] + f"\n... [FX program cut here: {limit:,} of {len(fx):,} characters shown; the whole "
            "program is the header of /profiles/original_wrapper.py]")


def system_prompt(state, settings, skills_note: str, web_search: bool = False, fx_chars: int = FX_CHARS) -> str:
    """Who the agent is, how a turn works, what the gate demands, and the facts of this graph."""
    meta = state.track.graph.meta
    width = len(state.attempts) or 3
    return f"""You are a GPU/CPU kernel engineer optimizing one TorchInductor-generated wrapper (a Python module
defining `call(args)` plus its kernels). Make it faster while computing the same outputs.

## Workspace (your files; paths are virtual, rooted at this graph's track folder)
- /attempts/turn_NNN_a.py, _b.py, ...: each turn gets {width} attempt files, all copies of the best accepted
  source (/best.py once one is accepted, else the original). Files are never renamed or deleted: notes
  may name them. Edit only this turn's files (edit_file / write_file).
- /profiles/ (read-only): ledger.json (every attempt: idea, check, screened ms, verdict), verdict_*.json,
  turn_*.json (traces), original_wrapper.py (the captured original, FX program in its header),
  tuner_variants.jsonl (every launch-parameter variant the built-in tuner screened, if it ran).
- /scratch/: your notes, microbenchmarks, experiments. The shell (`execute`) runs in the track folder
  with a minimal environment; `python` there runs Triton, torch, profilers, microbenchmarks.
  `python -m tilesmith.search.kernel_bench attempts/turn_NNN_a.py` times each kernel of a file on the
  real arguments the wrapper passes it (the graph's folder is preset).
- /skills/: reference skills (read-only), with worked before/after rewrites. Read the ones that apply.

## A turn
1. Call `ideas` with 3-5 ideas, each with the speedup of the whole call its roofline allows (bytes or
   FLOPs at the measured ceilings against the time the profile shows) and why. It assigns the best
   ones this turn's attempt files, one file per idea.
2. Give each assigned file to its own subagent (`task`, subagent_type "implementer", naming the idea
   and the file), or work on one yourself. One file, one idea, one worker: never two on a file.
3. `check` each edited file (load + correctness, seconds), `screen` them against the best (timing,
   seconds); `evaluate` runs the full gate on one file when you want its verdict before the turn ends.
4. End the turn with a short final answer. The host screens this turn's changed files that passed
   their last check and the gate judges the fastest (with a confirmation pass). The ledger and the
   verdict come back in your next message; the next turn starts again from the best accepted source.
When nothing more is worth trying (every kernel near its roofline, what is left is overhead the timing
mode does not count), call `finish` with the reason: the track then ends. Ending a turn with no
changed file is fine too: nothing is judged.

## Tools
check, screen, evaluate, profile (per-kernel time, bytes, FLOPs of the baseline and one file), ideas,
finish; write_todos to plan; task to delegate (implementer: one idea on one file; kernel-tuner: one
kernel's launch parameters on one file). GPU measurements of every tool (and of shell commands that run
Python) take turns with each other and with the host's gate: they never overlap.
- {WEB_SEARCH[web_search]}

## Contract the gate enforces (see /skills/inductor-wrapper-abi)
Keep `call(args)`, the inputs it consumes, the outputs' shapes, dtypes, strides, devices and aliasing;
no caching across calls, no reading the environment or files, no threads or processes, no patching
torch or timers, no native code loaded from the wrapper (load_inline, ctypes: rejected as static-native).

## The gate's numbers
{gate_facts(meta, settings)}

## Rules
{AGENCY_RULES[settings.agency]}

## Facts
{graph_facts(state, meta, fx_chars)}
{skills_note}"""


def graph_facts(state, meta: dict, fx_chars: int = FX_CHARS) -> str:
    """The system prompt's facts of this graph: device, stack, measured ceilings, baseline profile, FX program."""
    from tilesmith.source import split_header

    device = str(meta.get("device") or "cpu")
    try:
        ceilings = json.dumps(device_ceilings(device))
    except Exception as e:  # the context is still useful without them
        ceilings = f"(not measured: {type(e).__name__})"
    fx, _ = split_header(state.track.graph.wrapper)
    base = profile_table(state.track.profile) if state.track.profile else "(not profiled yet: call `profile`)"
    return f"""- Graph {state.track.key[:16]} ({meta.get('kind', 'forward')}), device {device}; stack {json.dumps(meta.get('environment', {}))[:600]}
- Measured ceilings: {ceilings}
- Baseline profile:
{base}
- FX program (what the wrapper computes):
{fx_excerpt(fx, fx_chars)}"""
