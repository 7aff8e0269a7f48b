"""Whole-graph re-lowering: Inductor lowers the captured graph again under config variants.

Per-kernel launch settings cannot move a graph of many small kernels; fewer kernels, shorter gaps
between them and GEMM choices judged on the whole graph can. Each variant is compiled from the stored
repro (tilesmith/capture/repro.py) in its own worker process (compiling is CPU work, so variants
compile in parallel), checked to keep the graph's ABI, then all of them are screened on the whole call
in the graph's production mode (replayed from a CUDA graph when Inductor runs it under cudagraphs).
The variants that screen faster are merged into one combined config, which is lowered and screened
too; the best goes to the gate, then the singles in order of gain. Variants that compile in seconds
go first; those that autotune GEMMs (minutes) form a second wave on top of what the first accepted.
A variant that does not compile, names a config this torch lacks, or changes the ABI is skipped and
its reason recorded. With TILESMITH_REWRITES set (off by default), the graph rewrites of
tilesmith/search/rewrites come first, as variants of their own, in the order of the time the baseline profile
puts in the kernels they address; where re-lowering is off by `auto` (CPU graphs) they are its only variants.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tilesmith import settings
from tilesmith.launch import sandbox
from tilesmith.capture import repro
from tilesmith.search import rewrites
from tilesmith.search.graphed import GRAPHED_IMPORT, REPLAYED_SUFFIX, graphed_text
from tilesmith.workspace import Graph, graph_devices

WHOLE_GRAPH = "(whole graph)"
LABEL_PREFIX = "re-lowered: "


@dataclass
class Variant:
    label: str
    patch: dict  # Inductor config name (dotted, e.g. "triton.enable_pdl") -> value
    hopper: bool = False  # needs compute capability >= 9.0 (TMA)
    # A rewrite of the graph when the worker traces the repro again, before Inductor lowers it (relower_worker
    # TRACES): for what no config of this torch does. "" for none.
    trace: str = ""


@dataclass
class Lowered:
    variant: Variant
    text: str | None  # the new wrapper (FX header included); None when skipped
    reason: str = ""  # why skipped
    compile_s: float | None = None
    max_abs_error: float | None = None  # against the captured outputs (informational: the gate judges)


# GPU: config names read from torch 2.13's torch/_inductor/config.py; each is checked to exist in the
# worker's torch before use (a missing one skips the variant with the reason).
GPU_VARIANTS = [
    Variant("programmatic dependent launch", {"triton.enable_pdl": True}),
    Variant("combo kernels", {"combo_kernels": True}),
    Variant("decompose memory-bound mm", {"decompose_mem_bound_mm": True}),
    Variant("aggressive fusion", {"aggressive_fusion": True}),
    Variant("max-autotune GEMM", {"max_autotune_gemm": True}),
    Variant("max-autotune GEMM, no epilogue fusion", {"max_autotune_gemm": True, "epilogue_fusion": False}),
    Variant("max-autotune GEMM, exhaustive search", {"max_autotune_gemm": True,
                                                    "max_autotune_gemm_search_space": "EXHAUSTIVE"}),
    Variant("max-autotune GEMM, cuBLAS only", {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN"}),
    Variant("max-autotune GEMM, Triton only", {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON"}),
    Variant("persistent TMA matmul", {"max_autotune_gemm": True, "triton.enable_persistent_tma_matmul": True},
            hopper=True),
    Variant("split-K (decompose-K) for more GEMMs", {"max_autotune_gemm": True, "triton.num_decompose_k_splits": 10,
                                      "triton.decompose_k_threshold": 8}),
    Variant("coordinate-descent tuning", {"coordinate_descent_tuning": True}),
    # topk, sort, kthvalue, median lowered to Triton sorts that fuse with their neighbours instead of ATen's
    # kernels (the H200 profile of the MoE under reduce-overhead (benchmarks/RESULTS-history.md): ATen's topk of 2 among 4 experts,
    # gatherTopK + bitonicSortKVInPlace, was 22 of the step's 115 GPU µs). Ties may come out in another order
    # than ATen's: the gate compares the indices exactly and rejects a variant where that changes outputs.
    Variant("sort ops (topk, sort) in Triton", {"triton.decompose_sort_ops": True}),
    # The same for topk on a torch without that config (2.11, on the H200): each topk traced as a stable sort
    # and its first k, which Inductor lowers to a Triton sort (ir.Sort) where the sorted dimension is small
    # (a router's experts). Ties come out in index order; the gate judges whether that changes any output.
    Variant("topk as a stable sort (Triton)", {}, trace="topk-as-sort"),
]
# CPU (C++ kernels): what torch 2.13's config has for the C++ backend and the scheduler.
CPU_VARIANTS = [
    Variant("aggressive fusion", {"aggressive_fusion": True}),
    Variant("no epilogue fusion", {"epilogue_fusion": False}),
    Variant("max_fusion_size=8", {"max_fusion_size": 8}),
    Variant("cpp.max_horizontal_fusion_size=64", {"cpp.max_horizontal_fusion_size": 64}),
    Variant("cpp.min_chunk_size=64", {"cpp.min_chunk_size": 64}),
    Variant("cpp.min_chunk_size=4096", {"cpp.min_chunk_size": 4096}),
    Variant("no loop reordering after fusion", {"loop_ordering_after_fusion": False}),
    Variant("no C++ tiling heuristics", {"cpp.enable_tiling_heuristics": False}),
]


@dataclass
class RelowerConfig:
    enabled: str = field(default_factory=lambda: settings.current().relower)  # auto|1|0
    jobs: int = 0  # parallel compile workers; 0: one per usable core (at most the variant count)
    compile_timeout_s: float = 600.0  # one variant (max-autotune with the exhaustive space is slow)
    variants: list[Variant] | None = None  # None: GPU_VARIANTS or CPU_VARIANTS by the graph's device
    # TILESMITH_RELOWER_ONLY="combo,pdl": keep only variants whose label contains one of these words
    only: str = field(default_factory=lambda: settings.current().relower_only)
    # TILESMITH_REWRITES: graph rewrites (tilesmith/search/rewrites) tried as variants too; "" for none (the default)
    rewrites: str = field(default_factory=lambda: settings.current().rewrites)


def available(graph: Graph) -> tuple[bool, str]:
    """Whether the graph's capture kept a repro that can be lowered again (and why not)."""
    st = graph.meta.get("relower")
    if not st:
        return False, "captured without a repro (capture again with this tilesmith)"
    if not st.get("available"):
        return False, st.get("reason") or "no repro"
    if not (graph.dir / repro.REPRO_FILE).exists():
        return False, f"{repro.REPRO_FILE} is missing"
    return True, ""


