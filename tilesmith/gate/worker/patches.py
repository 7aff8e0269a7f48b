"""What candidate code could patch to slow down code that runs after it in the same process: the
attributes of the libraries a wrapper calls through, and the globals of the wrappers already loaded.

The baseline is timed beside the candidate, in the candidate's worker. A candidate that replaces
`extern_kernels.mm` with a slower one (keeping the real one for itself), wraps Triton's launcher to
stall only the original's kernels, or reaches the original's module through the garbage collector and
swaps its kernels, slows only the baseline there. Each such patch replaces an object in a namespace:
`snapshot` records every attribute of the watched namespaces before candidate code
runs, and `replaced` names those that no longer hold the same object. Attributes added later (lazy
imports, caches that fill) are not changes; an attribute removed or replaced is.
"""

from __future__ import annotations

import importlib
import sys

# Namespaces a generated wrapper calls through (module-level names, classes whose methods it uses).
MODULES = ("torch", "torch.nn.functional", "torch._C", "torch._C._nn", "torch._C._VariableFunctions",
           "torch.cuda", "torch._inductor.select_algorithm", "torch._inductor.runtime.triton_heuristics",
           "torch._inductor.cpp_builder", "torch._inductor.codecache", "ctypes", "math",
           # ... the cudagraph trees candidates are timed through (watched where the worker imported them)
           "torch._inductor.cudagraph_trees", "torch._inductor.compile_fx", "torch._inductor.cudagraph_utils",
           # ... and what the worker measures with: its own modules (__main__, serve.py and its ops' modules), its
           # clock, time, os
           "__main__", "tilesmith.gate.worker.serve", "tilesmith.gate.worker.setup", "tilesmith.gate.worker.sample",
           "tilesmith.gate.worker.checks", "tilesmith.gate.clock", "tilesmith.gate.worker.outputs",
           "tilesmith.gate.worker.tensors", "tilesmith.gate.worker.fingerprint", "tilesmith.gate.worker.patches",
           "time", "os",
           # ... and what its numbers reach the deciding process through (a wrapped json.dumps that shortened
           # the candidate's samples in the reply was accepted at 1.6x on the original's own code)
           "json", "json.encoder", "json.decoder")
CLASSES = (("torch", "Tensor"), ("torch._C", "TensorBase"), ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner"),
           ("torch._inductor.runtime.triton_heuristics", "GridExpr"), ("torch.cuda", "Stream"), ("torch.cuda", "Event"),
           ("torch._C", "Generator"), ("torch._inductor.cudagraph_trees", "CUDAGraphTreeManager"),
           ("torch._inductor.cudagraph_trees", "CUDAGraphNode"), ("torch._inductor.cudagraph_trees", "CUDAWarmupNode"),
           ("json", "JSONEncoder"), ("json", "JSONDecoder"))
_LAZY = ("torch._inductor.runtime", "torch._inductor.cudagraph_trees", "torch._inductor.compile_fx",
         "torch._inductor.cudagraph_utils")  # watched only once imported: importing them costs a CPU worker seconds


def _namespaces(extra: dict) -> dict[str, dict]:
    out = {}
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is None and not name.startswith(_LAZY):
            try:
                mod = importlib.import_module(name)
            except Exception:  # absent on this build (triton not installed): nothing to patch there
                continue
        if mod is not None:
            out[name] = vars(mod) if hasattr(mod, "__dict__") else {}
    for mod_name, cls in CLASSES:
        obj = getattr(sys.modules.get(mod_name), cls, None)
        if obj is not None:
            out[f"{mod_name}.{cls}"] = dict(vars(obj))
    ek = getattr(sys.modules.get("torch._inductor.select_algorithm"), "extern_kernels", None)
    if ek is not None and hasattr(ek, "__dict__"):
        out["extern_kernels"] = vars(ek)
    aten = getattr(getattr(sys.modules.get("torch"), "ops", None), "aten", None)
    if aten is not None:
        out["torch.ops.aten"] = vars(aten)
    out.update(extra)
    return out


def snapshot(extra: dict | None = None) -> dict[str, dict]:
    """{namespace: {attribute: object}} for every watched namespace; `extra` adds namespaces by name (the
    globals of a wrapper already loaded). The objects themselves are kept, so none is freed and its
    address reused by a replacement."""
    return {ns: dict(list(d.items())) for ns, d in _namespaces(extra or {}).items()}


def replaced(before: dict, extra: dict | None = None, most: int = 5) -> list[str]:
    """Attributes of `before` that are gone or hold another object now (up to `most`, for the message)."""
    now = _namespaces(extra or {})
    out = []
    for ns, ids in before.items():
        d = now.get(ns)
        if d is None:
            out.append(ns)
            continue
        for k, obj in ids.items():
            if d.get(k, _MISSING) is not obj:
                out.append(f"{ns}.{k}")
                if len(out) >= most:
                    return out
    return out


_MISSING = object()
