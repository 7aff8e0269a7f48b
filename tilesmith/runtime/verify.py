"""TILESMITH_VERIFY=N: the first N calls of every substituted graph also run Inductor's own code.

The gate proves an artifact on the captured inputs and on input sets it draws; it cannot see the
program's later calls (the README says what no test of a candidate can rule out). A skeptic can have
the program itself check: with TILESMITH_VERIFY=N each substituted graph's first N calls run
Inductor's original wrapper on the program's real inputs and hand the program the original's outputs
and in-place updates, then run the artifact on copies of those inputs taken before the call (the RNG
state as the original had it) and compare: outputs (values within the gate's dtype tolerances with
VERIFY_SLACK to spare, shapes, strides) and the inputs the graph updates in place. Copies of every
input: Inductor's own code may reuse an input's memory (a backward's saved activations), so neither
wrapper may see what the other left. Every input Inductor's call left unchanged must be unchanged after
the artifact's too (a float64 sum of each, before and after). Above VERIFY_COPY_BYTES of inputs, the inputs
Inductor marks static (weights, buffers the graph does not update) are shared instead of copied: an
artifact that writes one is caught, but its write stays.

A failed check (a difference, an exception in the artifact, a static input written): the graph uses
Inductor's code from then on (through tilesmith's CUDA-graph replay where Inductor's own CUDA graphs were
switched off for the artifact, which replays itself), with the same one-line warning as any other fallback
(TILESMITH_RUNTIME_STRICT=1 raises instead, after Inductor's call has updated the program's tensors). A
difference within the gate's fixed tolerances' slack but not within the tolerances themselves (a sum
reordered, which the gate judges against a float64 reference) is counted, not acted on. A call whose check
runs out of memory is passed, not held against the artifact.

Cost while verifying: both wrappers per call and the copies; after the N calls, one Python call per
graph call. Calls made while a CUDA stream captures (reduce-overhead recording its graph) pass straight
through, so under reduce-overhead only its warm-up calls are checked. The CPU RNG state is saved and
restored around the artifact's run: a program drawing random numbers on another thread meanwhile would
see that.
"""

from __future__ import annotations

import logging

import torch

from tilesmith import settings

VERIFY_SLACK = 8.0  # a verified output may differ by this multiple of the gate's fixed tolerance
VERIFY_COPY_BYTES = 1 << 30  # inputs copied whole up to this; above it static inputs are shared


def calls_wanted() -> int:
    """TILESMITH_VERIFY: how many calls of each substituted graph to verify (0: none)."""
    v = settings.current().verify
    try:
        return max(0, int(v)) if v else 0
    except ValueError:
        if v not in _warned:
            _warned.add(v)
            logging.getLogger("tilesmith.runtime").warning(
                "tilesmith: TILESMITH_VERIFY=%r is not a number of calls; verifying none (set it to e.g. 3)", v)
        return 0


_warned: set = set()


def wrap(call, inductors, key: str, graph, static, graphs_off: bool, on_fail):
    """`call` (an installed artifact's) wrapped for TILESMITH_VERIFY, or `call` itself: not asked, or this torch
    does not say which inputs the graph updates (then both wrappers cannot run on the same values).
    graphs_off: Inductor's own CUDA graphs were switched off for this graph (the artifact replays itself),
    so after a failed check Inductor's code runs through tilesmith's replay instead."""
    n = calls_wanted()
    if not n:
        return call
    mutated = getattr(graph, "mutated_input_idxs", None)
    if mutated is None:
        logging.getLogger("tilesmith.runtime").warning(
            "tilesmith: %s: TILESMITH_VERIFY: this torch does not say which inputs the graph updates; not verified",
            key[:12])
        return call
    fallback = None
    if graphs_off:
        from tilesmith.replay.graphed import graphed

        fallback = graphed(inductors)
        fallback.static_hint = getattr(call, "static_hint", frozenset())
    return Verified(call, inductors, key, n, mutated, static, on_fail, fallback)


