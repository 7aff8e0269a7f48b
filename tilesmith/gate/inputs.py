"""Input sets for the gate, made in the deciding process from graph.json ranges and data.pt.

Every set has exactly the captured layout (size, stride, storage offset 0, dtype); values are drawn for
the whole storage span, so expanded and overlapping views stay valid. Integer and bool inputs stay
inside their recorded [min, max] (indices stay in bounds); floats follow several distributions; graph
parameters are perturbed around their captured values, so work that is only right for the captured
weights (a LayerNorm whose weight happens to be all ones) is caught.
"""

from __future__ import annotations

import hashlib
import math

import torch

from tilesmith.capture.tensors import span_numel


def parameter_indices(meta: dict) -> set[int]:
    """Positions of the inputs graph.json marks as parameters (weights, buffers of the module): timed in
    one buffer at one address, as a program's weights stay between steps."""
    return {i for i, d in enumerate(meta.get("inputs") or []) if d.get("parameter")}

RANDOM_KINDS = ("normal", "uniform", "positive", "heavy")
# Scale of the high-magnitude set, by dtype: large, yet far from overflow in a product of two inputs.
_LARGE = {torch.float16: 16.0, torch.bfloat16: 256.0, torch.float32: 1000.0, torch.float64: 1000.0}


def derive_seed(seed: int, *parts) -> int:
    """A 63-bit seed from a base seed and labels (hashlib, not hash(): stable across processes)."""
    h = hashlib.sha256(":".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def make_sets(meta: dict, captured: list, seed: int, random_sets: int = 4) -> list[tuple[str, list]]:
    """[(name, inputs)]: captured, `random_sets` random sets cycling RANDOM_KINDS, zeros, large. CPU tensors."""
    infos = meta.get("inputs") or [{} for _ in captured]
    sets = [("captured", [_cpu_copy(x) for x in captured])]
    for i in range(random_sets):
        kind = RANDOM_KINDS[i % len(RANDOM_KINDS)]
        g = torch.Generator().manual_seed(derive_seed(seed, kind, i))
        sets.append((f"{kind}-{i}", [_fill(x, m, kind, g) for x, m in zip(captured, infos)]))
    g = torch.Generator().manual_seed(derive_seed(seed, "edge"))
    sets.append(("zeros", [_fill(x, m, "zeros", g) for x, m in zip(captured, infos)]))
    sets.append(("large", [_fill(x, m, "large", g) for x, m in zip(captured, infos)]))
    return sets


def _cpu_copy(x):
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    n = span_numel(x)
    flat = x.as_strided((n,), (1,), x.storage_offset()).to("cpu", copy=True) if n else torch.empty(0, dtype=x.dtype)
    return flat.as_strided(x.size(), x.stride(), 0)


def _fill(x, info: dict, kind: str, g: torch.Generator):
    """A tensor with x's layout whose storage span holds fresh values of `kind`."""
    if not isinstance(x, torch.Tensor):
        return x
    base = _cpu_copy(x)
    n = span_numel(base)
    if n == 0:
        return base
    flat = base.as_strided((n,), (1,), 0)
    if base.dtype == torch.bool or not (base.dtype.is_floating_point or base.dtype.is_complex):
        vals = _integers(flat, info, kind, g)
    elif base.dtype.is_complex:
        vals = flat if kind != "zeros" else torch.zeros_like(flat)
    else:
        vals = _floats(flat, info, kind, g)
    flat.copy_(vals.to(flat.dtype))
    return base


def _integers(flat: torch.Tensor, info: dict, kind: str, g) -> torch.Tensor:
    r = info.get("range") or {}
    lo = int(r.get("min", flat.min().item() if flat.numel() else 0))
    hi = int(r.get("max", flat.max().item() if flat.numel() else 0))
    if kind == "zeros" or lo == hi:
        return torch.full(flat.shape, min(max(0, lo), hi), dtype=torch.int64)
    return torch.randint(lo, hi + 1, flat.shape, generator=g, dtype=torch.int64)


def _floats(flat: torch.Tensor, info: dict, kind: str, g) -> torch.Tensor:
    r = info.get("range") or {}
    cap = flat.to(torch.float64)
    finite = cap[torch.isfinite(cap)]
    lo = r.get("min", float(finite.min()) if finite.numel() else -1.0)
    hi = r.get("max", float(finite.max()) if finite.numel() else 1.0)
    mean = r.get("mean") or 0.0
    std = r.get("std") or 0.0
    if not all(map(math.isfinite, (lo, hi, mean, std))):
        lo, hi, mean, std = -1.0, 1.0, 0.0, 1.0
    shape = flat.shape
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch.float64)
    if kind == "large":
        return cap * _LARGE.get(flat.dtype, 100.0) if not info.get("parameter") else cap
    z = _draw(kind, shape, g)
    if info.get("parameter"):
        # A weight in another run of the same graph: the captured value moved by about its own spread.
        sigma = max(std, 0.1 * max(abs(lo), abs(hi)), 1e-2)
        v = cap + 0.5 * sigma * z
        return v.abs() if kind == "positive" else v
    spread = std if std > 0 else max(abs(lo), abs(hi), 1.0)
    if kind == "uniform" and hi > lo:
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)
    return mean + spread * z if kind != "positive" else abs(mean) + spread * z


def _draw(kind: str, shape, g) -> torch.Tensor:
    """Standardised draws: normal, uniform(-sqrt3, sqrt3), |normal|, or Student-t with 2 dof (heavy tails)."""
    n = torch.randn(shape, generator=g, dtype=torch.float64)
    if kind == "uniform":
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * math.sqrt(3)
    if kind == "positive":
        return n.abs()
    if kind == "heavy":
        chi2 = -2.0 * torch.log(torch.rand(shape, generator=g, dtype=torch.float64).clamp_min(1e-300))
        return (n / torch.sqrt(chi2 / 2.0)).clamp(-100.0, 100.0)
    return n
