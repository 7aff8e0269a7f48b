"""TILESMITH_VERIFY=N: calls of every substituted graph also checked against Inductor's own code, in the program.

The gate proves an artifact on the captured inputs and on input sets it draws; it cannot see the
program's later calls (docs/gate.md says what no test of a candidate can rule out). A skeptic can have
the program itself check: with TILESMITH_VERIFY=N each substituted graph's calls 1..N, and after them call k
with probability N/k (so about N more checks for every factor of e in the program's length, at calls drawn from
the system's entropy), run the artifact exactly as any other call and Inductor's original wrapper on copies of the
inputs taken before it (the RNG state as the artifact had it), and compare: outputs (values within the gate's dtype
tolerances with VERIFY_SLACK to spare, shapes, strides) and the inputs the graph updates in place. The artifact
cannot tell a checked call from another (its inputs are the program's own tensors, as always), nor know how many
there will be. Every input Inductor's call left unchanged must be unchanged after the artifact's too (a float64
sum of each, before and after). Above VERIFY_COPY_BYTES of inputs, the inputs Inductor marks static (weights,
buffers the graph does not update) are shared instead of copied.

A failed check (a difference, an exception in the artifact, an input written that the graph does not update):
the program gets Inductor's results for that call (its tensors set to what Inductor's code left in the copies,
Inductor's outputs), the graph uses Inductor's code from then on (through tilesmith's CUDA-graph replay where
Inductor's own CUDA graphs were switched off for the artifact, which replays itself), the runtime removes the
artifact from the store so later runs never load it, and says so once on stderr (TILESMITH_RUNTIME_STRICT=1 raises
instead). A difference within the gate's fixed tolerances' slack but not within the tolerances themselves (a sum
reordered, which the gate judges against a float64 reference) is counted, not acted on. A call whose check runs
out of memory is passed, not held against the artifact.

Cost of a checked call: Inductor's call and the copies besides the artifact's. Calls made while a CUDA stream
captures (reduce-overhead recording its graph) pass straight through. The CPU RNG state is saved and restored
around Inductor's run: a program drawing random numbers on another thread meanwhile would see that.
"""

from __future__ import annotations

import logging
import random

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
    """`call(args)` of an artifact, some of whose calls are checked against Inductor's `original`: calls
    1..`wanted` and, after them, call k with probability wanted/k (drawn from the system's entropy), so checks go
    on for the program's whole life, ever sparser, at calls the artifact cannot foresee. A checked call runs the
    artifact exactly as any other call (the program's own tensors, the program gets its outputs) and Inductor's
    code on copies taken before it: nothing the artifact sees tells a checked call from another.
    mutated: input positions the graph updates in place; static: those Inductor marks static; fallback:
    what runs after a failed check; on_fail(key, reason): the runtime's warning (or strict error)."""

    def __init__(self, fn, original, key: str, wanted: int, mutated, static, on_fail, fallback=None, draw=None):
        self.fn, self.original, self.key, self.wanted = fn, original, key, wanted
        self.mutated, self.static = set(mutated), set(static or ())
        self.on_fail, self.fallback = on_fail, fallback if fallback is not None else original
        self.draw = draw or random.SystemRandom().random
        self.calls = self.verified = self.near = self.skipped = 0
        self.failed = ""

    def _due(self) -> bool:
        self.calls += 1
        return not self.failed and (self.calls <= self.wanted or self.draw() * self.calls < self.wanted)

    def __call__(self, args):
        if not self._due():
            return self.fn(args)
        real = list(args)
        if type(args) is list:
            args.clear()  # the wrapper ABI: the callee owns the list
        if _capturing(real):
            return self.fn(real)
        try:
            side = self._copies(real)  # what Inductor's code runs on: the values before the call
        except torch.cuda.OutOfMemoryError:
            self.skipped += 1
            return self.fn(real)
        pre = {i: _digest(x) for i, x in enumerate(real) if isinstance(x, torch.Tensor)}
        rng0 = _rng_state(real)
        try:
            got, raised = self.fn(list(real)), ""
        except Exception as e:  # noqa: BLE001 - the artifact's error is a failed check, never the program's
            got, raised = None, f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        rng1 = _rng_state(real)
        _set_rng_state(rng0)
        try:
            want = self.original(list(side))
            why = raised or self._compare(got, want, real, side, pre)
        except torch.cuda.OutOfMemoryError:
            want, why = None, raised or None  # Inductor's call out of memory: unchecked, unless the artifact raised
        finally:
            _set_rng_state(rng1)
        if why is None:
            self.skipped += 1
            return got
        if not why:
            self.verified += 1
            return got
        # The program gets Inductor's results: its tensors as Inductor's code left the copies, its outputs.
        for x, y in zip(real, side):
            if isinstance(x, torch.Tensor) and y is not x:
                x.copy_(y)
        self.failed, self.fn = why, self.fallback
        self.on_fail(self.key, f"call {self.calls} checked against Inductor's code: {why}")
        return want if want is not None else self.fallback(list(real))

    def _copies(self, real: list) -> list:
        """The artifact's arguments: copies taken before Inductor's call (static inputs shared above
        VERIFY_COPY_BYTES)."""
        tensors = [i for i, x in enumerate(real) if isinstance(x, torch.Tensor)]
        total = sum(real[i].untyped_storage().nbytes() for i in tensors)
        shared = set() if total <= VERIFY_COPY_BYTES else {i for i in tensors if i in self.static and i not in self.mutated}
        return [x.clone() if isinstance(x, torch.Tensor) and i not in shared else x for i, x in enumerate(real)]

    def _compare(self, got, want, real: list, side: list, pre: dict) -> str:
        """Why the artifact's call (`got`, on `real`) differs from Inductor's (`want`, on the copies `side`); "" if not."""
        from tilesmith.gate.correctness import compare_values

        got = list(got) if isinstance(got, (list, tuple)) else [got]
        want_l = list(want) if isinstance(want, (list, tuple)) else [want]
        if len(got) != len(want_l):
            return f"{len(got)} outputs where Inductor's code returns {len(want_l)}"
        pairs = [(f"output {k}", g, w) for k, (g, w) in enumerate(zip(got, want_l))]
        pairs += [(f"input {i} after the call", real[i], side[i]) for i in sorted(self.mutated) if i < len(real)]
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
        # Inputs Inductor's call left as they were must be left so by the artifact too; those it changed are the ones
        # it updates (compared above) or memory it reused (a backward's saved activations). A shared static input
        # (side[i] is real[i]) was read by both: it must be unchanged after both.
        for i, before in pre.items():
            if i not in self.mutated and _same_digest(before, _digest(side[i])) and not _same_digest(before, _digest(real[i])):
                return f"input {i} changed, which the graph does not update"
        self.near += near
        return ""

    def describe(self) -> dict:
        return {"calls": self.calls, "verified_calls": self.verified, "within_slack": self.near, "unchecked_out_of_memory": self.skipped,
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
