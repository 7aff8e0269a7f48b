"""One capture of the lean replay (tilesmith/replay/graphed.py, see its docstring): the CUDA graph, the inputs it
reads in place and their addresses, the buffers of the inputs it copies (allocated inside the capture,
from the graph's own pool), and the plan for its outputs (handed out, copied out, or the caller's own
inputs and views of them). graphed.py decides when to capture; this module captures."""

from __future__ import annotations

import torch

from tilesmith.replay import native

# Device memory a capture may newly reserve (the graph's private pool: its intermediates and outputs stay
# reserved, where the plain call frees them; buffers of copied inputs): above this the layout runs plain.
MAX_GRAPH_BYTES = 2 << 30

_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds only
_use_count = torch._C._storage_Use_Count
_data_ptr = torch.Tensor.data_ptr
_same_ptrs = native.same_ptrs()  # the address check in C where it is built (tilesmith.replay.native), else None
_detach = torch.Tensor.detach
_capture_streams: dict = {}  # device index -> the side stream captures run on (one per process, as torch's)


class _NotGraphable(Exception):
    pass


class _Record:
    """One capture: the graph, the addresses it reads in place, its copy-in plan, its output plan."""

    @classmethod
    def capture(cls, lay, real: list, pool) -> "_Record":
        self = cls()
        self.copied_idx = [i for i in lay.tensor_idx if i in lay.demoted]
        self.static_idx = [i for i in lay.tensor_idx if i not in lay.demoted]
        for i in self.copied_idx:
            x = real[i]
            if _overlapping(x):
                raise _NotGraphable("an input with overlapping memory (a zero stride) moves between calls")
        self.ptrs = [real[i].data_ptr() if i in self.static_idx else None for i in range(len(real))]
        self.all_ptrs = self.ptrs if len(self.static_idx) == len(real) else None
        self.packed = native.pack(self.all_ptrs) if self.all_ptrs is not None else None  # _same_ptrs reads these
        static: list = []

        def run():
            # The copied inputs' buffers, allocated here inside the capture: from the graph's pool, not the
            # caller's (an allocation outside would move where the caller's next step allocates). Their
            # contents do not matter yet: a capture runs no kernel; copy_in fills them before the first replay.
            self.own = {i: torch.empty_strided(real[i].shape, real[i].stride(), dtype=real[i].dtype,
                                               device=real[i].device) for i in self.copied_idx}
            static[:] = [self.own.get(i, x) for i, x in enumerate(real)]
            return lay.owner.fn(list(static))

        reserved0 = torch.cuda.memory_reserved(lay.device)
        self.graph = torch.cuda.CUDAGraph()
        try:
            out = _capture(self.graph, pool, run, lay.dev_idx)
        except torch.cuda.OutOfMemoryError:
            # The cache kept for the caller cannot be given back while a capture is under way, and the graph's
            # pool needed new memory: give it back now and capture once more, as torch.cuda.graph would have.
            self.own, self.graph = {}, None  # the failed capture's buffers go first
            static.clear()
            torch.cuda.empty_cache()
            self.graph = torch.cuda.CUDAGraph()
            out = _capture(self.graph, pool, run, lay.dev_idx)
        # The copied inputs' buffers are not counted: they were allocated before reserved0 in earlier versions.
        own = sum(b.untyped_storage().nbytes() for b in self.own.values())
        grew = torch.cuda.memory_reserved(lay.device) - reserved0 - own
        if grew > MAX_GRAPH_BYTES:
            raise _NotGraphable(f"the graph would keep {grew >> 20} MiB of device memory reserved")
        by_dtype: dict = {}
        for i in self.copied_idx:
            by_dtype.setdefault(real[i].dtype, []).append(i)
        self.copies = [([self.own[i] for i in idxs], idxs) for idxs in by_dtype.values() if len(idxs) > 1]
        self.copy1 = [(self.own[idxs[0]], idxs[0]) for idxs in by_dtype.values() if len(idxs) == 1]
        self.copy_in(real)
        self.kind = type(out) if isinstance(out, (tuple, list)) else None
        self._plan_outputs(list(out) if self.kind else [out], static, lay)
        return self

    def _plan_outputs(self, outs: list, static: list, lay) -> None:
        by_storage = {}  # input storage pointer -> input position (the caller's tensor, or our copy)
        for i in lay.tensor_idx:
            if static[i].numel():
                by_storage.setdefault(static[i].untyped_storage().data_ptr(), i)
        self.plan, groups = [], {}  # groups: pool storage pointer -> [storage, [output positions], [holders]]
        for k, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                self.plan.append(("value", o))
                continue
            ptr = o.untyped_storage().data_ptr()
            i = by_storage.get(ptr) if o.numel() else None
            if i is not None:
                x = static[i]
                if o.dtype != x.dtype:
                    raise _NotGraphable("an output views an input with another dtype")
                same = o.shape == x.shape and o.stride() == x.stride() and o.storage_offset() == x.storage_offset()
                self.plan.append(("arg", i) if same else
                                 ("view", i, tuple(o.shape), o.stride(), o.storage_offset() - x.storage_offset()))
                continue
            g = groups.setdefault(ptr, [o.untyped_storage(), [], []])
            g[1].append(k)
            g[2].append(o)
            self.plan.append(("pool", o, k))
        # Handed out: groups the caller has not kept so far. Copied out: the others, one copy per storage
        # so that outputs sharing memory keep sharing it.
        self.handed, self.copied = [], []
        self.copy_pos = {}
        for st, ks, _ in groups.values():
            if lay.copy_all_out or lay.copy_out & set(ks):
                u8 = torch.empty(0, dtype=torch.uint8, device=lay.device).set_(st)
                for k in ks:
                    self.copy_pos[k] = len(self.copied)
                self.copied.append(u8)
            else:
                self.handed.append([st, set(ks), 0])
        for h in self.handed:
            h[2] = _use_count(h[0]._cdata)  # our own references: more means the caller holds one
        self.counts = [(h[0]._cdata, h[2]) for h in self.handed]  # the storages stay alive in self.handed
        self.device = lay.device
        simple = not self.copied and all(p[0] == "pool" for p in self.plan)
        self.handed_only = [p[1] for p in self.plan] if simple else None

    def ptrs_ok(self, real: list) -> bool:
        if self.all_ptrs is not None:  # every argument a tensor read in place: one pass over the list
            if _same_ptrs is not None:
                return _same_ptrs(real, self.packed)
            return list(map(_data_ptr, real)) == self.all_ptrs
        if _ptrs_equal is not None:
            return _ptrs_equal(real, self.ptrs, self.static_idx)
        return all(real[i].data_ptr() == self.ptrs[i] for i in self.static_idx)

    def free(self) -> bool:
        """Whether the caller holds none of the outputs handed out (the hot path's form of busy_outputs)."""
        for cdata, base in self.counts:
            if _use_count(cdata) > base:
                return False
        return True

    def busy_outputs(self) -> set:
        busy = set()
        for st, ks, base in self.handed:
            if _use_count(st._cdata) > base:
                busy |= ks
        return busy

    def copy_in(self, real: list) -> None:
        for dsts, idxs in self.copies:
            torch._foreach_copy_(dsts, [real[i] for i in idxs])
        for dst, i in self.copy1:
            dst.copy_(real[i])

    def first_replay(self, real: list):
        """The capture's own call: replay, then check that no copied input was changed by the wrapper."""
        self.graph.replay()
        self.changed = None
        for i in self.copied_idx:
            if not _same(self.own[i], real[i]):
                real[i].copy_(self.own[i])  # the caller's tensor gets the change, as with the plain call
                self.changed = i
        return self.outputs(real)

    def outputs(self, real: list):
        fresh = [torch.empty_like(u8).copy_(u8) for u8 in self.copied] if self.copied else ()
        outs = []
        for p in self.plan:
            kind = p[0]
            if kind == "pool":
                o, k = p[1], p[2]
                j = self.copy_pos.get(k)
                if j is None:
                    outs.append(o.detach())
                else:
                    outs.append(torch.empty(0, dtype=o.dtype, device=self.device).set_(
                        fresh[j].untyped_storage(), o.storage_offset(), o.shape, o.stride()))
            elif kind == "arg":
                outs.append(real[p[1]])
            elif kind == "view":
                x = real[p[1]]
                outs.append(x.as_strided(p[2], p[3], x.storage_offset() + p[4]))
            else:
                outs.append(p[1])
        return self.kind(outs) if self.kind else outs[0]


def _capture(graph, pool, run, dev_idx: int):
    """`run()` captured into `graph` on a side stream, as `torch.cuda.graph` does, except that the caching
    allocator's free blocks are kept (torch.cuda.graph empties the cache first). Emptying it moves where
    the caller's next allocations land: in a training step the saved activations a backward graph reads in
    place then sit elsewhere on the next step, which is a re-record, and another cache emptied."""
    stream = _capture_streams.get(dev_idx)
    if stream is None:
        stream = _capture_streams[dev_idx] = torch.cuda.Stream(dev_idx)
    torch.cuda.synchronize(dev_idx)
    stream.wait_stream(torch.cuda.current_stream(dev_idx))
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            out = run()
        except BaseException:
            try:
                graph.capture_end()
            except Exception:  # noqa: BLE001 - the run's own error is the one to report
                pass
            raise
        graph.capture_end()
    torch.cuda.current_stream(dev_idx).wait_stream(stream)
    return out


def _overlapping(x: torch.Tensor) -> bool:
    """A zero stride over more than one element: readable in place, not a copy destination."""
    return any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
    return bool(torch.equal(a, b))
