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


_TB = torch._C.TensorBase
# What the digest and the kept outputs' snapshot call, bound when this module loads, before any candidate code:
# torch's own C methods (a Python-level `Tensor.detach` replaced for one call and put back, which the guard cannot
# see, filled the kept outputs with the real values as the digest read them: tests/redteam.py), the guards that
# switch off Python-level torch function and dispatch modes, and the builtins. The worker's op_time holds these
# in its frame's locals and passes them on.
PRIMS = (_TB.detach, _TB.contiguous, _TB.reshape, _TB.view, _TB.cpu, _TB.numpy, _TB.size, _TB.numel, _TB.clone,
         _TB.dtype.__get__, zlib.crc32, isinstance, tuple, list, repr, torch.Tensor, torch.uint8,
         torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch)


def snapshot(out, graph: bool, prims: tuple = PRIMS) -> list:
    """A call's outputs as a list, kept past later calls: in graph mode they live in the graph's buffers (a copy)."""
    (_, _, _, _, _, _, _, _, clone, _, _, isinstance_, tuple_, list_, _, tensor, _, no_function, no_dispatch) = prims
    outs = list_(out) if isinstance_(out, (list_, tuple_)) else [out]
    if not graph:
        return outs
    with no_function(), no_dispatch():
        return [clone(o) if isinstance_(o, tensor) else o for o in outs]


def outputs_digest(samples: list, prims: tuple = PRIMS) -> int:
    """A CRC of a kept sample's outputs (lists of a call's outputs): shapes, dtypes and every value's bytes,
    the same for a tensor on the device and its CPU copy. The worker sends it with the sample; the parent
    compares it with the outputs that reach it later, so none is changed in between. Everything it calls is
    in `prims` (PRIMS), torch's modes switched off."""
    (detach, contiguous, reshape, view, cpu, numpy, size, numel, _, dtype_of, crc32, isinstance_, tuple_, list_,
     repr_, tensor, u8, no_function, no_dispatch) = prims
    crc = 0
    with no_function(), no_dispatch():
        for outs in samples:
            for o in outs if isinstance_(outs, (list_, tuple_)) else [outs]:
                if isinstance_(o, tensor):
                    crc = crc32(f"{tuple_(size(o))}|{dtype_of(o)}".encode(), crc)
                    flat = reshape(contiguous(detach(o)), -1)
                    if numel(flat):
                        crc = crc32(numpy(cpu(view(flat, u8))), crc)  # the buffer itself, no copy
                else:
                    crc = crc32(repr_(o).encode(), crc)
    return crc
