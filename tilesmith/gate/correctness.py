"""Stage 2 comparisons, in the deciding process only: raw outputs of the original and of the candidate
(each from its own worker) against each other and, where available, against a float64 reference."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tilesmith.gate.verdict import Reason, SetCorrectness

_EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23, torch.float64: 2.0**-52}
# Against the original directly, (rtol, atol as a fraction of the output's largest magnitude). fp32 is
# tight enough that computing in bf16/fp16/tf32 (errors ~1e-3..1e-2 relative) fails here already.
_TOL = {torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2), torch.float32: (2e-5, 2e-5),
        torch.float64: (1e-10, 1e-10)}
REF64_FACTOR = 4.0  # the candidate's float64 error may be this multiple of the original's, plus a floor
REF64_RMS_FACTOR = 2.0  # half-precision outputs: RMS error multiple (bf16 accumulation: 2-6x; fp32 accumulation: ~1x)
REF64_FLOOR_EPS = 1.0  # floor: epsilons of the output dtype times the output magnitude (rounding the output)
PRECISION_BAND = 2e-2  # a failing output within this relative error of the original counts as lower precision


@dataclass
class ValueCheck:
    ok: bool
    abs_error: float = 0.0
    rel_error: float = 0.0
    allowed: float = 0.0
    ref_cand: float | None = None
    ref_orig: float | None = None
    why: str = ""  # "" | "nonfinite" | "values" | "precision"
    # which test decided, for the reason text: "tolerance" (against the original, dtype rtol/atol),
    # "ref64-max" (worst element against the float64 reference), "ref64-rms" (RMS against it, half precision)
    test: str = "tolerance"
    rms_cand: float | None = None
    rms_orig: float | None = None
    rms_allowed: float | None = None
    dtype: str = ""
    nonfinite: int = 0  # elements whose NaN/+inf/-inf placement differs from the original's
    bad: int = 0  # finite elements outside tolerance (special-value sets: compared element by element)
    where: str = ""  # the first such element and the counts, for the reason's sentence


def compare_values(cand, orig, ref=None, slack: float = 1.0) -> ValueCheck:
    """One output (or input-after) value: exact for non-floats; dtype tolerances (times `slack`); float64
    calibration."""
    if not isinstance(orig, torch.Tensor) or not isinstance(cand, torch.Tensor):
        return ValueCheck(cand == orig if not isinstance(cand, torch.Tensor) else False, why="values")
    if cand.shape != orig.shape or cand.dtype != orig.dtype:
        return ValueCheck(False, why="values")
    if not orig.dtype.is_floating_point:
        if torch.equal(cand, orig):
            return ValueCheck(True)
        worst = float((cand.to(torch.float64) - orig.to(torch.float64)).abs().max()) if orig.numel() else 0.0
        return ValueCheck(False, worst, why="values")
    # Half-precision values are exact in float32, and their tolerances (1e-3..1e-2) are far above float32's
    # rounding of a difference: compared in float32 (half the memory traffic of float64; a 35 M-element
    # bfloat16 gradient set took ~2 s here). Wider types in float64.
    if not orig.numel():
        return ValueCheck(True)
    work = torch.float32 if orig.dtype in (torch.float16, torch.bfloat16) else torch.float64
    c, o = cand.to(work), orig.to(work)
    fin = None
    if not (bool(torch.isfinite(c).all()) and bool(torch.isfinite(o).all())):  # the usual case skips all this
        n, where = nonfinite_placement(c, o)
        if n:
            return ValueCheck(False, float("inf"), float("inf"), why="nonfinite", nonfinite=n, where=where)
        fin = torch.isfinite(o)
        if not bool(fin.any()):
            return ValueCheck(True)
        c, o = c[fin], o[fin]
    diff = torch.sub(c, o).abs_()
    allowed = o.abs()
    scale = max(float(allowed.max()), 1e-30)
    rtol, atol = (slack * t for t in _TOL.get(orig.dtype, (1e-3, 1e-3)))
    allowed.mul_(rtol).add_(atol * scale)  # rtol * |o| + atol * scale, in place
    worst = float(diff.max())
    res = ValueCheck(bool((diff <= allowed).all()), worst, worst / scale,
                     float(allowed.max()), dtype=str(orig.dtype).removeprefix("torch."))
    del diff, allowed
    if ref is not None and isinstance(ref, torch.Tensor) and ref.shape == orig.shape:
        _calibrate(res, c, o, ref if fin is None else ref[fin], orig.dtype)
    if not res.ok:
        # Close to the original yet outside tolerance: the signature of computing in lower precision.
        band = max(PRECISION_BAND, 16 * _EPS.get(orig.dtype, 0.0))
        res.why = "precision" if res.rel_error < band else "values"
    return res


def nonfinite_placement(c: torch.Tensor, o: torch.Tensor) -> tuple[int, str]:
    """(elements where NaN, +inf or -inf in `c` is not where it is in `o`, a phrase saying where and how many)."""
    kinds = lambda t: (t.isnan(), t == math.inf, t == -math.inf)  # noqa: E731
    differ = torch.zeros(o.shape, dtype=torch.bool)
    for a, b in zip(kinds(c), kinds(o)):
        differ |= a ^ b
    n = int(differ.sum())
    if not n:
        return 0, ""
    i = int(differ.flatten().nonzero()[0])
    count = lambda t: "{} NaN, {} +inf, {} -inf".format(*(int(k.sum()) for k in kinds(t)))  # noqa: E731
    return n, (f"{n} of {o.numel()} elements, first at index {_index(i, o.shape)} (candidate "
               f"{float(c.flatten()[i]):.3g}, original {float(o.flatten()[i]):.3g}); the original has {count(o)}, "
               f"the candidate {count(c)}")


def _index(flat_i: int, shape) -> tuple:
    return tuple(int(k) for k in torch.unravel_index(torch.tensor(flat_i), tuple(shape))) if len(shape) else ()


def _calibrate(res: ValueCheck, c, o, ref, dtype) -> None:
    """With a float64 reference the tolerance is calibrated: the candidate may be a few times less accurate
    than the original (reordered sums), never an order of magnitude (lower precision). This replaces the
    fixed tolerance in `res`, which is wrong where the original itself is inexact (high-magnitude inputs,
    cancellation). c, o, ref: the finite elements compared."""
    c, o, r = c.to(torch.float64), o.to(torch.float64), ref.to(torch.float64)
    rscale = max(float(r.abs().max()), 1e-30)
    res.ref_cand = float((c - r).abs().max())
    res.ref_orig = float((o - r).abs().max())
    floor = REF64_FLOOR_EPS * _EPS.get(dtype, 1e-3) * rscale
    res.allowed = REF64_FACTOR * res.ref_orig + floor
    res.ok = res.ref_cand <= res.allowed
    res.test = "ref64-max"
    if dtype in (torch.float16, torch.bfloat16):
        # Half-precision outputs: the original's error is mostly the final rounding, so the worst element
        # barely moves when a candidate accumulates in bf16; the RMS error does (2-6x). (For fp32 outputs an
        # RMS ratio is noisy where only a few elements carry error, and a precision downgrade is 1000x off.)
        rms_c = float((c - r).square().mean().sqrt())
        rms_o = float((o - r).square().mean().sqrt())
        res.rms_cand, res.rms_orig, res.rms_allowed = rms_c, rms_o, REF64_RMS_FACTOR * rms_o + floor / 20
        if res.ok and rms_c > res.rms_allowed:
            res.ok, res.test = False, "ref64-rms"


@dataclass
class SetResult:
    summary: SetCorrectness
    reasons: list[Reason] = field(default_factory=list)
    warnings: list[Reason] = field(default_factory=list)


@dataclass
class Special:
    """How a special-value set (gate/inputs.py special_sets) is compared: compare_special's scale per output,
    and whether NaN/inf may be placed unlike the original's (Policy.allow_nonfinite_differences)."""

    scales: list[float]
    allow_nonfinite: bool = False


