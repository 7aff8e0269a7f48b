"""Stage 1, the static screen: parse the candidate and flag constructs only a cheat needs; then the allowlist.

Two checks, both stdlib only (ast). `screen` is a list of the constructs only a cheat needs (state kept across
calls, streams, timers, frames): tricks it knows. `allowlist` (gate/allowlist.py) accepts only what a kernel wrapper
needs, whatever it spells, and `native` checks the shared libraries a candidate's C++ kernels were built into, after
the worker loaded them (gate/allowlist_native.py). The three are one stage: a test that switches `screen` off (to
test the dynamic defences alone, tests/test_gate_redteam.py) switches the allowlist off with it.

The screen (stdlib only, ast). Inductor's own wrappers must pass: they import os, tempfile, random and a few ctypes
types at top level and never use them in call(); they allocate inside call() only; the Runner keeps
its kernels on `self`. Kernel source strings handed to `async_compile.cpp_pybinding` are C++ that runs
in-process, so they are screened for threads, environment, files and processes too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass



@dataclass
class Finding:
    code: str
    message: str
    line: int


# Modules a wrapper never needs: importing them is already the finding.
_MODULES = {
    "threading": "static-threads", "_thread": "static-threads", "multiprocessing": "static-threads",
    "concurrent": "static-threads", "asyncio": "static-threads", "subprocess": "static-processes",
    "signal": "static-processes", "pty": "static-processes", "socket": "static-network",
    "ssl": "static-network", "http": "static-network", "urllib": "static-network", "requests": "static-network",
    "time": "static-timing", "timeit": "static-timing", "datetime": "static-timing", "resource": "static-timing",
    "inspect": "static-frames", "traceback": "static-frames", "gc": "static-frames", "sys": "static-frames",
    "importlib": "static-dynamic-code", "runpy": "static-dynamic-code", "pickle": "static-dynamic-code",
    "marshal": "static-dynamic-code", "builtins": "static-dynamic-code", "code": "static-dynamic-code",
    "ctypes": "static-native", "cffi": "static-native", "mmap": "static-native",
    "shutil": "static-files", "pathlib": "static-files", "io": "static-files", "glob": "static-files",
    "atexit": "static-module-state", "functools": "static-module-state", "weakref": "static-module-state",
    "copyreg": "static-module-state",
}
# Names from `from ctypes import ...` that Inductor's header uses and that do nothing by themselves.
_CTYPES_OK = {"c_void_p", "c_long", "c_int", "c_float", "c_double", "c_char_p", "c_size_t", "c_bool", "c_uint"}
# Builtins (and dunder attributes) that reach code, frames, files or the environment.
_NAMES = {
    "open": "static-files", "exec": "static-dynamic-code", "eval": "static-dynamic-code",
    "compile": "static-dynamic-code", "__import__": "static-dynamic-code", "globals": "static-module-state",
    "locals": "static-frames", "vars": "static-frames", "breakpoint": "static-frames", "input": "static-files",
    "setattr": "static-patching", "delattr": "static-patching", "__builtins__": "static-dynamic-code",
    "exit": "static-processes", "quit": "static-processes",
}
_ATTRS = {
    "__dict__": "static-patching", "__class__": "static-patching", "__subclasses__": "static-patching",
    "__globals__": "static-frames", "__code__": "static-frames", "__closure__": "static-frames",
    "__builtins__": "static-dynamic-code", "__bases__": "static-patching", "__mro__": "static-patching",
    "__getattribute__": "static-patching", "__setattr__": "static-patching", "__reduce__": "static-patching",
    "f_locals": "static-frames", "f_globals": "static-frames", "f_back": "static-frames",
    "gi_frame": "static-frames", "tb_frame": "static-frames", "_getframe": "static-frames",
    "settrace": "static-frames", "setprofile": "static-frames",
    "environ": "static-environment", "getenv": "static-environment", "putenv": "static-environment",
    "environb": "static-environment",
    # Streams and events: the launch stream is the caller's; a new one only hides work from timing.
    "Stream": "static-streams", "ExternalStream": "static-streams", "Event": "static-streams",
    "set_stream": "static-streams", "stream": "static-streams", "default_stream": "static-streams",
    "current_stream": "static-streams", "synchronize": "static-streams", "elapsed_time": "static-timing",
    "perf_counter": "static-timing", "perf_counter_ns": "static-timing", "monotonic": "static-timing",
    "cpp_extension": "static-native", "load_inline": "static-native", "cdll": "static-native",
    "CDLL": "static-native", "pythonapi": "static-native", "data": "static-patching",
    "set_": "static-patching", "register_forward_hook": "static-patching", "lru_cache": "static-module-state",
    "cudagraph_trees": "static-patching", "cudagraphify": "static-patching", "cudagraph_utils": "static-patching",
}
_OS_OK = {"path"}  # `os.path.join` and friends are harmless; every other os.* use is flagged
_OS_PATH_OK = {"join", "dirname", "basename", "splitext", "abspath"}
# Roots whose attributes must never be assigned: that is patching a library or a timer.
_PATCH_ROOTS = {"torch", "triton", "tl", "math", "os", "random", "aten", "extern_kernels", "inductor_ops",
                "async_compile", "np", "numpy", "tempfile", "device", "empty_strided", "reinterpret_tensor"}
_ALLOC = {"empty", "zeros", "ones", "full", "empty_strided", "empty_like", "zeros_like", "ones_like", "randn",
          "rand", "tensor", "arange", "empty_strided_cpu", "empty_strided_cuda", "empty_strided_xpu"}
_CPP_BAD = re.compile(r"std::thread|pthread_create|\bgetenv\b|\bfopen\b|\bifstream\b|\bofstream\b|\bsystem\s*\("
                      r"|\bpopen\b|\bdlopen\b|\bfork\s*\(|\bexecv|\bsleep\s*\(|\busleep\b|std::async|\bsignal\s*\("
                      r"|\bclock_gettime\b|std::chrono|<thread>|<fstream>|<unistd.h>|<dlfcn.h>|\bstatic\s+\w")


def screen(text: str) -> list[Finding]:
    """Every construct in `text` (wrapper source, FX header allowed) that only a cheat needs."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return [Finding("static-syntax", f"does not parse: {e.msg} (line {e.lineno})", e.lineno or 0)]
    found: list[Finding] = []
    if not _defines_call(tree):
        found.append(Finding("static-no-call", "defines no module-level call(args)", 0))
    module_mutables = _module_mutables(tree)
    allowed = _inductor_idioms(tree)
    for node in ast.walk(tree):
        if id(node) not in allowed:
            found += _check_node(node, module_mutables)
    found += _check_module_level(tree)
    seen, unique = set(), []
    for f in sorted(found, key=lambda f: f.line):
        if (f.code, f.line) not in seen:
            seen.add((f.code, f.line))
            unique.append(f)
    return unique


