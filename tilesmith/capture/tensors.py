"""Tensor helpers for capture and replay: exact-layout snapshots, metadata, value ranges."""

from __future__ import annotations

import torch


def span_numel(t: torch.Tensor) -> int:
    """Elements of storage a view touches (1 + sum((size-1)*stride)); 0 for empty tensors."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.size(), t.stride()))


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same size and strides (overlapping/expanded views too), offset 0, own storage."""
    t = t.detach()
    if t.numel() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    flat = t.as_strided((span_numel(t),), (1,), t.storage_offset()).clone()
    return flat.as_strided(t.size(), t.stride(), 0)


def nbytes(t: torch.Tensor) -> int:
    return span_numel(t) * t.element_size()


def describe(x, index: int) -> dict:
    """Metadata of one graph input or output: layout, dtype, device, parameter-ness, value range."""
    if isinstance(x, bool) or not isinstance(x, (torch.Tensor, int, float)):
        return {"index": index, "kind": type(x).__name__}
    if not isinstance(x, torch.Tensor):
        return {"index": index, "kind": "symint" if isinstance(x, int) else "scalar", "value": x}
    d = {
        "index": index,
        "kind": "tensor",
        "shape": list(x.shape),
        "stride": list(x.stride()),
        "storage_offset": int(x.storage_offset()),
        "dtype": str(x.dtype).removeprefix("torch."),
        "device": str(x.device),
        "requires_grad": bool(x.requires_grad),
        "parameter": isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None,
    }
    d["range"] = value_range(x)
    return d


def value_range(x: torch.Tensor) -> dict | None:
    """min/max for integers and bools; mean/std/min/max for floats; None when it cannot be read."""
    if x.numel() == 0 or x.is_mkldnn or x.layout != torch.strided:
        return None
    try:
        v = x.detach()
        if v.dtype == torch.bool:
            v = v.to(torch.int64)
        if v.dtype.is_floating_point:
            v = v.to(torch.float64)
            finite = v[torch.isfinite(v)]
            return {
                "mean": float(finite.mean()) if finite.numel() else None,
                "std": float(finite.std()) if finite.numel() > 1 else 0.0,
                "min": float(v.min()),
                "max": float(v.max()),
                "nonfinite": int(v.numel() - finite.numel()),
            }
        if v.dtype.is_complex:
            return None
        return {"min": int(v.min()), "max": int(v.max())}
    except Exception:
        return None
