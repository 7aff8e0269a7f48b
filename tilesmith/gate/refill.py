"""A CPU worker's timed sample gets its input values from the parent, written into its memory while it is stopped.

Before, the worker refilled its buffers itself, between the sample's request and its window, untimed: a native thread
of the candidate's could take the GIL inside the refill's torch ops, read which buffer sets already held their new
values (from the serving thread's frames) and compute every timed call's outputs there, off the clock; the calls in
the window then only answered from memory (tests/redteam_freeze.py). Now, where the parent stops the worker at the
window's end (gate/freeze.py), it also starts the sample with the worker stopped:

1. it writes the request; the worker reads it, does everything that comes before the window and says it is ready
   for its values (clock.ARMED_MARK), then waits;
2. the parent stops the worker's process tree and writes each buffer set's new values into the worker's memory
   (/proc/PID/mem), computed here exactly as the worker would have computed them (`values`: the pool content's span,
   then the sample's perturbation; the original's checks rebuild the same values with worker.sample._set_content, and
   a test holds the two equal bit for bit);
3. queues the go (clock.VALUES_GO), notes the time and lets the tree run: the sample starts there. Whatever any thread
   of the candidate's does once the values exist is inside the sample's time, less the wait for a CPU that the
   machine made, never below the work the tree did over its CPUs (procfs.forgiven_ns).

The buffers' addresses come from the worker's answer to its timing setup (its own report, so a candidate could name
other memory: then its calls read values the parent did not write, and their outputs differ from the original's on
the inputs the parent did write). The spans' lengths and dtypes are the parent's own, from the contents it made.
"""

from __future__ import annotations

from tilesmith.capture.tensors import span_numel
from tilesmith.gate import procfs
from tilesmith.gate.inputs import parameter_indices, rescaled_parameters, updated_indices

MAX_BYTES = 16 << 30  # written per sample, at most


def enabled() -> bool:
    """Whether CPU samples get their values from the parent (TILESMITH_GATE_REFILL=1). The sample then starts as the
    parent lets the stopped worker run, less the wait for a CPU after that which the machine's other work made
    (procfs.forgiven_ns). Off by default: no GPU smoke has run the code that turns it on yet, and in the CPU suite
    (two test processes on 2 cores) honest wins of small graphs were rejected with it (the span from the go to the
    window, 90-120 us, is in both sides' samples), and beside two CPU hogs a 1.3x win was accepted 4 times in 10.
    Off, CPU workers refill their own buffers, untimed, as a CUDA graph's worker does."""
    from tilesmith import settings

    return settings.current().gate_refill


class Unwritable(Exception):
    """The worker's buffers could not be written as its setup said."""


class Refill:
    """The values of a graph's timed samples, written into a stopped CPU worker's buffers."""

    def __init__(self, contents: list, meta: dict | None):
        """contents: the pool of input lists the worker's buffers were set up from (its timing setup's sets file),
        meta: graph.json's (input ranges, parameters, inputs updated in place)."""
        self.contents = contents
        self.inputs = (meta or {}).get("inputs") or []
        self.shared = parameter_indices(meta) if meta else set()
        self.updated = updated_indices(meta) if meta else set()
        self.rescaled = rescaled_parameters(meta) if meta else set()

    def write(self, pid: int, addresses: list, fill: list[int], perturb: int | None) -> int:
        """Write the sample's values into stopped process `pid`: buffer set b (its inputs at `addresses[b]`) gets
        pool content fill[b], perturbed with `perturb`. Returns the bytes written; Unwritable where the addresses do
        not match the buffers or the memory cannot be written."""
        import torch

        if not isinstance(addresses, list) or len(addresses) < len(fill):
            raise Unwritable("the worker's buffer addresses do not cover the sample's buffer sets")
        total = 0
        for b, c in enumerate(fill):
            src, addrs = self.contents[c], addresses[b]
            layout = self.contents[b % len(self.contents)]  # the set's buffers were made from this content
            if not isinstance(addrs, list) or len(addrs) != len(src):
                raise Unwritable(f"the worker's buffer set {b} has {len(addrs) if isinstance(addrs, list) else '?'} "
                                 f"addresses for {len(src)} inputs")
            for i, (s, like, a) in enumerate(zip(src, layout, addrs)):
                flat = self.values(s, like, perturb, b, i)
                if flat is None:
                    continue
                if not isinstance(a, int) or isinstance(a, bool) or a <= 0:
                    raise Unwritable(f"the worker's address of input {i} in buffer set {b} is not one")
                data = flat.view(torch.uint8).numpy()
                total += len(data)
                if total > MAX_BYTES:
                    raise Unwritable("the sample's values are more than the gate writes")
                try:
                    procfs.write_memory(pid, a, data)
                except OSError as ex:
                    raise Unwritable(f"input {i} of buffer set {b} ({len(data)} bytes at {a:#x}) could not be written "
                                     f"into the stopped worker ({ex.strerror or ex})") from None
        return total

    def values(self, src, like, seed: int | None, b: int, i: int):
        """The flat span of storage the worker's buffer `i` of set `b` (laid out as `like`) holds after its refill
        from `src` with `seed` (worker.sample._set_content, step for step), or None where the refill leaves it as
        it is."""
        import torch

        if not isinstance(like, torch.Tensor) or not isinstance(src, torch.Tensor) or not span_numel(like):
            return None
        if i in self.shared and not (b == 0 and (i in self.updated or i in self.rescaled)):
            return None  # one buffer for every set, the same content: nothing to refill (an updated one: at set 0)
        n = span_numel(like)
        flat = src.as_strided((n,), (1,), src.storage_offset()).clone()
        if seed is None or like.dtype.is_complex or (i in self.shared and (i not in self.rescaled
                                                                            or not like.dtype.is_floating_point)):
            return flat  # a parameter's integers stay as captured (a position, a step count)
        info = self.inputs[i] if i < len(self.inputs) else {}
        g = torch.Generator(device="cpu").manual_seed((int(seed) * 1009 + b * 101 + i) % (1 << 62))
        if like.dtype.is_floating_point:
            u = torch.rand(n, generator=g, device="cpu", dtype=torch.float32)
            flat.mul_((1.0 + 1e-2 * (2.0 * u - 1.0)).to(like.dtype))
            return flat
        r = info.get("range") or {}
        if "min" in r and "max" in r and int(r["max"]) > int(r["min"]):
            flat.copy_(torch.randint(int(r["min"]), int(r["max"]) + 1, (n,), generator=g, device="cpu"))
        return flat