def compare_set(name: str, cand: dict, orig: dict, ref: list | None, special: Special | None = None) -> SetResult:
    """Outputs (count, layout, aliasing, values) and inputs after the call, for one input set; a special-value
    set's outputs by compare_special."""
    reasons: list[Reason] = []
    co, oo = cand["outputs"], orig["outputs"]
    summary = SetCorrectness(name=name, ok=True)
    if len(co) != len(oo):
        reasons.append(Reason("output-count", f"set {name}: {len(co)} outputs, the original returns {len(oo)}"))
        return _done(summary, reasons)
    for i, (cl, ol) in enumerate(zip(cand["layouts"], orig["layouts"])):
        r = _layout_reason(name, i, cl, ol)
        if r:
            reasons.append(r)
    if reasons:
        return _done(summary, reasons)
    allowed: list[tuple[int, str]] = []  # (output, where) NaN/inf differ, with Special.allow_nonfinite
    for i, (c, o) in enumerate(zip(co, oo)):
        r = ref[i] if ref is not None and i < len(ref) else None
        if special is None:
            v = compare_values(c, o, r)
        else:
            v = compare_special(c, o, r, special.scales[i] if i < len(special.scales) else 0.0, special.allow_nonfinite)
        summary.nonfinite_mismatches += v.nonfinite
        if v.ok and v.nonfinite:
            allowed.append((i, v.where))
        summary.max_abs_error = max(summary.max_abs_error, v.abs_error)
        summary.max_rel_error = max(summary.max_rel_error, v.rel_error)
        if v.ref_cand is not None:
            summary.ref64_candidate_abs_error = max(summary.ref64_candidate_abs_error or 0.0, v.ref_cand)
            summary.ref64_original_abs_error = max(summary.ref64_original_abs_error or 0.0, v.ref_orig)
        if not v.ok:
            reasons.append(_value_reason(name, f"output {i}", v))
    for i, (c, o) in enumerate(zip(cand["inputs_after"], orig["inputs_after"])):
        v = compare_values(c, o)
        if not v.ok:
            reasons.append(Reason("input-mutated", f"set {name}: input {i} after the call differs from the "
                                                   f"original's (max abs difference {v.abs_error:.3g})"))
    res = _done(summary, reasons)
    if allowed:  # one warning a set: a training graph has dozens of outputs
        i, where = allowed[0]
        more = f" (and {len(allowed) - 1} more outputs)" if len(allowed) > 1 else ""
        res.warnings = [Reason("nonfinite-differences-allowed", f"set {name}: output {i}{more} places NaN/inf unlike "
                                                                f"the original at {where}")]
    return res


