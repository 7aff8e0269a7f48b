"""Replay a wrapper's launches from a CUDA graph: the remedy for graphs whose time is launch overhead.

A rewritten wrapper (the tuner's `launch-overhead` variant, or an agent's) ends with

    from tilesmith.cudagraph import graphed
    call = graphed(call)

and is judged by the gate like any other candidate: it counts only if it is correct on every input set
and measurably faster in the graph's own timing mode. This is the one tilesmith module a candidate may
import (the static screen flags every other), because it needs what candidates may not touch: CUDA
graph capture, and state that outlives a call.

A lean replay. Per argument layout (the non-tensor arguments; an Inductor wrapper's tensor shapes follow
from them and its own size checks ran at the capture):

* The first call is the plain call: it is the warm-up (autotuning, library handles, workspaces).
* The second call captures one run into a CUDA graph. Every tensor input is read in place (weights,
  buffers, activations that sit at the same address each step): the graph holds their addresses, and
  each later call checks those addresses (one pass over the arguments, in C where tilesmith.replay.native is
  built: `tilesmith install` builds it). Inputs that moved since the capture are
  re-recorded in place once; an input that moves again is copied instead, into a buffer of the
  graph's own, in one `_foreach_copy_` launch per dtype. In-place updates of weights stay visible,
  since the graph reads the caller's tensors. Those buffers are allocated inside the capture, from the
  graph's own memory pool: the caller's allocator is left exactly as it was, so the caller's next
  allocations (a training step's saved activations) land where they did before the capture.
* The last but one capture the budget allows (MAX_RECORDS) copies in every input that has moved so far
  (not those the compiler marks static) and reads the others in place; the last one copies every input in
  and every output out, so nothing the caller does later can make it capture again. (A GPT-2 training
  step on the H200 (benchmarks/RESULTS-history.md): its backward's last capture copied all 113 inputs and every gradient out,
  and the step gained 1.29x where the graph alone had gained 2.9x; with the copied inputs' buffers in the
  graph's pool it settled after 3 captures, 4 inputs copied, no output copied: 1.61x.)
* Outputs are handed out without a copy: fresh tensor objects over the graph's own memory. Before a
  replay overwrites that memory, the storages' reference counts show whether the caller still holds
  any of them. A loop that keeps the last step's output while it makes the next call (`y = model(x)`
  in a loop) is the common case: a second instance of the graph, captured into memory of its own
  takes the calls while the first one's outputs are held, and the two alternate, so no output is
  copied. A caller that holds two calls' outputs at once (the last one and one it keeps for later, as the
  gate keeps a randomly drawn call's outputs for its checks) gets a third instance (ROTATE instances at
  most). A caller that holds the outputs of every instance keeps them across
  calls: those outputs are copied out from then on and the graph is re-recorded around the memory the
  caller holds, which never changes. Outputs that are views of inputs come back as views of the
  caller's inputs.
* Each call runs on the caller's current stream; a call on another stream than the last one first
  waits for the last one's work.
* Captures keep the caching allocator's free blocks (torch.cuda.graph empties its cache first, which
  moves the caller's next allocations, a training step's saved activations among them); only a capture
  that runs out of memory empties the cache, and is made once more.

It makes the plain call instead (the wrapper's own launches, the same results) whenever a graph is not
safe or not possible, and remembers that per layout: tensors not all on one CUDA device, a capture that
would keep more than MAX_GRAPH_BYTES reserved, more than MAX_LAYOUTS layouts, a wrapper that changes an
input that has to be copied, an input with overlapping memory that has to be copied, an output viewing
an input with another dtype, the re-record budget spent, or a capture that failed. Inside the caller's
own CUDA-graph capture it always makes the plain call (the caller's graph records those launches), and
remembers nothing.
"""

from __future__ import annotations

import threading

import torch

from tilesmith.replay import record
from tilesmith.replay.record import _data_ptr, _detach, _same_ptrs, _NotGraphable, _overlapping, _Record

