"""The gate worker's own code and state, checked after every request by code the candidate cannot change.

gate.worker.patches compares the attributes of watched namespaces, but it is Python code living in the process that
runs the candidate: a red team replaced the *code* of functions in place (`fn.__code__`, which keeps the function
object), an entry of the worker's op table, an instance attribute of json's default encoder and of the reply
pipe's file object, and the code of the checks themselves; each made the numbers that reach the deciding process
shorter, and each was accepted on the original's own code. Here, before any candidate code runs:

- `build` records, for the worker's modules (its own, the clock, the tensor and output helpers, the checks,
  json's encoder and decoder), every global's identity, and for every function among them (module level and in
  their classes) its code, defaults, globals and closure cells' contents; for the op table, every entry;
- the worker's main loop compares them after every request with builtins only (map, getattr, operator.is_, all),
  bound when the guard is built and held in its own running frame, which candidate code cannot change; where
  anything moved, it writes a reply made here beforehand (`failed`) with os.write.

The replies are encoded by a private JSON encoder and written with os.write, both bound here.

The dispatcher's kernel table is process state too, and none of the above sees it: a Python kernel registered
through torch.library (for `aten::detach` on the CPU key) ran inside the digest's bound C methods after the window
closed and filled only the kept outputs (tests/redteam.py, accepted at 28.9x). `dispatch_state` records, before any
candidate code, torch's own description of every kernel and fallback behind the ops the worker itself runs once
candidate code has run (DISPATCH_OPS: the refill, the kept outputs' snapshot and digest, their copy to disk); the
worker compares it after every request and, within a timed request, right before the refill and right after the
window's calls, where a kernel the candidate registered must still be in place to act.
Not covered: memory written through ctypes, or a frame's locals changed through the C API.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import types


# The aten ops (every overload) the worker runs once candidate code has run: worker.sample._set_content and _refill,
# worker_tensors.snapshot, outputs_digest and _to_cpu, torch.save of the kept outputs.
DISPATCH_OPS = ("detach", "alias", "clone", "copy_", "view", "reshape", "_reshape_alias", "_unsafe_view", "contiguous",
                "as_strided", "to", "_to_copy", "rand", "randint", "uniform_", "random_", "mul", "mul_", "add", "add_",
                "sub", "rsub", "empty", "empty_strided", "empty_like", "fill_", "lift_fresh", "_local_scalar_dense")
# Ops whose computed table (every dispatch key, backend fallbacks included) is compared too: a Python fallback on a
# key applies to every op without its own kernel there.
DISPATCH_TABLES = ("aten::detach", "aten::copy_", "aten::clone")


def dispatch_names() -> tuple:
    import torch

    out = []
    for name in DISPATCH_OPS:
        packet = getattr(torch.ops.aten, name, None)
        for ov in (packet.overloads() if packet is not None else []):
            qual = f"aten::{name}" + ("" if ov == "default" else f".{ov}")
            try:
                torch._C._dispatch_dump(qual)
            except RuntimeError:
                continue
            out.append(qual)
    return tuple(out)


def dispatch_state() -> tuple:
    """(dump, dump_table, names, tables, recorded state): the check is `(*map(dump, names), *map(dump_table, tables))
    == state`, with these C functions bound now."""
    import torch

    dump, table, names = torch._C._dispatch_dump, torch._C._dispatch_dump_table, dispatch_names()
    return dump, table, names, DISPATCH_TABLES, tuple(map(dump, names)) + tuple(map(table, DISPATCH_TABLES))


def _entries(mod) -> list[tuple]:
    out = []
    for name, value in list(vars(mod).items()):
        out.append((mod, name, value))
        fns = [value] if isinstance(value, types.FunctionType) else []
        if isinstance(value, type) and getattr(value, "__module__", "") == mod.__name__:
            fns += [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
            out += [(value, k, v) for k, v in vars(value).items() if isinstance(v, types.FunctionType)]
        for fn in fns:
            out += [(fn, "__code__", fn.__code__), (fn, "__defaults__", fn.__defaults__),
                    (fn, "__kwdefaults__", fn.__kwdefaults__), (fn, "__globals__", fn.__globals__)]
            for cell in fn.__closure__ or ():
                try:
                    out.append((cell, "cell_contents", cell.cell_contents))
                except ValueError:  # an empty cell (a name assigned later)
                    pass
    return out


class Guard:
    """What `build` recorded, as tuples the worker's main loop checks with the builtins in `bound` (all, map,
    getattr, operator.is_, operator.getitem, len, vars, tuple), bound before any candidate code runs; and the
    private encoder, decoder and os.write its replies go through. The loop holds these in its own frame: no
    Python function of the worker's is called to check (its code could be what was replaced)."""

    def __init__(self, entries: list[tuple], tables: list[dict]):
        enc, dec = json.JSONEncoder(), json.JSONDecoder()
        for inst in (enc, dec):  # their instance attributes: replaced ones by identity, added ones by count
            entries = entries + [(inst, k, v) for k, v in vars(inst).items()]
        self.objs = tuple(e[0] for e in entries)
        self.names = tuple(e[1] for e in entries)
        self.vals = tuple(e[2] for e in entries)
        self.dicts = tuple(d for d in tables for _ in d)
        self.keys = tuple(k for d in tables for k in d)
        self.dvals = tuple(v for d in tables for v in d.values())
        self.tables = tuple(tables) + (vars(enc), vars(dec))
        self.sizes = tuple(len(d) for d in self.tables)
        self.bound = (all, map, getattr, operator.is_, operator.getitem, len, tuple)
        self.encode, self.decode, self.write = enc.encode, dec.decode, os.write
        # The replies' text made by json's C encoder alone (called with the reply and 0, it returns the text's
        # chunks): json's Python encoder looks `iterencode` up on its class as it runs, and candidate code can set a
        # class attribute and put it back (no audit event) to rewrite a reply it has seen complete.
        c = getattr(json.encoder, "c_make_encoder", None)
        self.chunks = (c(None, _unencodable, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)
                       if c is not None else (lambda o, _level, _enc=enc.encode: (_enc(o),)))
        self.dispatch = dispatch_state()
        self.failed = (json.dumps({"ok": False, "code": "process-state", "error": (
            "the candidate changes process state: it replaces the gate worker's own code or state (a function's code, "
            "an entry of its op table, its reply encoder, a kernel of an op the worker runs), which measures and "
            "reports the timings")}) + "\n").encode()


def _unencodable(o):
    raise TypeError(f"a gate worker's reply holds a {type(o).__name__}, which JSON cannot hold")


# The worker runs as `python -m tilesmith.gate.worker`: __main__ is the package's __main__.py, serve.py the worker
# (its request loop; its ops in setup.py, sample.py, checks.py and outputs.py).
MODULES = ("__main__", "tilesmith.gate.worker.serve", "tilesmith.gate.worker.setup", "tilesmith.gate.worker.sample",
           "tilesmith.gate.worker.checks", "tilesmith.gate.worker.state", "tilesmith.gate.clock",
           "tilesmith.gate.worker.tensors", "tilesmith.gate.worker.outputs", "tilesmith.gate.worker.trees",
           "tilesmith.gate.worker.warm", "tilesmith.gate.worker.patches", "tilesmith.gate.worker.fingerprint",
           "tilesmith.gate.worker.guard", "json", "json.encoder", "json.decoder", "json.scanner")


def build(tables: list[dict]) -> Guard:
    """The guard over the worker's modules (those imported now) and `tables` (e.g. the op table)."""
    entries = []
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            entries += _entries(mod)
    return Guard(entries, tables)