_OFF = ("0", "off", "false")


def enabled(graph: Graph, cfg: RelowerConfig) -> bool:
    """Whether the config variants are tried. TILESMITH_RELOWER=1/0 forces it; auto: CUDA graphs only (on CPU
    the C++ knobs rarely pay for their compile time)."""
    if cfg.enabled in _OFF:
        return False
    if cfg.enabled in ("1", "on", "true"):
        return True
    return graph.device.startswith("cuda")


def default_variants(graph: Graph) -> list[Variant]:
    if not graph.device.startswith("cuda"):
        return list(CPU_VARIANTS)
    cap = str((graph.meta.get("environment") or {}).get("gpu_capability") or "")  # "9.0" on the H200
    hopper = not cap or (cap.split(".")[0].isdigit() and int(cap.split(".")[0]) >= 9)
    return [v for v in GPU_VARIANTS if hopper or not v.hopper]


def lower_variants(graph_dir: str | Path, variants: list[Variant], *, jobs: int = 0,
                   timeout_s: float = 600.0, stop=None) -> list[Lowered]:
    """Lower the graph under each variant, `jobs` worker processes at a time; results in input order.
    `stop()` true (the track's time limit) ends the workers still running; their variants are skipped."""
    from tilesmith.gate.spares import usable_cores

    jobs = jobs or max(1, usable_cores())
    results: list[Lowered | None] = [None] * len(variants)
    with tempfile.TemporaryDirectory(prefix="tilesmith-relower-") as tmp:
        running: list[tuple[int, subprocess.Popen, float]] = []
        todo = list(range(len(variants)))
        while todo or running:
            stopped = stop is not None and stop()
            while todo and len(running) < jobs and not stopped:
                i = todo.pop(0)
                running.append((i, _start(graph_dir, variants[i], Path(tmp) / f"v{i:02d}"), time.monotonic()))
            if stopped:
                for i in todo:
                    results[i] = Lowered(variants[i], None, "not compiled: the time limit was reached")
                todo = []
            time.sleep(0.2)
            for item in list(running):
                i, p, t0 = item
                if p.poll() is None and time.monotonic() - t0 < timeout_s and not stopped:
                    continue
                running.remove(item)
                results[i] = _finish(variants[i], p, Path(tmp) / f"v{i:02d}", timeout_s)
    return [r for r in results if r is not None]


def _start(graph_dir, v: Variant, base: Path) -> subprocess.Popen:
    base.mkdir()
    (base / "spec.json").write_text(json.dumps({"graph_dir": str(graph_dir), "patch": v.patch, "trace": v.trace,
                                                "out": str(base / "wrapper.py")}))
    # Through the one launcher (the OS sandbox, the scrubbed environment, which also sets
    # TORCHINDUCTOR_COMPILE_THREADS=1: parallelism comes from the workers, not pools inside each).
    return sandbox.popen([sys.executable, "-m", "tilesmith.search.relower_worker", str(base / "spec.json")],
                         sandbox.Spec.for_graphs(base, graph_devices([graph_dir]), readable=[str(graph_dir)]),
                         stdout=open(base / "out.txt", "w"), stderr=open(base / "err.txt", "w"))


