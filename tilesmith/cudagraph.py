"""Replay a wrapper's launches from a CUDA graph: the remedy for graphs whose time is launch overhead.

A rewritten wrapper (the tuner's `launch-overhead` variant, or an agent's) ends with

    from tilesmith.cudagraph import graphed
    call = graphed(call)

and is judged by the gate like any other candidate: it counts only if it is correct on every input set
and measurably faster in the graph's own timing mode. This is the one tilesmith module a candidate may
import (the static screen flags every other), because it needs what candidates may not touch: a side
stream for the warm-up and the capture, an event, and state that outlives a call.

Per argument layout (shapes, strides, dtypes, device, and every non-tensor argument's value) the first
call copies the inputs into static buffers, runs the wrapper once on a side stream (lazy
initialisation), and captures one run into a CUDA graph with a private memory pool. Every later call,
on the caller's current stream: wait for the previous user of those buffers, copy the inputs in,
replay, and return fresh copies of the outputs. The graph's own buffers are never handed out, so an
output the caller keeps is never overwritten by the next call, and nothing is left on another stream.

It makes the plain call instead (the wrapper's own launches, the same results) whenever a graph is not
safe or not possible, and remembers that per layout: tensors not all on one CUDA device, an input with
overlapping memory, inputs larger than MAX_STATIC_BYTES, a capture that would keep more than
MAX_GRAPH_BYTES reserved, more than MAX_LAYOUTS layouts, a wrapper
that changed its inputs during the warm-up, an output that is a view of an input, or a capture that
failed. Inside the caller's own CUDA-graph capture it always makes the plain call (the caller's graph
records those launches), and remembers nothing.
"""

from __future__ import annotations

import threading

import torch

MAX_LAYOUTS = 8  # graphs kept per wrapper; more layouts (dynamic shapes) run plain
MAX_STATIC_BYTES = 1 << 30  # inputs copied into static buffers; bigger ones run plain (memory, copy time)
# Device memory a capture may newly reserve (static inputs, the graph's private pool: its intermediates
# and outputs stay reserved, where the plain call frees them): above this the layout runs plain.
MAX_GRAPH_BYTES = 2 << 30


class Graphed:
    """`call(args)` of a wrapper, replayed from CUDA graphs. See the module docstring."""

    def __init__(self, fn):
        self.fn = fn
        self._entries: dict = {}  # layout key -> _Entry, or a str: why this layout runs plain
        self._lock = threading.Lock()
        self.replays = 0
        self.plain_calls = 0

    def __call__(self, args):
        real = list(args)
        if isinstance(args, list):
            args.clear()  # the wrapper ABI: the callee owns the list and frees the inputs early
        if _capturing(real):  # inside the caller's own CUDA graph: its capture takes the plain launches
            self.plain_calls += 1
            return self.fn(real)
        key = _layout(real)
        with self._lock:
            entry = self._entries.get(key) if key is not None else "arguments without a layout key"
            if entry is None:
                entry = self._entries[key] = self._capture(real)
            if isinstance(entry, _Entry):
                self.replays += 1
                return entry.replay(real)
        self.plain_calls += 1
        return self.fn(real)

    def plain_reasons(self) -> list[str]:
        return [e for e in self._entries.values() if isinstance(e, str)]

    def _capture(self, real: list):
        tensors = [x for x in real if isinstance(x, torch.Tensor)]
        devices = {x.device for x in tensors}
        if not tensors or len(devices) != 1 or next(iter(devices)).type != "cuda":
            return "not all tensors on one CUDA device"
        if len(self._entries) >= MAX_LAYOUTS:
            return f"more than {MAX_LAYOUTS} argument layouts"
        if sum(x.untyped_storage().nbytes() for x in tensors) > MAX_STATIC_BYTES:
            return f"inputs larger than {MAX_STATIC_BYTES} bytes"
        if any(s == 0 and n > 1 for x in tensors for s, n in zip(x.stride(), x.shape)):
            return "an input with overlapping memory (a zero stride)"
        try:
            return _Entry.capture(self.fn, real, next(iter(devices)))
        except _NotGraphable as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - any failure to capture means: run plain
            return f"capture failed: {type(e).__name__}: {e}"[:300]