def _inductor_idioms(tree: ast.Module) -> set[int]:
    """ids of nodes that are Inductor's own idiom: `async_compile.wait(globals())` at module level."""
    ok = set()
    for node in tree.body:
        v = node.value if isinstance(node, ast.Expr) else None
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "wait" \
                and len(v.args) == 1 and isinstance(v.args[0], ast.Call) and isinstance(v.args[0].func, ast.Name) \
                and v.args[0].func.id == "globals" and not v.args[0].args:
            ok.add(id(v.args[0].func))
    return ok


def _defines_call(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "call" for t in node.targets):
            return True
    return False


def _root(node) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _check_node(node, module_mutables: set[str]) -> list[Finding]:
    line = getattr(node, "lineno", 0)
    out = []
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        out += _check_import(node)
    elif isinstance(node, ast.Name) and node.id in _NAMES:
        out.append(Finding(_NAMES[node.id], f"uses {node.id}", line))
    elif isinstance(node, ast.Attribute):
        out += _check_attribute(node)
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        out.append(Finding("static-module-state", f"declares {type(node).__name__.lower()} {', '.join(node.names)}: "
                                                  "state that survives a call", line))
    elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and _root(t) in _PATCH_ROOTS:
                out.append(Finding("static-patching", f"assigns {ast.unparse(t)}: patches a library", line))
    elif isinstance(node, ast.Call):
        out += _check_call(node, module_mutables)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        if any(isinstance(d, (ast.List, ast.Dict, ast.Set, ast.Call)) for d in defaults):
            out.append(Finding("static-module-state", "a mutable default argument survives calls", line))
    if isinstance(node, (ast.Assign, ast.AugAssign)) and isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Subscript) and _root(t) in module_mutables:
                out.append(Finding("static-module-state", f"writes into module-level {_root(t)}", line))
    return out


# The vetted helpers a candidate may import (module -> the one name): trusted code that needs what
# candidates may not touch (streams, events, state across calls).
_HELPERS = {"tilesmith.cudagraph": "graphed", "tilesmith.streams": "side_by_side"}
# Inductor's CUDA-graph machinery: a wrapper never needs it, and a candidate that changed it could speed its
# own calls through the trees (or slow the original's) where the gate and the program run both through them.
_TREES_NAMES = ("cudagraph_trees", "compile_fx", "cudagraph_utils")
_TREES = tuple(f"torch._inductor.{m}" for m in _TREES_NAMES)


