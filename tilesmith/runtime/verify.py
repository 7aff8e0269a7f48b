"""TILESMITH_VERIFY=N: the first N calls of every substituted graph also run Inductor's own code.

The gate proves an artifact on the captured inputs and on input sets it draws; it cannot see the
program's later calls (the README says what no test of a candidate can rule out). A skeptic can have
the program itself check: with TILESMITH_VERIFY=N each substituted graph's first N calls run
Inductor's original wrapper on the program's real inputs and hand the program the original's outputs
(and its in-place updates, on the program's tensors), then run the artifact on the same values (the
inputs the graph updates in place: copies taken before the call; the RNG state as the original had it)
and compare: outputs and updated inputs with the gate's dtype tolerances, and every other input
unchanged (a float64 sum of each, before and after). A difference beyond tolerance, an exception in
the artifact, or an input it should not have touched: the graph uses Inductor's code from then on, with
the same one-line warning as any other fallback (TILESMITH_RUNTIME_STRICT=1 raises instead). A difference
within 2 % only (a sum reordered past the fixed tolerance, which the gate judges against a float64
reference) is counted, not acted on.

Cost while verifying: both wrappers per call and the copies; after the N calls, one Python call per
graph call. Calls made while a CUDA stream captures (reduce-overhead recording a graph) pass straight
through. Verifying N calls of an artifact that replays CUDA graphs spends some of its re-record budget
on the copies' addresses.
"""

from __future__ import annotations

import logging
import os

import torch


def calls_wanted() -> int:
    """TILESMITH_VERIFY: how many calls of each substituted graph to verify (0: none)."""
    v = os.environ.get("TILESMITH_VERIFY", "").strip()
    try:
        return max(0, int(v)) if v else 0
    except ValueError:
        if v not in _warned:
            _warned.add(v)
            logging.getLogger("tilesmith.runtime").warning(
                "tilesmith: TILESMITH_VERIFY=%r is not a number of calls; verifying none (set it to e.g. 3)", v)
        return 0


_warned: set = set()


class Verified:
    """`call(args)` of an artifact whose first `left` calls are checked against Inductor's `original`."""

    def __init__(self, fn, original, key: str, left: int, mutated, on_fail):
        self.fn, self.original, self.key, self.left = fn, original, key, left
        self.mutated = set(mutated or ())
        self.on_fail = on_fail  # (key, reason) -> None: the runtime's fallback (warning, stats, strict)
        self.verified = 0
        self.near = 0  # calls that differed only within the precision band
        self.failed = ""

    def __call__(self, args):
        if self.left <= 0:
            return self.fn(args)
        real = list(args)
        if type(args) is list:
            args.clear()  # the wrapper ABI: the callee owns the list
        if _capturing(real):
            return self.fn(real)
        self.left -= 1
        side = [x.clone() if i in self.mutated and isinstance(x, torch.Tensor) else x for i, x in enumerate(real)]
        sums = {i: _digest(x) for i, x in enumerate(real) if i not in self.mutated and isinstance(x, torch.Tensor)}
        rng0 = _rng_state(real)
        want = self.original(list(real))  # what the program gets, on its own tensors
        rng1 = _rng_state(real)
        _set_rng_state(rng0)
        try:
            got = self.fn(list(side))
            why = self._compare(got, want, real, side, sums)
        except Exception as e:  # noqa: BLE001 - an artifact that raises is a failed check, never the program's error
            why = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        _set_rng_state(rng1)
        if why:
            self.failed, self.left, self.fn = why, 0, self.original
            self.on_fail(self.key, f"call {self.verified + 1} checked against Inductor's code: {why}")
        else:
            self.verified += 1
        return want

    def _compare(self, got, want, real: list, side: list, sums: dict) -> str:
        from tilesmith.gate.correctness import compare_values

        got = list(got) if isinstance(got, (list, tuple)) else [got]
        want_l = list(want) if isinstance(want, (list, tuple)) else [want]
        if len(got) != len(want_l):
            return f"{len(got)} outputs where Inductor's code returns {len(want_l)}"
        pairs = [(f"output {k}", g, w) for k, (g, w) in enumerate(zip(got, want_l))]
        pairs += [(f"input {i} after the call", side[i], real[i]) for i in sorted(self.mutated) if i < len(real)]
        near = False
        for what, g, w in pairs:
            if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and g.device != w.device:
                return f"{what} on {g.device}, Inductor's on {w.device}"
            v = compare_values(g, w)
            if not v.ok:
                if v.why == "precision":
                    near = True
                    continue
                return f"{what} differs (max abs error {v.abs_error:.3g}, allowed {v.allowed:.3g})"
        for i, before in sums.items():
            if not _same_digest(before, _digest(real[i])):
                return f"input {i} changed, which the graph does not update"
        self.near += near
        return ""

    def describe(self) -> dict:
        return {"verified_calls": self.verified, "within_precision_band": self.near, "failed": self.failed}


def _capturing(real: list) -> bool:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in real) and torch.cuda.is_current_stream_capturing()


def _digest(x: torch.Tensor) -> float:
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    return float(x.sum(dtype=torch.float64)) if x.numel() else 0.0


def _same_digest(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN sums stay NaN


def _rng_state(real: list) -> dict:
    st = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for d in {x.device for x in real if isinstance(x, torch.Tensor) and x.is_cuda}:
            st[d] = torch.cuda.get_rng_state(d)
    return st


def _set_rng_state(st: dict) -> None:
    for d, s in st.items():
        if d == "cpu":
            torch.set_rng_state(s)
        else:
            torch.cuda.set_rng_state(s, d)
