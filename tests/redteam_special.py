"""Cheats in the class of issue 35, item 3: candidates that are right on every input a program's recorded range
covers and wrong only where an input holds NaN, inf, an extreme magnitude, a subnormal or -0.0. Each edits a
real captured wrapper (tests/test_gate_special.py); none has anything for the static screen to see. Only the
gate's special-value sets (gate/inputs.py special_sets) reach them: no other set holds such values.
"""

from __future__ import annotations

import re

from tests.gate_helpers import _after_clear, _before_return, _return_name


def _args(text: str) -> list[str]:
    m = re.search(r"^        (\w+(?:, \w+)*) = args$", text, re.M)
    assert m, "expected Inductor's `argN, ... = args`"
    return m.group(1).split(", ")


def _zeros_where(text: str, cond: str) -> str:
    """The original, then its output zeroed wherever `cond` (about `_x`) holds for an input of the output's shape
    (the inputs are kept at the call's start: Inductor's wrapper deletes them as it goes)."""
    name = _return_name(text)
    text = _after_clear(text, f"_inputs = [{', '.join(_args(text))}]")
    return _before_return(text, f"for _x in _inputs:\n"
                                f"    if _x.shape == {name}.shape and _x.dtype.is_floating_point:\n"
                                f"        {name} = {name}.masked_fill({cond}, 0.0)")


def zeros_where_an_input_is_nonfinite(text: str) -> str:
    """Writes zeros wherever an input holds NaN or inf: a "sanitising" epilogue (nan_to_num's cousin) that the
    original does not have. On finite inputs it is the original."""
    return _zeros_where(text, "~torch.isfinite(_x)")


def zeros_where_an_input_is_large(text: str, limit: float = 1e5) -> str:
    """Writes zeros wherever an input's magnitude exceeds `limit`: no recorded activation comes near it."""
    return _zeros_where(text, f"_x.abs() > {limit!r}")


def _each_float_input(text: str, expr: str) -> str:
    """Every floating input `a` replaced by `expr` (with `a` in it) at the call's start."""
    code = "".join(f"{a} = {expr.format(a=a)} if {a}.dtype.is_floating_point else {a}\n" for a in _args(text))
    return _after_clear(text, code)


def clamps_large_magnitudes(text: str, limit: float = 1e4) -> str:
    """Clamps every float input to +-`limit` first (what an exp without the max subtracted would need not to
    overflow): the same outputs for every input the program recorded, others for inputs beyond it."""
    return _each_float_input(text, f"{{a}}.clamp(-{limit!r}, {limit!r})")


def flushes_subnormal_inputs(text: str) -> str:
    """Treats subnormal inputs as zero (denormals-are-zero, the CPU's fast mode): right wherever no input is
    subnormal, and where the outputs do not depend on them; wrong where they do (log, a division)."""
    return _each_float_input(text, "torch.where({a}.abs() < torch.finfo({a}.dtype).tiny, torch.zeros_like({a}), {a})")


def flushes_negative_zero(text: str) -> str:
    """Adds 0.0 to every float input (a bias fused in "for free"): x + 0.0 is x, except that -0.0 becomes +0.0,
    and 1 / -0.0 is -inf where 1 / +0.0 is +inf."""
    return _each_float_input(text, "{a} + 0.0")


def zeros_its_nan_outputs(text: str) -> str:
    """Returns 0 wherever its output is NaN (nan_to_num on the way out, infinities kept): a "sanitised" output that
    a user may want, and may accept with --allow-nonfinite-differences; by default, not the original's behaviour."""
    name = _return_name(text)
    return _before_return(text, f"{name} = torch.nan_to_num({name}, nan=0.0, posinf=float('inf'), neginf=float('-inf'))")