def _check_import(node) -> list[Finding]:
    line = node.lineno
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        names = [node.module or ""]
        if node.module == "ctypes" and all(a.name in _CTYPES_OK for a in node.names):
            return []
        if node.module == "os" and any(a.name not in _OS_OK for a in node.names):
            return [Finding("static-environment", "imports from os", line)]
    if any(n.split(".")[0] == "tilesmith" for n in names):
        # One sanctioned helper (trusted code a candidate cannot write itself); the rest of tilesmith
        # reaches the store, the gate and the environment.
        if isinstance(node, ast.ImportFrom) and node.module in _HELPERS \
                and all(a.name == _HELPERS[node.module] for a in node.names):
            return []
        return [Finding("static-tilesmith", f"imports {names[0]}: a candidate may import only "
                                            "`from tilesmith.cudagraph import graphed` and "
                                            "`from tilesmith.streams import side_by_side`", line)]
    out = []
    for n in names:
        top = n.split(".")[0]
        if top in _MODULES:
            out.append(Finding(_MODULES[top], f"imports {n}", line))
        elif n.startswith("torch.utils.cpp_extension"):
            out.append(Finding("static-native", f"imports {n}", line))
        elif n.startswith(_TREES) or (n == "torch._inductor" and isinstance(node, ast.ImportFrom)
                                      and any(a.name in _TREES_NAMES for a in node.names)):
            out.append(Finding("static-patching", f"imports {n}: the cudagraph trees the gate times candidates "
                                                  "through, and the program runs them through", line))
    return out


def _check_attribute(node: ast.Attribute) -> list[Finding]:
    line = node.lineno
    base = node.value
    if isinstance(base, ast.Name) and base.id == "os" and node.attr not in _OS_OK:
        code = "static-environment" if node.attr in ("environ", "getenv", "putenv", "environb") else "static-processes"
        return [Finding(code, f"uses os.{node.attr}", line)]
    if (isinstance(base, ast.Attribute) and base.attr == "path" and isinstance(base.value, ast.Name)
            and base.value.id == "os" and node.attr not in _OS_PATH_OK):
        return [Finding("static-files", f"uses os.path.{node.attr}", line)]
    if isinstance(base, ast.Name) and base.id in ("tempfile", "random"):
        return [Finding("static-files" if base.id == "tempfile" else "static-module-state",
                        f"uses {base.id}.{node.attr}", line)]
    if node.attr in _ATTRS:
        return [Finding(_ATTRS[node.attr], f"uses .{node.attr}", line)]
    return []


def _check_call(node: ast.Call, module_mutables: set[str]) -> list[Finding]:
    line = node.lineno
    out = []
    f = node.func
    if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr"):
        name = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) or name.value.startswith("_") \
                or name.value in _ATTRS:
            out.append(Finding("static-dynamic-code", f"{f.id} with a computed or private name", line))
    if isinstance(f, ast.Attribute) and f.attr == "cpp_pybinding":
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
                m = _CPP_BAD.search(a.value)
                if m:
                    out.append(Finding("static-native", f"C++ kernel source uses {m.group(0)!r}", line))
    mutators = {"append", "extend", "update", "setdefault", "add", "insert", "pop", "__setitem__", "copy_"}
    if isinstance(f, ast.Attribute) and f.attr in mutators and _root(f.value) in module_mutables \
            and isinstance(f.value, ast.Name):
        out.append(Finding("static-module-state", f"mutates module-level {_root(f.value)}", line))
    return out


def _module_mutables(tree: ast.Module) -> set[str]:
    """Module-level names bound to a container or a tensor allocation: candidates for cross-call state."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_mutable_value(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _is_mutable_value(v) -> bool:
    if isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(v, ast.Call):
        f = v.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in ("dict", "list", "set", "defaultdict", "OrderedDict", "deque") or name in _ALLOC
    return False


def _check_module_level(tree: ast.Module) -> list[Finding]:
    """Tensors allocated at import time live across calls (a reused output buffer, a cache)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_mutable_value(node.value):
            f = node.value.func
            name = f.id if isinstance(f, ast.Name) else f.attr
            if name in _ALLOC:
                out.append(Finding("static-module-state", f"allocates a tensor at import ({name}): it outlives calls",
                                   node.lineno))
    return out


# -- the allowlist (gate/allowlist.py, gate/allowlist_native.py) ---------------------------------------------------

def allowlist(text: str) -> list[Finding]:
    """Everything in `text` outside the allowlist: Python by its syntax tree, Triton kernels' sources too."""
    if not _on():
        return []
    from tilesmith.gate import allowlist as al

    return [Finding(f.code, f.message, f.line) for f in al.check(text)]


def native(worker) -> list[Finding]:
    """The shared libraries a loaded gate worker (gate.proc.Worker) mapped from the folders builds land in (Inductor's
    caches, the worker's own folder), read by this process from /proc, checked against the native allowlist. Triton's
    cache is left out: its launchers are built by Triton from its own template, never from candidate text."""
    if not _on():
        return []
    from tilesmith.launch import sandbox
    from tilesmith.gate import allowlist_native

    caches = sandbox.shared_caches()
    under = (caches["TORCHINDUCTOR_CACHE_DIR"], caches["TILESMITH_INDUCTOR_DEFAULT_DIR"], str(worker.dir))
    found = allowlist_native.check_process(worker.proc.pid, under, (caches["TRITON_CACHE_DIR"],))
    return [Finding(f.code, f.message, 0) for f in found]


def _on() -> bool:
    return screen is _SCREEN  # a test replaced the screen: the whole static stage is off


_SCREEN = screen
