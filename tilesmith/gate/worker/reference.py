"""A float64 reference: re-run the FX program kept in the wrapper's header with every float in float64.

Inductor wrappers are dtype-specific (their kernels are typed), so the original cannot be fed float64.
The header is the post-grad FX program as `print_readable` wrote it: Python that calls torch.ops.*.
Every floating dtype in it is rewritten to float64 (so fp32 accumulation and bf16 round trips become
exact-ish), inputs and constants are upcast, and the outputs are the reference. Runs only in the
trusted reference worker; a program that does not re-run raises and the gate compares against the
original alone.
"""

from __future__ import annotations

import math
import re

import torch

from tilesmith import source

_FLOAT_DTYPES = re.compile(r"torch\.(float32|float16|bfloat16|half|float|float8_\w+)\b")


def fx_program_source(wrapper_text: str) -> str:
    fx, _ = source.split_header(wrapper_text)
    if not fx.strip():
        raise ValueError("the wrapper has no FX program header")
    fx = re.sub(r"^class [^(\n]+\(", "class FxProgram(", fx, count=1, flags=re.M)  # <lambda>, GraphModule
    return _FLOAT_DTYPES.sub("torch.float64", fx)


def run_fx_float64(wrapper_text: str, constants: dict, inputs: list) -> list:
    """Outputs of the FX program on `inputs`, every float upcast to float64 (CPU tensors)."""
    src = fx_program_source(wrapper_text)
    ns = {"torch": torch, "device": torch.device, "inf": math.inf, "nan": math.nan, "math": math,
          "operator": __import__("operator")}
    exec(compile(src, "<fx-program>", "exec"), ns)
    cls = ns.get("FxProgram")
    if cls is None:
        raise ValueError("no FX program class in the header")
    prog = cls.__new__(cls)
    torch.nn.Module.__init__(prog)
    for k, v in constants.items():
        object.__setattr__(prog, k, _up(v))
    with torch.no_grad():
        out = prog.forward(*[_up(x) for x in inputs])
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    return [o.detach().to("cpu") if isinstance(o, torch.Tensor) else o for o in out]


def _up(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        return x.to(torch.float64) if x.dtype.is_floating_point else x.clone()
    return x
