"""The gate worker's correctness-side ops (requests `outputs` and `ref64` of tilesmith.gate.worker): run a
role on every input set and save outputs, layouts and inputs after the call raw for the deciding process;
the header's FX program in float64. Imported by the worker before any wrapper code runs in the process,
so the device synchronisation bound here is torch's own."""

from __future__ import annotations

import torch

from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import _as_list, _refill, _to_cpu, _to_device


def _on_cuda(st: State) -> bool:
    """Whether this worker's graph runs on CUDA: its device, asked per call, never at import. The zygote that
    workers fork from imports this module outside the sandbox (it sees the machine's GPUs, and a CUDA query
    there, torch.cuda.is_available() running cuInit, would leave its children without CUDA), while a CPU
    worker forked from it has no GPU device nodes at all."""
    return str(st.device).startswith("cuda")


def _layout(o, args) -> dict:
    if not isinstance(o, torch.Tensor):
        return {"type": type(o).__name__}
    ptr = o.untyped_storage().data_ptr() if o.numel() else None
    alias = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and ptr is not None
             and a.untyped_storage().data_ptr() == ptr]
    return {"type": "Tensor" if type(o) is torch.Tensor else type(o).__name__, "shape": list(o.shape),
            "stride": list(o.stride()), "offset": int(o.storage_offset()), "dtype": str(o.dtype).removeprefix("torch."),
            "device": o.device.type, "alias_inputs": alias, "storage": ptr}


def _call(st: State, role: str, args: list, on_side_stream: bool):
    """One call on fresh-list args; on CUDA under a non-default current stream that alone is synchronised."""
    from tilesmith.capture import loading

    loading.restore_rng(st.data.rng)
    with torch.no_grad():
        if on_side_stream and _on_cuda(st):
            torch._C._cuda_synchronize()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                out = st.fns[role](list(args))
                left_on = torch.cuda.current_stream()
            if left_on != s:  # read on a stream the call chose, the outputs would wait for its work
                raise RuntimeError("the call switched the current CUDA stream and did not switch it back: "
                                   "its work is not on the caller's stream")
            s.synchronize()  # only this stream: work left on another stream is not waited for
            with torch.cuda.stream(s):
                res = [_to_cpu(o) for o in _as_list(out)]
            return out, res
        out = st.fns[role](list(args))
        return out, [_to_cpu(o) for o in _as_list(out)]


def _storage_ids(layouts: list) -> None:
    """Replace raw storage pointers by first-appearance numbers (output-output aliasing, comparable)."""
    ids = {}
    for lay in layouts:
        p = lay.pop("storage", None)
        if p is not None:
            lay["storage_id"] = ids.setdefault(p, len(ids))


def op_outputs(st: State, req: dict) -> dict:
    """Run `role` on every set (fresh device copies), then the same-buffers pair; save everything raw."""
    sets = torch.load(req["sets_file"], weights_only=True)
    role, side = req["role"], bool(req.get("side_stream", True))
    results = []
    for inputs in sets["inputs"]:
        args = [_to_device(x, st.device) for x in inputs]
        _poison(st.device)
        out, res = _call(st, role, args, side)
        lays = [_layout(o, args) for o in _as_list(out)]
        _storage_ids(lays)
        after = [_to_cpu(a) for a in args]
        results.append({"outputs": res, "layouts": lays, "inputs_after": after,
                        "mutated": any(_changed(x, y) for x, y in zip(inputs, after))})
        del out
    pair = {}
    if req.get("pair"):
        i, j = req["pair"]
        bufs = [_to_device(x, st.device) for x in sets["inputs"][i]]
        out1, _ = _call(st, role, bufs, side)
        for b, x in zip(bufs, sets["inputs"][j]):
            _refill(b, _to_device(x, st.device))
        out2, second = _call(st, role, bufs, side)
        if _on_cuda(st):
            torch._C._cuda_synchronize()
        pair = {"first": [_to_cpu(o) for o in _as_list(out1)], "second": second}
    torch.save({"sets": results, "pair": pair}, req["out_file"])
    return {}


def _changed(before, after) -> bool:
    if not isinstance(before, torch.Tensor):
        return False
    if before.dtype.is_floating_point:
        return not torch.equal(before.nan_to_num(), after.nan_to_num())
    return not torch.equal(before, after)


def _poison(device: str) -> None:
    """Fill freshly freed memory with NaN so outputs that are never written read as NaN, not stale data."""
    if not device.startswith("cuda"):
        return
    # The allocator's free bytes are split over cached blocks: one tensor of the total would not fit
    # in any of them and would grow the pool instead (each call doubling it, until out of memory).
    # So poison in halving chunks, and give back any chunk that needed new memory.
    held, chunk = [], min(torch.cuda.memory_reserved() - torch.cuda.memory_allocated(), 8 << 30)
    while chunk >= 1 << 20:
        reserved = torch.cuda.memory_reserved()
        t = torch.empty(chunk // 4, dtype=torch.float32, device=device)
        if torch.cuda.memory_reserved() > reserved:
            del t
            torch.cuda.empty_cache()
            chunk = min(chunk // 2, torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
            continue
        t.fill_(float("nan"))
        held.append(t)
        chunk = min(chunk, torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
    del held  # freed: the NaN-filled blocks are what the next allocations get


def op_ref64(st: State, req: dict) -> dict:
    """Run the FX program of the header in float64 on every set; unavailable is an answer, not an error."""
    from tilesmith.gate.worker.reference import run_fx_float64

    sets = torch.load(req["sets_file"], weights_only=True)
    try:
        outs = [run_fx_float64(req["wrapper_text"], st.data.constants, inputs) for inputs in sets["inputs"]]
    except Exception as e:  # an FX program we cannot re-run in float64: compare against the original only
        return {"available": False, "why": f"{type(e).__name__}: {e}"[:300]}
    torch.save({"outputs": outs}, req["out_file"])
    return {"available": True}
