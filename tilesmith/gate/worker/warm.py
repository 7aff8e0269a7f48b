"""What a gate worker does before its first request, while no wrapper code has run in it: the imports a
wrapper will need, Inductor's CPU vector-ISA probe, the CUDA context."""

from __future__ import annotations

import torch


# What Inductor's wrapper headers import (CPU and Triton); trusted torch modules, imported before any
# wrapper so a worker started early does not pay for them when its candidate arrives. Names missing in
# one torch version are skipped.
_WRAPPER_IMPORTS = ("torch._inductor.async_compile", "torch._inductor.codegen.memory_planning", "torch._inductor.hooks",
                    "torch._inductor.select_algorithm", "torch._inductor.utils", "torch._inductor.codegen.multi_kernel")
_TRITON_IMPORTS = ("triton", "triton.language", "torch._inductor.runtime.triton_heuristics",
                   "torch._inductor.runtime.triton_helpers", "torch._inductor.runtime.hints")


def warm_inductor(device: str) -> None:
    """Import what a wrapper will import and, on CPU, run Inductor's vector-ISA probe (about a second of
    test compiles, cached for the process): still no wrapper code in this process."""
    import importlib

    names = _WRAPPER_IMPORTS + (_TRITON_IMPORTS + ("tilesmith.gate.worker.trees",) if device.startswith("cuda") else ())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # absent in this torch version: the wrapper that needs it says so when loaded
            pass
    if not device.startswith("cuda"):
        try:
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
        except Exception:
            pass


def warm_device(device: str) -> None:
    """Create the CUDA context now (a second or so), so a worker started early has it before its candidate
    arrives; still a fresh context: no wrapper code has run in this process."""
    if device.startswith("cuda") and torch.cuda.is_available():
        try:
            torch.empty(1, device=device)
            torch.cuda.synchronize(device)
        except Exception:  # the first real request reports any CUDA problem with its reason
            pass
