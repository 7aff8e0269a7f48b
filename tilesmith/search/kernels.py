"""The launch parameters of an Inductor wrapper's kernels, and their variants for the tuner.

Stdlib only: works on the wrapper text. tilesmith/source.py finds each kernel's string literal
(`kernels_in`) and splices a new one in its place (`replace_kernel`), so the rest of the wrapper is
untouched; here each kernel's parameters are read (`find_kernels`) and rewritten (`variants`).
"""

from __future__ import annotations

import ast
import os
import re

from tilesmith.source import Kernel, kernels_in, replace_kernel  # noqa: F401 - the tuner's K.replace_kernel


def find_kernels(src: str) -> list[Kernel]:
    """Every kernel defined through async_compile in `src`, in source order, with what the tuner may change."""
    found = kernels_in(src)
    for k in found:
        k.params = cpp_params(k.code) if k.kind == "cpp" else triton_params(k.code)
    return found


# -- C++ (OpenMP) ------------------------------------------------------------------------------

_OMP_PARALLEL = re.compile(r"#pragma omp parallel(?![ \t]+for)( num_threads\(\d+\))?")


def cpp_params(code: str) -> dict:
    regions = _OMP_PARALLEL.findall(code)
    m = re.search(r"num_threads\((\d+)\)", code)
    return {"parallel_regions": len(regions), "num_threads": int(m.group(1)) if m else None}


def cpp_variants(k: Kernel, cpu_count: int | None = None) -> list[tuple[str, str]]:
    """(label, code) per OpenMP thread count; 1 thread is the serial path for small loops."""
    if not k.params.get("parallel_regions"):
        return []
    # Cores this process may use (a container's affinity), not the host's count.
    n = cpu_count or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) or 1
    counts = sorted({1, 2, 4, 8, 16, 32, n // 2, n} - {0})
    current = k.params.get("num_threads") or n  # no num_threads clause: OpenMP uses every core
    counts = [c for c in counts if c <= n and c != current]
    return [(f"num_threads={c}", _OMP_PARALLEL.sub(f"#pragma omp parallel num_threads({c})", k.code)) for c in counts]


# -- Triton ------------------------------------------------------------------------------------

_HEURISTIC = re.compile(r"@triton_heuristics\.(pointwise|reduction|persistent_reduction)\(")
_CONSTEXPR_BLOCK = re.compile(r"\b([XYZ]BLOCK|R0_BLOCK|R1_BLOCK)\s*:\s*tl\.constexpr")


def triton_params(code: str) -> dict:
    m = _HEURISTIC.search(code)
    if not m:
        return {}
    hints = re.search(r"size_hints=\{([^}]*)\}", code)
    size_hints = {k: int(v) for k, v in re.findall(r"'(\w+)':\s*(\d+)", hints.group(1))} if hints else {}
    fn = re.search(r"^def \w+\((.*?)\):", code, re.M | re.S)
    blocks = _CONSTEXPR_BLOCK.findall(fn.group(1)) if fn else []
    return {"heuristic": m.group(1), "size_hints": size_hints, "blocks": blocks}


def _decorator_span(code: str) -> tuple[int, int] | None:
    m = _HEURISTIC.search(code)
    if not m:
        return None
    depth, i = 0, m.end() - 1
    while i < len(code):
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        if depth == 0:
            return m.start(), i + 1
        i += 1
    return None


def _kwarg_text(call_text: str, name: str) -> str | None:
    call = ast.parse(call_text[1:]).body[0].value  # drop the '@'
    for kw in call.keywords:
        if kw.arg == name:
            return ast.get_source_segment(call_text[1:], kw.value)
    return None


def with_fixed_config(code: str, config: dict, num_warps: int, num_stages: int) -> str | None:
    """The Triton kernel with its heuristic decorator replaced by one fixed launch config."""
    span = _decorator_span(code)
    if span is None:
        return None
    deco = code[span[0]:span[1]]
    triton_meta, inductor_meta = _kwarg_text(deco, "triton_meta"), _kwarg_text(deco, "inductor_meta")
    if triton_meta is None:
        return None
    cfg = {**config, "num_warps": num_warps, "num_stages": num_stages}
    new = (f"@triton_heuristics.fixed_config({cfg!r}, filename=__file__, triton_meta={triton_meta}, "
           f"inductor_meta={inductor_meta or '{}'})")
    return code[: span[0]] + new + code[span[1]:]


def _pow2_upto(n: int, lo: int = 1) -> list[int]:
    out, v = [], lo
    while v <= max(lo, n):
        out.append(v)
        v *= 2
    return out


def triton_configs(k: Kernel) -> list[dict]:
    """Launch configs the heuristics allow for this kernel: block sizes, warps, stages."""
    p = k.params
    blocks, hints = p.get("blocks") or [], p.get("size_hints") or {}
    if not blocks:
        return []
    x = hints.get("x", 1)
    r = hints.get("r0_", 1)
    out = []
    if p["heuristic"] == "pointwise" and blocks == ["XBLOCK"]:
        for xb in [b for b in (64, 128, 256, 512, 1024, 2048) if b <= max(64, x)]:
            for w in (1, 2, 4, 8):
                if xb // w >= 16:
                    out.append({"XBLOCK": xb, "_w": w, "_s": 1})
    elif p["heuristic"] == "persistent_reduction" and blocks == ["XBLOCK"]:
        for xb in [b for b in _pow2_upto(64) if b <= x and b * r <= 8192]:
            for w in (1, 2, 4, 8):
                out.append({"XBLOCK": xb, "_w": w, "_s": 1})
    elif p["heuristic"] == "reduction" and set(blocks) == {"XBLOCK", "R0_BLOCK"}:
        for xb in [b for b in _pow2_upto(64) if b <= x]:
            for rb in [b for b in (32, 64, 128, 256, 512, 1024, 2048) if b <= max(32, r) and xb * b <= 8192]:
                for w in (2, 4, 8, 16):
                    out.append({"XBLOCK": xb, "R0_BLOCK": rb, "_w": w, "_s": 1})
    return out


def triton_variants(k: Kernel, limit: int = 24) -> list[tuple[str, str]]:
    """(label, code) per launch config, spread evenly over the allowed space when there are many."""
    configs = triton_configs(k)
    if len(configs) > limit:
        step = len(configs) / limit
        configs = [configs[int(i * step)] for i in range(limit)]
    out = []
    for c in configs:
        cfg = {b: v for b, v in c.items() if not b.startswith("_")}
        code = with_fixed_config(k.code, cfg, c["_w"], c["_s"])
        if code:
            label = ",".join(f"{b}={v}" for b, v in cfg.items()) + f",warps={c['_w']},stages={c['_s']}"
            out.append((label, code))
    return out


def variants(k: Kernel) -> list[tuple[str, str]]:
    if k.kind == "cpp":
        return cpp_variants(k)
    if k.kind == "triton":
        return triton_variants(k)
    return []