# The temporaries of comparing sets side by side stay under this (counted as six float64 values per output
# element: an upper bound since half-precision outputs are compared in float32).
COMPARE_BYTES = 4 << 30


def compare_sets(names: list[str], cands: list, origs: list, refs, special: Special | None = None) -> list[SetResult]:
    """compare_set for every set, in the sets' order, side by side on the deciding process's threads (pure
    tensor comparisons; a training graph's gradients took ~9 s a pass one after another on the H200):
    as many at once as their temporaries fit in COMPARE_BYTES."""
    from tilesmith.gate.inputs import thread_pool

    side = max(1, min(len(names), COMPARE_BYTES // max(1, 48 * _numel(cands[0]))))
    one = lambda k: compare_set(names[k], cands[k], origs[k], refs[k] if refs else None, special)  # noqa: E731
    results: list[SetResult] = []
    for start in range(0, len(names), side):
        results += thread_pool().map(one, range(start, min(start + side, len(names))))
    return results


# -- the special-value sets -------------------------------------------------------------------------------------


def typical_scales(orig_sets: list) -> list[float]:
    """Per output, the largest finite magnitude of the original's outputs on the given ordinary sets (the
    captured set and the first random one): the scale of compare_special's absolute tolerance. A special
    set's own largest output (1e30 where an input was 1e30) would excuse any error in the rest of it."""
    scales: list[float] = []
    for outs in (s["outputs"] for s in orig_sets):
        for i, o in enumerate(outs):
            m = 0.0
            if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.numel():
                m = float(o.abs().max())
                if not math.isfinite(m):
                    fin = o[torch.isfinite(o)]
                    m = float(fin.abs().max()) if fin.numel() else 0.0
            scales += [0.0] * (i + 1 - len(scales))
            scales[i] = max(scales[i], m)
    return scales


def compare_special(cand, orig, ref=None, scale: float = 0.0, allow_nonfinite: bool = False) -> ValueCheck:
    """One output on a special-value set. NaN, +inf and -inf exactly where the original has them (the
    original's overflows and NaN from extreme inputs included: that is its behaviour), unless
    `allow_nonfinite`. The elements finite in both, one by one: within rtol * |original| + atol * s (the
    dtype's tolerances), s the larger of `scale` (the output's magnitude on ordinary inputs) and the largest
    finite magnitude in the element's row (its last dimension: what a matmul, LayerNorm or softmax computes
    from one input row), so that a 1e30 excuses rounding in its own row and no error elsewhere; or, with the
    float64 reference, no further from it than REF64_FACTOR times the original plus one rounding."""
    if not (isinstance(cand, torch.Tensor) and isinstance(orig, torch.Tensor)) or cand.shape != orig.shape \
            or cand.dtype != orig.dtype or not orig.dtype.is_floating_point or not orig.numel():
        return compare_values(cand, orig)
    work = torch.float32 if orig.dtype in (torch.float16, torch.bfloat16) else torch.float64
    c, o = cand.to(work), orig.to(work)
    res = ValueCheck(True, dtype=str(orig.dtype).removeprefix("torch."))
    res.nonfinite, res.where = nonfinite_placement(c, o)
    if res.nonfinite and not allow_nonfinite:
        res.ok, res.why, res.abs_error, res.rel_error = False, "nonfinite", math.inf, math.inf
        return res
    fin = torch.isfinite(c) & torch.isfinite(o)
    if not bool(fin.any()):
        return res
    mag = torch.where(fin, o.abs(), torch.zeros((), dtype=work))
    rows = mag.amax(dim=-1, keepdim=True).expand_as(mag) if mag.dim() else mag
    s = rows[fin].clamp_min(max(scale, 1e-30))  # per finite element
    c, o = c[fin], o[fin]
    rtol, atol = _TOL.get(orig.dtype, (1e-3, 1e-3))
    diff = torch.sub(c, o).abs_()
    allowed = o.abs().mul_(rtol).add_(s * atol)
    bad = diff > allowed
    if bool(bad.any()) and isinstance(ref, torch.Tensor) and ref.shape == orig.shape:
        r = ref.to(torch.float64)[fin][bad]
        cb, ob = c[bad].to(torch.float64), o[bad].to(torch.float64)
        near = (cb - r).abs() <= REF64_FACTOR * (ob - r).abs() + _EPS.get(orig.dtype, 1e-3) * r.abs()
        bad[bad.clone()] = ~near
    res.abs_error = float(diff.max())
    res.rel_error = float((diff / s).max())
    res.bad = int(bad.sum())
    if res.bad:
        j = int(torch.where(bad, diff / allowed, torch.zeros_like(diff)).argmax())
        i = int(fin.flatten().nonzero()[j])
        band = max(PRECISION_BAND, 16 * _EPS.get(orig.dtype, 0.0))  # as compare_values: close, yet outside
        res.why = "precision" if float(diff[j] / s[j]) < band else "values"
        res.ok, res.test, res.allowed = False, "special", float(allowed[j])
        res.where = (f"{res.bad} of {orig.numel()} elements, worst at index {_index(i, orig.shape)} (candidate "
                     f"{float(c[j]):.6g}, original {float(o[j]):.6g}, allowed difference {float(allowed[j]):.3g} = "
                     f"{rtol:g} x |original| + {atol:g} x {float(s[j]):.3g}, the larger of its row's largest "
                     f"magnitude and the output's on ordinary inputs)")
    return res


def _numel(obj) -> int:
    """Elements of every tensor in a (nested) output set."""
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(_numel(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_numel(v) for v in obj)
    return 0


def _done(summary: SetCorrectness, reasons: list[Reason]) -> SetResult:
    summary.ok = not reasons
    return SetResult(summary, reasons)


def _layout_reason(name: str, i: int, cl: dict, ol: dict) -> Reason | None:
    where = f"set {name}: output {i}"
    if cl.get("type") != ol.get("type"):
        return Reason("output-type", f"{where} is a {cl.get('type')}, the original returns a {ol.get('type')}")
    for key, code in (("dtype", "output-dtype"), ("shape", "output-shape"), ("stride", "output-stride"),
                      ("offset", "output-offset")):
        if cl.get(key) != ol.get(key):
            return Reason(code, f"{where} has {key} {cl.get(key)}, the original {ol.get(key)}")
    if cl.get("alias_inputs") != ol.get("alias_inputs") or cl.get("storage_id") != ol.get("storage_id"):
        return Reason("output-aliasing", f"{where} shares storage with inputs {cl.get('alias_inputs')} / output "
                                         f"#{cl.get('storage_id')}, the original with {ol.get('alias_inputs')} / "
                                         f"#{ol.get('storage_id')}")
    return None


def _value_reason(name: str, what: str, v: ValueCheck) -> Reason:
    """One sentence: which input set, which output, which test, the error against what it was allowed."""
    if v.why == "nonfinite":
        return Reason("nonfinite-mismatch", f"set {name}: {what} places NaN/inf unlike the original at {v.where}")
    if v.test == "special":
        return Reason("precision" if v.why == "precision" else "wrong-values",
                      f"set {name}: {what} differs from the original at {v.where}")
    code = "precision" if v.why == "precision" else "wrong-values"
    if v.test == "ref64-rms":
        return Reason(code, f"set {name}: {what} ({v.dtype}) has RMS error {v.rms_cand:.3g} against the float64 "
                            f"reference, the original {v.rms_orig:.3g} (allowed {v.rms_allowed:.3g} = "
                            f"{REF64_RMS_FACTOR:g}x + rounding floor); worst element {v.ref_cand:.3g} was within its "
                            f"{v.allowed:.3g}; max abs difference from the original {v.abs_error:.3g}")
    if v.test == "ref64-max" and v.why != "precision":
        return Reason(code, f"set {name}: {what} ({v.dtype}) is {v.ref_cand:.3g} from the float64 reference at worst, "
                            f"the original {v.ref_orig:.3g} (allowed {v.allowed:.3g} = {REF64_FACTOR:g}x + rounding "
                            f"floor); max abs difference from the original {v.abs_error:.3g} (relative {v.rel_error:.3g})")
    if v.why == "precision" and v.ref_cand is not None:
        return Reason("precision", f"set {name}: {what} is {v.ref_cand:.3g} from the float64 reference, the "
                                   f"original {v.ref_orig:.3g} (allowed {v.allowed:.3g}): lower precision")
    if v.why == "precision":
        return Reason("precision", f"set {name}: {what} is within {v.rel_error:.2g} (relative) of the original "
                                   f"but outside the {v.allowed:.3g} tolerance: lower precision")
    return Reason("wrong-values", f"set {name}: {what} max abs error {v.abs_error:.3g} (relative "
                                  f"{v.rel_error:.3g}, allowed {v.allowed:.3g})")


def compare_pair(names: tuple[str, str], pair: dict, orig_first: dict, orig_second: dict) -> list[Reason]:
    """Two calls in the same input buffers: the second must see the new values (no pointer-keyed cache),
    and the first call's outputs must survive the second (no reused output buffer)."""
    reasons = []
    first, second = pair.get("first", []), pair.get("second", [])
    if len(first) != len(orig_first["outputs"]) or len(second) != len(orig_second["outputs"]):
        return [Reason("output-count", "the same-buffer calls returned a different number of outputs")]
    for i, (c, o) in enumerate(zip(second, orig_second["outputs"])):
        v = compare_values(c, o)
        if not v.ok:
            reasons.append(Reason("cached-across-calls", f"output {i} of a second call on the same buffers with new "
                                  f"values ({names[1]}) is wrong (max abs error {v.abs_error:.3g}): a result "
                                  "from the first call was reused"))
    for i, (c, o) in enumerate(zip(first, orig_first["outputs"])):
        if orig_first["layouts"][i].get("alias_inputs"):
            continue  # the original returns a view of an input: refilling the input changes it by design
        v = compare_values(c, o)
        if not v.ok:
            reasons.append(Reason("outputs-overwritten", f"output {i} of the first call changed when the second "
                                  f"call ran (max abs error {v.abs_error:.3g}): outputs are reused across calls"))
    return reasons