def _finish(v: Variant, p: subprocess.Popen, base: Path, timeout_s: float) -> Lowered:
    if p.poll() is None:
        sandbox.kill(p.pid)  # the whole sandbox: its stage and the worker under it
        p.wait()
        return Lowered(v, None, f"compile stopped after {timeout_s:.0f} s or at the time limit")
    lines = [ln for ln in (base / "out.txt").read_text().splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = " | ".join((base / "err.txt").read_text().strip().splitlines()[-2:])
        return Lowered(v, None, f"worker failed (exit {p.returncode}): {tail}"[:400])
    r = json.loads(lines[-1])
    if not r.get("ok"):
        return Lowered(v, None, r.get("reason") or "unknown", r.get("compile_s"))
    return Lowered(v, Path(r["out"]).read_text(), "", r.get("compile_s"), r.get("max_abs_error"))


def merge(variants: list[Variant]) -> Variant | None:
    """One variant holding every patch that does not contradict an earlier (better) one; None if < 2."""
    patch: dict = {}
    used, trace = [], ""
    for v in variants:
        both = _combined(trace, v.trace)
        if all(patch.get(k, val) == val for k, val in v.patch.items()) and both is not None:
            patch.update(v.patch)
            used.append(v.label)
            trace = both
    if len(used) < 2:
        return None
    parts = [p for lab in used for p in lab.split(" + ")]  # labels of a later wave carry the accepted base
    return Variant(" + ".join(dict.fromkeys(parts)), patch, hopper=any(v.hopper for v in variants), trace=trace)


def _combined(a: str, b: str) -> str | None:
    """The trace of a variant with traces a and b ("" for none); None when they do not combine: two different
    traces, unless both name graph rewrites (tilesmith/search/rewrites), which apply one after another."""
    if not a or not b or a == b:
        return a or b
    if rewrites.named(a) and rewrites.named(b):
        return "+".join(dict.fromkeys(a.split("+") + b.split("+")))
    return None


def search(track, make_candidate, cfg: RelowerConfig | None = None, *, screen_budget_s: float = 3.0,
           min_gain: float = 0.01, replayed: bool = False):
    """Generator (the tuner's protocol): yields candidates built by make_candidate(text, label) and
    receives each verdict through send(). Two waves: the variants that compile in seconds first, then
    those that autotune GEMMs (minutes; they time on the GPU while compiling, so they never overlap a
    gate). An accepted candidate's config is kept under the next wave's variants, which must then beat
    it. Every variant, screened or skipped, is recorded through track.record(). replayed: each candidate
    goes to the gate replayed by tilesmith.cudagraph (tuner.replay_near_even), as the screen timed it."""
    cfg = cfg or RelowerConfig()
    chosen = rewrites.chosen(cfg.rewrites)  # [] unless TILESMITH_REWRITES is set: then all is as without them
    configs = enabled(track.graph, cfg)
    if not (configs or (chosen and cfg.enabled not in _OFF)) or track.expired():
        return
    ok, why = available(track.graph)
    if not ok:
        track.record({"kernel": WHOLE_GRAPH, "variant": "re-lowering", "median_ms": None, "error": why})
        return
    variants = _variants(track, cfg, chosen, configs, min_gain)
    base = Variant("", {})  # the config accepted so far
    for wave in _waves(variants):
        wave = [Variant(_joined(base.label, v.label), {**base.patch, **v.patch}, v.hopper,
                        _combined(base.trace, v.trace))
                for v in wave if all(base.patch.get(k, val) == val for k, val in v.patch.items())
                and _combined(base.trace, v.trace) is not None]
        if not wave or track.expired():
            return
        winners = _wave_winners(track, wave, cfg, screen_budget_s, min_gain)
        for lw in winners:
            if track.expired():
                return
            verdict = yield make_candidate(*_proposed(track.best_text, lw, replayed))
            if verdict and verdict.get("accepted"):
                base = lw.variant
                break


def _variants(track, cfg: RelowerConfig, chosen: list, configs: bool, min_gain: float = 0.01) -> list[Variant]:
    """The variants to try: the graph rewrites `chosen` first (by the profile; those it rules out are recorded),
    then the config variants where `configs`; only those TILESMITH_RELOWER_ONLY keeps."""
    variants = cfg.variants if cfg.variants is not None else default_variants(track.graph)
    if chosen:
        kept, skipped = rewrites.ordered(chosen, getattr(track, "profile", None), min_share=min_gain)
        for r, why in skipped:
            track.record({"kernel": WHOLE_GRAPH, "variant": LABEL_PREFIX + r.label, "median_ms": None, "error": why})
        variants = [Variant(r.label, {}, trace=r.name) for r in kept] + (variants if configs else [])
    words = [w.strip().lower() for w in cfg.only.split(",") if w.strip()]
    return [v for v in variants if not words or any(w in v.label.lower() for w in words)]


def _waves(variants: list[Variant]) -> list[list[Variant]]:
    fast = [v for v in variants if not v.patch.get("max_autotune_gemm")]
    slow = [v for v in variants if v.patch.get("max_autotune_gemm")]
    return [w for w in (fast, slow) if w]


def _joined(a: str, b: str) -> str:
    return f"{a} + {b}" if a else b


def _wave_winners(track, wave: list[Variant], cfg: RelowerConfig, budget_s: float, min_gain: float) -> list[Lowered]:
    """The wave's variants that screened faster than the current code, best first; the merge of them
    first when it screens better than the best single one."""
    gdir = track.graph_dir
    lowered = lower_variants(gdir, wave, jobs=cfg.jobs, timeout_s=cfg.compile_timeout_s, stop=track.expired)
    gains = _screen(track, lowered, budget_s)
    winners = [lw for g, lw in gains if g > min_gain]
    combo = merge([lw.variant for lw in winners])
    if combo is not None and not track.expired():
        (lc,) = lower_variants(gdir, [combo], jobs=1, timeout_s=cfg.compile_timeout_s, stop=track.expired)
        cg = _screen(track, [lc], budget_s)
        if cg and cg[0][0] > gains[0][0]:
            winners.insert(0, lc)  # the combination screened better than the best single variant
    return winners


def _screen(track, lowered: list[Lowered], budget_s: float) -> list[tuple[float, Lowered]]:
    """[(gain over the current code, variant)], best first; skipped variants are recorded, not screened."""
    from tilesmith.search.measure import screen

    live = []
    seen = {_body(track.best_text)}
    for lw in lowered:
        if lw.text is not None and _body(lw.text) in seen:
            lw.text, lw.reason = None, "Inductor generated the same wrapper as the current code"
        if lw.text is None:
            track.record({"kernel": WHOLE_GRAPH, "variant": LABEL_PREFIX + lw.variant.label, "median_ms": None,
                          "error": lw.reason, "compile_s": lw.compile_s})
            continue
        seen.add(_body(lw.text))
        live.append(lw)
    if not live:
        return []
    prod = _production_text(track.graph)
    results = screen(track.graph_dir, [("current", prod(track.best_text))] +
                     [(lw.variant.label, prod(_as_current(track.best_text, lw.text))) for lw in live],
                     budget_s=budget_s)
    current = results[0].median_ms
    out = []
    for lw, r in zip(live, results[1:]):
        track.record({"kernel": WHOLE_GRAPH, "variant": LABEL_PREFIX + lw.variant.label, "median_ms": r.median_ms,
                      "current_ms": current, "samples": len(r.samples_ms), "error": r.error,
                      "compile_s": lw.compile_s, "max_abs_error": lw.max_abs_error})
        if current and r.median_ms:
            out.append((current / r.median_ms - 1, lw))
    return sorted(out, key=lambda x: -x[0])


def _body(text: str) -> str:
    """The wrapper as compared for sameness: no FX header, no comment lines (a re-lowered graph has
    no AOT id, and its source-node comments name decomposed ops), kernel names without the op names (the repro lost the pre-decomposition ops Inductor names
    kernels after: `cpp_fused_gelu_1` comes back as `cpp_fused_add_erf_mul_1`)."""
    import re

    from tilesmith.source import split_header

    body = re.sub(r"^\s*#.*\n", "", split_header(text)[1], flags=re.M)  # comments: source nodes, AOT id
    return re.sub(r"\b(cpp_fused|triton_[a-z]+_fused)(?:_\w+?)?_(\d+)\b", r"\1_\2", body)


def _proposed(current: str, lw: Lowered, replayed: bool) -> tuple[str, str]:
    """(text, label) of a re-lowered variant as it goes to the gate."""
    text, label = _as_current(current, lw.text), LABEL_PREFIX + lw.variant.label
    if replayed and GRAPHED_IMPORT not in text:
        text, label = graphed_text(text), label + REPLAYED_SUFFIX
    return text, label


def _as_current(current: str, text: str) -> str:
    """A re-lowered wrapper with the whole-call moves already accepted on the current code (graphed)."""
    return graphed_text(text) if GRAPHED_IMPORT in current else text


def _production_text(graph: Graph):
    """How to time a wrapper as production runs it: replayed from a CUDA graph when Inductor compiled
    the graph with cudagraphs (its cudagraph trees will wrap whatever we install), else as is."""
    if graph.device.startswith("cuda") and graph.compile_mode == "cudagraphs":
        return graphed_text
    return lambda text: text
