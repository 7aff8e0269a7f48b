"""Tensor moves of the gate's worker (tilesmith.gate.worker): exact-layout device copies, in-place refills
of a buffer's storage span, and a call's outputs as a list. Shared by its correctness and timing ops."""

from __future__ import annotations

import zlib

import torch

from tilesmith.capture.tensors import span_numel


def _to_device(x, device):
    if not isinstance(x, torch.Tensor):
        return x
    n = span_numel(x)
    if n == 0:
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=device)
    flat = x.as_strided((n,), (1,), x.storage_offset()).to(device, copy=True)
    return flat.as_strided(x.size(), x.stride(), 0)


def _to_cpu(x):
    return _to_device(x.detach(), "cpu") if isinstance(x, torch.Tensor) else x


def _refill(dst, src):
    """Copy src's storage span into dst's in place (same layout): new values in the same buffers."""
    if isinstance(dst, torch.Tensor) and span_numel(dst):
        n = span_numel(dst)
        dst.as_strided((n,), (1,), dst.storage_offset()).copy_(src.as_strided((n,), (1,), src.storage_offset()))


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def outputs_digest(samples: list) -> int:
    """A CRC of a kept sample's outputs (lists of a call's outputs): shapes, dtypes and every value's bytes,
    the same for a tensor on the device and its CPU copy. The worker sends it with the sample; the parent
    compares it with the outputs that reach it later, so none is changed in between."""
    crc = 0
    for outs in samples:
        for o in outs if isinstance(outs, (list, tuple)) else [outs]:
            if isinstance(o, torch.Tensor):
                crc = zlib.crc32(f"{tuple(o.shape)}|{o.dtype}".encode(), crc)
                flat = o.detach().contiguous().reshape(-1)
                if flat.numel():
                    crc = zlib.crc32(flat.view(torch.uint8).cpu().numpy(), crc)  # the buffer itself, no copy
            else:
                crc = zlib.crc32(repr(o).encode(), crc)
    return crc