def graphed(fn) -> Graphed:
    """Wrap a wrapper's `call(args)`; see the module docstring."""
    return fn if isinstance(fn, Graphed) else Graphed(fn)


class _NotGraphable(Exception):
    pass


class _Entry:
    """One captured layout: static inputs, the graph, and how to rebuild its outputs."""

    def __init__(self, device, static, graph, outputs, kind, done):
        self.device, self.static, self.graph, self.outputs, self.kind, self.done = \
            device, static, graph, outputs, kind, done

    @classmethod
    def capture(cls, fn, real: list, device) -> "_Entry":
        with torch.cuda.device(device):
            reserved0 = torch.cuda.memory_reserved(device)
            cur = torch.cuda.current_stream()
            static = [_static_copy(x) if isinstance(x, torch.Tensor) else x for x in real]
            before = [x.clone() if isinstance(x, torch.Tensor) else None for x in static]
            side = torch.cuda.Stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                fn(list(static))  # warm-up: lazy initialisation (library handles, workspaces) outside the capture
            cur.wait_stream(side)
            if any(b is not None and not _same(b, x) for b, x in zip(before, static)):
                raise _NotGraphable("the wrapper changes its inputs")
            del before
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn(list(static))
            grew = torch.cuda.memory_reserved(device) - reserved0
            if grew > MAX_GRAPH_BYTES:
                raise _NotGraphable(f"the graph would keep {grew >> 20} MiB of device memory reserved")
            kind = type(out) if isinstance(out, (tuple, list)) else None
            outs = list(out) if kind else [out]
            inputs = {x.untyped_storage().data_ptr() for x in static if isinstance(x, torch.Tensor) and x.numel()}
            plan, groups = [], {}
            for o in outs:
                if not isinstance(o, torch.Tensor):
                    plan.append(("value", o))
                    continue
                ptr = o.untyped_storage().data_ptr()
                if o.numel() and ptr in inputs:
                    raise _NotGraphable("an output is a view of an input")
                g = groups.setdefault(ptr, (len(groups), o.untyped_storage()))[0]
                plan.append(("tensor", g, o.dtype, o.storage_offset(), tuple(o.shape), o.stride()))
            entry = cls(device, static, graph, (plan, [s for _, s in sorted(groups.values(), key=lambda t: t[0])]),
                        kind, torch.cuda.Event())
            return entry

    def replay(self, real: list):
        with torch.cuda.device(self.device):
            cur = torch.cuda.current_stream()
            cur.wait_event(self.done)  # the previous call (maybe on another stream) has read the buffers
            dst = [s for s in self.static if isinstance(s, torch.Tensor)]
            src = [x for x in real if isinstance(x, torch.Tensor)]
            if dst:
                torch._foreach_copy_(dst, src)
            self.graph.replay()
            plan, storages = self.outputs
            fresh = []
            for st in storages:  # one copy per storage: outputs that share memory keep sharing it
                buf = torch.empty(st.nbytes(), dtype=torch.uint8, device=self.device)
                if st.nbytes():
                    buf.copy_(torch.empty(0, dtype=torch.uint8, device=self.device).set_(st))
                fresh.append(buf.untyped_storage())
            self.done.record(cur)
            outs = []
            for p in plan:
                if p[0] == "value":
                    outs.append(p[1])
                    continue
                _, g, dtype, offset, shape, stride = p
                outs.append(torch.empty(0, dtype=dtype, device=self.device).set_(fresh[g], offset, shape, stride))
            return self.kind(outs) if self.kind else outs[0]


def _capturing(real: list) -> bool:
    for x in real:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            with torch.cuda.device(x.device):
                return torch.cuda.is_current_stream_capturing()
    return False


def _layout(real: list):
    parts = []
    for x in real:
        if isinstance(x, torch.Tensor):
            parts.append(("T", x.dtype, x.device, tuple(x.shape), x.stride(), x.requires_grad))
        elif x is None or isinstance(x, (bool, int, float, str)):
            parts.append(("V", type(x).__name__, x))
        else:
            return None
    return tuple(parts)


def _static_copy(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
    return bool(torch.equal(a, b))