MAX_LAYOUTS = 8  # graphs kept per wrapper; more layouts (dynamic shapes) run plain
MAX_GRAPH_BYTES = record.MAX_GRAPH_BYTES  # what one capture may newly reserve (set and checked there)
MAX_RECORDS = 6  # captures per layout (the first, then re-records); past it the layout runs plain
# Instances of one record, each with its own memory pool, that take turns while the caller holds the
# outputs of the others. A loop holding the last step's output needs two; a third serves a caller that also
# keeps one earlier call's outputs: the gate does, for its checks (a call drawn at random in each timed
# sample). With two, the gate's timing of a replay went over to copying every output out, a cost the program
# it stands for never pays (one likely part of the gap on the H200 (benchmarks/RESULTS-history.md): the MoE's replay timed 0.140 ms
# per call at the gate, its step 0.116 ms in the program; not yet measured with three).
# A further instance exists only while a caller holds that many calls' outputs; each is bounded like the first
# (MAX_GRAPH_BYTES).
ROTATE = 3
_PLAIN = object()  # a layout's answer: make the plain call this time
# The raw calls of the steady-state path (CUDA builds; a CPU build never reaches it: no layout there is hot).
_cur_device = getattr(torch._C, "_cuda_getDevice", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class Graphed:
    """`call(args)` of a wrapper, replayed from CUDA graphs. See the module docstring."""

    def __init__(self, fn):
        self.fn = fn
        self._layouts: dict = {}  # layout key -> _Layout
        self._last = None  # the layout of the last call: the hot path checks it first
        self._lock = threading.Lock()
        self.replays = 0
        self.plain_calls = 0
        # Input positions the compiler marks static (Inductor's static_input_idxs: parameters, buffers):
        # kept in place across address changes while the re-record budget lasts. The runtime sets it.
        self.static_hint: frozenset = frozenset()

    def __call__(self, args):
        real = list(args)
        if type(args) is list:
            args.clear()  # the wrapper ABI: the callee owns the list and frees the inputs early
        lay = self._last
        # The steady state, every step of a loop: every argument a tensor read in place at the address it
        # had, every output handed out, the same stream, an instance whose outputs the caller let go. What
        # this path skips, _Layout.call does only when one of those fails (and it checks them all again).
        if lay is not None and lay.hot is not None and lay.n == len(real) and _cur_device() == lay.dev_idx \
                and not _capturing():
            with self._lock:
                recs = lay.hot
                if recs is None:
                    same = False
                elif _same_ptrs is not None:  # in C (tilesmith.replay.native): 0.3 us for 51 arguments where Python takes 4
                    same = _same_ptrs(real, recs[0].packed)
                else:
                    try:
                        same = list(map(_data_ptr, real)) == recs[0].all_ptrs
                    except TypeError:  # a non-tensor argument where the layout has a tensor
                        same = False
                if same and _raw_stream(lay.dev_idx) == lay.raw_stream:
                    for rec in recs:
                        if rec.free():
                            lay.calls += 1
                            rec.graph.replay()
                            self.replays += 1
                            outs = list(map(_detach, rec.handed_only))
                            return rec.kind(outs) if rec.kind else outs[0]
        if lay is None or lay.n != len(real) or (lay.scalar_idx and lay.scalars != [real[i] for i in lay.scalar_idx]):
            lay = self._find(real)
        if lay is not None and lay.reason is None and not lay.capturing():
            with self._lock:
                try:
                    out = lay.call(real)
                finally:
                    lay.settle()
            if out is not _PLAIN:
                self.replays += 1
                return out
        self.plain_calls += 1
        return self.fn(real)

    def plain_reasons(self) -> list[str]:
        return [lay.reason for lay in self._layouts.values() if lay.reason is not None]

    def describe(self) -> list[dict]:
        """Per layout: inputs read in place and copied, outputs copied out, captures, why plain."""
        return [lay.describe() for lay in self._layouts.values()]

    def _find(self, real: list):
        key = _layout(real)
        if key is None:
            return None  # arguments without a layout key: plain, nothing remembered
        with self._lock:
            lay = self._layouts.get(key)
            if lay is None:
                lay = _Layout(self, real, key)
                if len(self._layouts) >= MAX_LAYOUTS:
                    lay.reason = f"more than {MAX_LAYOUTS} argument layouts"
                else:
                    self._layouts[key] = lay
            self._last = lay
            return lay


def graphed(fn) -> Graphed:
    """Wrap a wrapper's `call(args)`; see the module docstring."""
    return fn if isinstance(fn, Graphed) else Graphed(fn)


class _Layout:
    """The graphs of one argument layout, what is read in place, and what was learned about the caller."""

    def __init__(self, owner: Graphed, real: list, key):
        self.owner, self.n = owner, len(real)
        self.scalar_idx = [i for i, x in enumerate(real) if not isinstance(x, torch.Tensor)]
        self.scalars = [real[i] for i in self.scalar_idx]
        self.tensor_idx = [i for i, x in enumerate(real) if isinstance(x, torch.Tensor)]
        self.reason = None  # why this layout runs plain
        self.calls = self.records = 0
        self.demoted: set = set()  # inputs copied into the graph's own buffers instead of read in place
        self.moved: set = set()  # inputs re-recorded once at a new address
        self.copy_out: set = set()  # output positions the caller keeps across calls: copied out
        self.copy_all_out = False  # the last capture: what it can no longer learn, it copies
        self.recs: list = []  # instances of the current record (same plan, own memory), first one first
        self.why: list = []  # why each capture (and each extra instance) was made, in order: describe() shows it
        self.stream = self.raw_stream = None  # the stream of the last replay, and its raw handle
        self.pool = None
        self.hot = None  # the instances, while Graphed.__call__'s steady-state path may replay them (settle())
        devices = {real[i].device for i in self.tensor_idx}
        if not self.tensor_idx or len(devices) != 1 or next(iter(devices)).type != "cuda":
            self.reason = "not all tensors on one CUDA device"
            return
        self.device = next(iter(devices))
        self.dev_idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.hint = owner.static_hint | {i for i in self.tensor_idx if isinstance(real[i], torch.nn.Parameter)
                                         or getattr(real[i], "_dynamo_static_input_type", None) is not None}

    def settle(self) -> None:
        """After a call through call(): whether the next ones may take the steady-state path, which reads
        every argument in place (no scalars, nothing copied in) and hands every output out (nothing copied
        out, no input or view of one returned)."""
        recs = self.recs
        ok = self.reason is None and recs and all(r.all_ptrs is not None and r.handed_only is not None for r in recs)
        self.hot = list(recs) if ok else None

    def capturing(self) -> bool:
        if _cur_device() == self.dev_idx:  # the raw calls: this is on every call's path
            return _capturing()
        with torch.cuda.device(self.dev_idx):
            return torch.cuda.is_current_stream_capturing()

    def call(self, real: list):
        # The steady-state path's view of the instances goes first: a re-record lets go of the old ones (their
        # outputs' memory goes to the new capture), which a list of them kept here would hold on to.
        self.hot = None
        self.calls += 1
        if self.calls == 1:
            return _PLAIN  # the warm-up: lazy initialisation and autotuning happen outside any capture
        if not self.recs:
            self.why.append("first capture")
            return self._record(real)
        rec = self.recs[0]
        if not rec.ptrs_ok(real):  # every instance reads the same addresses in place
            missed = [i for i in rec.static_idx if real[i].data_ptr() != rec.ptrs[i]]
            again = [i for i in missed if i in self.moved]
            self.demoted |= {i for i in again if i not in self.hint}
            self.moved |= set(missed)
            self.why.append(f"inputs moved: {_positions(missed)} ({len(again)} again, "
                            f"{sum(i in self.hint for i in missed)} marked static)")
            return self._record(real)
        for rec in self.recs:  # an instance whose outputs the caller no longer holds
            if rec.free():
                break
        else:
            if len(self.recs) < ROTATE:
                self.why.append(f"outputs held: {_positions(sorted(rec.busy_outputs()))}; another instance")
                return self._rotate(real)
            # The caller holds outputs of every instance: it keeps them across calls. Copy those out
            # from now on, and capture again around the memory it holds.
            self.copy_out |= set().union(*(r.busy_outputs() for r in self.recs))
            self.why.append(f"outputs held by every instance: {_positions(sorted(self.copy_out))} copied out")
            return self._record(real)
        if torch._C._cuda_getCurrentRawStream(self.dev_idx) != self.raw_stream:
            self._join_stream()
        if rec.copied_idx:
            rec.copy_in(real)
        rec.graph.replay()
        if rec.handed_only is not None:  # every output the graph's own memory, handed out: no plan to walk
            outs = list(map(_detach, rec.handed_only))
            return rec.kind(outs) if rec.kind else outs[0]
        return rec.outputs(real)

    def _rotate(self, real: list):
        """One more instance of the current record, in a memory pool of its own: its outputs and
        intermediates never overlap the other instances' outputs, which the caller may hold while it
        replays (a pool shared with an earlier capture would give it that capture's freed blocks)."""
        try:
            with torch.cuda.device(self.dev_idx):
                self._join_stream()
                rec = _Record.capture(self, real, torch.cuda.graph_pool_handle())
                out = rec.first_replay(real)
                if rec.changed is not None:  # as in _record: the call is done, later ones run plain
                    self.reason = f"the wrapper changes input {rec.changed}, which moves between calls"
                    self.recs = []
                    return out
                self.recs.append(rec)
                return out
        except _NotGraphable as e:
            why = str(e)
        except Exception as e:  # noqa: BLE001 - any failure to capture means: run plain
            why = f"capture failed: {type(e).__name__}: {e}"[:300]
        if len(self.recs) >= 2:
            # A further instance did not fit (memory, MAX_GRAPH_BYTES): the ones there still work, as with
            # ROTATE of them. Copy the held outputs out from now on and capture again, instead of running plain.
            self.copy_out |= set().union(*(r.busy_outputs() for r in self.recs))
            self.why.append(f"instance {len(self.recs) + 1} failed ({why[:120]}): held outputs "
                            f"{_positions(sorted(self.copy_out))} copied out")
            return self._record(real)
        self.reason = why
        self.recs = []
        return _PLAIN

    def _join_stream(self) -> None:
        raw = torch._C._cuda_getCurrentRawStream(self.dev_idx)  # an int: cheaper than the Stream object
        if raw != self.raw_stream:
            cur = torch.cuda.current_stream(self.dev_idx)
            if self.stream is not None:  # the last replay's work (on another stream) comes first
                cur.wait_stream(self.stream)
            self.stream, self.raw_stream = cur, raw

    def _record(self, real: list):
        if self.records >= MAX_RECORDS:
            self.reason = f"inputs or kept outputs changed after {MAX_RECORDS} captures"
            return _PLAIN
        self.records += 1
        if self.records == MAX_RECORDS:  # the last capture copies every input in and every output out
            self.demoted |= {i for i in self.tensor_idx if not _overlapping(real[i])}
            self.copy_all_out = True
            self.why.append("the last capture: every input copied in, every output out")
        elif self.records == MAX_RECORDS - 1:  # every input that moved so far is copied from now on
            more = {i for i in self.moved if i not in self.hint and not _overlapping(real[i])} - self.demoted
            self.demoted |= more
            self.why.append(f"the last but one capture: {len(more)} more inputs that moved copied in "
                            f"({len(self.demoted)} in all)")
        # The old graph stays alive through the new capture, so their shared pool does too; its outputs
        # are let go first, so the new graph takes the same blocks (outputs that a later graph reads in
        # place keep their addresses), except those the caller still holds.
        old_graph = self.recs[0].graph if self.recs else None
        self.recs = []  # the other instances (and their own pools) go
        try:
            with torch.cuda.device(self.dev_idx):
                self._join_stream()
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                rec = _Record.capture(self, real, self.pool)
                del old_graph
                out = rec.first_replay(real)
                if rec.changed is not None:  # this call is done (the plain call's effect); later ones run plain
                    self.reason = f"the wrapper changes input {rec.changed}, which moves between calls"
                    return out
                self.recs = [rec]
                return out
        except _NotGraphable as e:
            self.reason = str(e)
        except Exception as e:  # noqa: BLE001 - any failure to capture means: run plain
            self.reason = f"capture failed: {type(e).__name__}: {e}"[:300]
        self.recs = []
        return _PLAIN

    def describe(self) -> dict:
        r = self.recs[0] if self.recs else None
        return {"calls": self.calls, "captures": self.records, "reason": self.reason,
                "inputs_in_place": len(r.static_idx) if r else 0, "inputs_copied": len(r.copied_idx) if r else 0,
                "outputs_copied": len(self.copy_out), "instances": len(self.recs), "why_captured": self.why[:12],
                "address_check": "C" if _same_ptrs is not None else "Python"}


def _layout(real: list):
    """The layout key: arity and every non-tensor argument's value (tensor shapes follow from them)."""
    parts = []
    for x in real:
        if isinstance(x, torch.Tensor):
            parts.append(None)
        elif x is None or isinstance(x, (bool, int, float, str)):
            parts.append((type(x).__name__, x))
        else:
            return None
    return tuple(parts)


def _positions(idx: list) -> str:
    """Argument positions for a capture's reason, the first few: '[3, 7, 9] +12 more'."""
    return f"{list(idx[:6])}" + (f" +{len(idx) - 6} more" if len(idx) > 6 else "")
