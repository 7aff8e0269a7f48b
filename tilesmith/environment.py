"""The stack fingerprint: everything outside the wrapper source that decides what its code computes
and how fast. It is half of every graph key, so an artifact only serves the stack it was proven on."""

from __future__ import annotations

import hashlib
import json
import platform


def fingerprint() -> dict:
    """Describe this process's stack: torch, triton, CUDA runtime and driver, GPU, numerics flags.

    Imports torch (the caller already has it loaded: capture, runtime and workers all run torch code).
    """
    import torch

    fp: dict = {
        "torch": torch.__version__,
        "triton": triton_version(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cuda_runtime": torch.version.cuda,
        "cuda_driver": None,
        "gpu": None,
        "gpu_capability": None,
        "numerics": numerics_flags(torch),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        fp["gpu"] = props.name
        fp["gpu_capability"] = f"{props.major}.{props.minor}"
        driver = getattr(torch._C, "_cuda_getDriverVersion", None)
        fp["cuda_driver"] = driver() if driver else None
    return fp


def triton_version() -> str | None:
    """The installed triton's version, None where there is none (CPU builds of torch) or it does not say."""
    try:
        import triton  # noqa: PLC0415 - optional: CPU builds of torch have no triton
    except Exception:
        return None
    return getattr(triton, "__version__", None)


def numerics_flags(torch) -> dict:
    """Flags that change results of the same kernels (TF32, reduced-precision reductions, determinism)."""
    matmul = torch.backends.cuda.matmul
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": bool(matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "fp16_reduced_precision_reduction": bool(matmul.allow_fp16_reduced_precision_reduction),
        "bf16_reduced_precision_reduction": bool(matmul.allow_bf16_reduced_precision_reduction),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
    }


def fingerprint_id(fp: dict) -> str:
    """A short stable id of a fingerprint (16 hex), for tables and manifests."""
    return hashlib.sha256(canonical_json(fp).encode()).hexdigest()[:16]


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def describe(fp: dict) -> str:
    """One line a human can read: 'torch 2.13.0+cpu, cpu x86_64' or 'torch 2.11.0, triton 3.6.0, NVIDIA H200 (9.0)'."""
    parts = [f"torch {fp.get('torch')}"]
    if fp.get("triton"):
        parts.append(f"triton {fp['triton']}")
    parts.append(f"{fp['gpu']} ({fp['gpu_capability']})" if fp.get("gpu") else f"cpu {fp.get('machine')}")
    return ", ".join(parts)