class Verified:
    """`call(args)` of an artifact whose first `left` calls are checked against Inductor's `original`.
    mutated: input positions the graph updates in place; static: those Inductor marks static; fallback:
    what runs after a failed check; on_fail(key, reason): the runtime's warning (or strict error)."""

    def __init__(self, fn, original, key: str, left: int, mutated, static, on_fail, fallback=None):
        self.fn, self.original, self.key, self.left = fn, original, key, left
        self.mutated, self.static = set(mutated), set(static or ())
        self.on_fail, self.fallback = on_fail, fallback if fallback is not None else original
        self.verified = self.near = self.skipped = 0
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
        try:
            side = self._copies(real)
        except torch.cuda.OutOfMemoryError:
            self.skipped += 1
            return self.fn(real)
        pre = {i: _digest(x) for i, x in enumerate(real) if isinstance(x, torch.Tensor)}
        rng0 = _rng_state(real)
        want = self.original(list(real))  # what the program gets, on its own tensors
        rng1 = _rng_state(real)
        # Inputs Inductor's call left as they were must be left so by the artifact too; those it changed are
        # the ones it updates (compared below) or memory it reused (a backward's saved activations).
        sums = {i: d for i, d in pre.items() if i not in self.mutated and _same_digest(d, _digest(real[i]))}
        _set_rng_state(rng0)
        try:
            got = self.fn(list(side))
            why = self._compare(got, want, real, side, sums)
        except torch.cuda.OutOfMemoryError:
            why = None  # not the artifact's fault: this call goes unchecked
        except Exception as e:  # noqa: BLE001 - an artifact that raises is a failed check, never the program's error
            why = f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        finally:
            _set_rng_state(rng1)
        del side
        if why is None:
            self.skipped += 1
        elif why:
            self.failed, self.left, self.fn = why, 0, self.fallback
            self.on_fail(self.key, f"call {self.verified + 1} checked against Inductor's code: {why}")
        else:
            self.verified += 1
        return want

    def _copies(self, real: list) -> list:
        """The artifact's arguments: copies taken before Inductor's call (static inputs shared above
        VERIFY_COPY_BYTES)."""
        tensors = [i for i, x in enumerate(real) if isinstance(x, torch.Tensor)]
        total = sum(real[i].untyped_storage().nbytes() for i in tensors)
        shared = set() if total <= VERIFY_COPY_BYTES else {i for i in tensors if i in self.static and i not in self.mutated}
        return [x.clone() if isinstance(x, torch.Tensor) and i not in shared else x for i, x in enumerate(real)]

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
            if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor):
                if g.device != w.device:
                    return f"{what} on {g.device}, Inductor's on {w.device}"
                if g.shape == w.shape and g.stride() != w.stride():
                    return f"{what} has strides {tuple(g.stride())}, Inductor's {tuple(w.stride())}"
            v = compare_values(g, w, slack=VERIFY_SLACK)
            if not v.ok:
                return f"{what} differs (max abs error {v.abs_error:.3g}, allowed {v.allowed:.3g})"
            near = near or not compare_values(g, w).ok
        for i, before in sums.items():
            if not _same_digest(before, _digest(side[i])):  # side[i] is real[i] where it is shared
                return f"input {i} changed, which the graph does not update"
        self.near += near
        return ""

    def describe(self) -> dict:
        return {"verified_calls": self.verified, "within_slack": self.near, "unchecked_out_of_memory": self.skipped,
                "failed": self.failed}


def _capturing(real: list) -> bool:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return False
    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in real):
        return torch.cuda.is_current_stream_capturing()
    return False


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
        devs = {x.device for x in real if isinstance(x, torch.Tensor) and x.is_cuda}
        devs.add(torch.device("cuda", torch.cuda.current_device()))
        for d in devs:
            st[d] = torch.cuda.get_rng_state(d)
    return st


def _set_rng_state(st: dict) -> None:
    for d, s in st.items():
        if d == "cpu":
            torch.set_rng_state(s)
        else:
            torch.cuda.set_rng_state(s, d)
