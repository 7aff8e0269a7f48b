"""The allowlist for a kernel definition, `name = async_compile.triton(name, '''...''', device_str=...)` or
`async_compile.cpp_pybinding([argument types], '''...''')`: literal arguments only, C types that are types (Inductor
pastes them into the C++ it compiles), and the Triton source checked as what it is.

A Triton source is a Python module Inductor writes to its cache and imports, so it is checked as Python, with rules
of its own (stdlib only):

- module level: the imports Inductor writes (triton, triton.language, the torch._inductor.runtime pieces: helpers,
  heuristics, hints, libdevice), `triton_helpers.set_driver_to_gpu()`, literal constants, and functions decorated
  `@triton.jit`, optionally under one of Inductor's heuristics decorators (gate/allowlist_tables.HEURISTICS);
- the heuristics' arguments are data: literals, `DeviceProperties(...)`, hint enum members, `set()`, `__file__`.
  Strings in them must look like names (`[A-Za-z0-9_.*:-]`): the autotuner builds launcher code from the
  signature, the grid and the configs and exec()s it, so a string there would be code. The meta dictionaries
  carry only the keys Inductor writes (those whose strings are code, or name files and remote caches, are out);
- the jit bodies reach triton.language (its `__all__`), the helpers and libdevice, and values' Triton attributes
  (gate/allowlist_tables.TL_VALUE_ATTRS); no lambdas, classes, imports or scope statements inside them.
A jit body is compiled, not run, but Triton evaluates attributes and some calls in it at compile time, in the
process that imports the module: the same path rules as a wrapper's apply.
"""

from __future__ import annotations

import ast
import re

from tilesmith.gate import allowlist_tables as T
from tilesmith.gate.allowlist_base import IDENT, Checker, Finding

_SAFE_STR = re.compile(r"[A-Za-z0-9_.*:\-]*")
_CTYPE = re.compile(r"(const )?[A-Za-z_][A-Za-z0-9_:]*( ?\*)?")  # a cpp_pybinding argument type: `const float*`
_HEURISTICS = "torch._inductor.runtime.triton_heuristics."


def check_source(src: str) -> list[Finding]:
    """Everything in one Triton kernel module outside the allowlist (lines counted in `src`)."""
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        return [Finding("allowlist-syntax", f"does not parse: {e.msg}", e.lineno or 0)]
    c = Checker(tree, kernel=True)
    collect(c)
    c.visit_module()
    return sorted(c.found, key=lambda f: f.line)


def definition(c: Checker, name: str, call: ast.Call) -> None:
    """`k = async_compile.triton('k', '''<module>''', device_str='cuda')` or `.cpp_pybinding([types], '''<C++>''')`:
    literal arguments only; a Triton module is checked as the Python it is."""
    kind = call.func.attr
    lits = [a for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(call.args) != 2 or len(lits) != (2 if kind == "triton" else 1):
        c.flag("allowlist-kernel", f"{name}: {kind} takes literal arguments only", call)
        return
    if kind == "triton":
        if any(k.arg != "device_str" or not isinstance(k.value, ast.Constant) for k in call.keywords) \
                or not IDENT.fullmatch(call.args[0].value):
            c.flag("allowlist-kernel", f"{name}: triton takes a kernel name and device_str literals", call)
        for f in check_source(call.args[1].value):
            c.found.append(Finding(f.code, f"kernel {name} line {f.line}: {f.message}", call.lineno))
        return
    types = call.args[0]
    if call.keywords or not isinstance(types, ast.List) or not all(
            isinstance(t, ast.Constant) and isinstance(t.value, str) and _CTYPE.fullmatch(t.value) for t in types.elts):
        c.flag("allowlist-kernel", f"{name}: cpp_pybinding takes a list of C argument types and a source", call)


def collect(c: Checker) -> None:
    """The kernel module's names, and its module-level statements checked for shape (Checker.visit_module then
    visits the rest)."""
    for node in c.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _bind(c, node)
    for node in c.tree.body:
        if isinstance(node, ast.FunctionDef):
            c.define(node.name, node, kind=("jit",))
    for node in c.tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not node.value.args \
                and not node.value.keywords and c.path_of(node.value.func) == "torch._inductor.runtime.triton_helpers.set_driver_to_gpu":
            c.handled.add(id(node.value))
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            _data(c, node.value, "a module constant")
            c.handled.add(id(node.value))
        elif isinstance(node, ast.FunctionDef):
            _jit_function(c, node)
        else:
            c.flag("allowlist-kernel", f"a kernel module holds {type(node).__name__} at module level", node)
    c.kinds = {k: v for k, v in c.kinds.items() if v != ("jit",)}  # jit functions are plain values in bodies
    c.check_bindings()


def _bind(c: Checker, node) -> None:
    for a in node.names:
        if isinstance(node, ast.ImportFrom):
            if node.level or (node.module, a.name) not in T.KERNEL_FROM:
                c.flag("allowlist-import", f"a kernel imports {a.name} from {'.' * node.level}{node.module}", node)
                continue
            c.define(a.asname or a.name, node, path=f"{node.module}.{a.name}")
        elif a.name in T.KERNEL_IMPORT:
            c.define(a.asname or a.name.split(".")[0], node, path=a.name if a.asname else a.name.split(".")[0])
        else:
            c.flag("allowlist-import", f"a kernel imports {a.name}", node)


def _jit_function(c: Checker, node: ast.FunctionDef) -> None:
    decos = node.decorator_list
    jit = decos[-1] if decos else None
    jit_call = isinstance(jit, ast.Call)
    if jit is None or c.path_of(jit.func if jit_call else jit) != "triton.jit":
        c.flag("allowlist-kernel", f"{node.name} is not a @triton.jit function", node)
        return
    if jit_call:
        if jit.args or any(k.arg not in ("noinline", "do_not_specialize", "do_not_specialize_on_alignment")
                           for k in jit.keywords):
            c.flag("allowlist-kernel", f"{node.name}: @triton.jit takes noinline and do_not_specialize only", jit)
        for k in jit.keywords:
            _data(c, k.value, "@triton.jit")
    for d in decos[:-1]:
        _heuristics(c, d, node.name)
    for d in decos:
        c.handled.add(id(d))
    a = node.args
    for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
        if not isinstance(default, ast.Constant):
            c.flag("allowlist-kernel", f"{node.name}: a parameter's default is not a literal", default)
    if a.vararg or a.kwarg:
        c.flag("allowlist-kernel", f"{node.name}: *args or **kwargs", node)
    for n in ast.walk(node):
        if isinstance(n, (ast.Lambda, ast.ClassDef, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.With,
                          ast.Try, ast.AsyncFunctionDef)) or (isinstance(n, ast.FunctionDef) and n is not node):
            c.flag("allowlist-kernel", f"{node.name}: a jit body holds {type(n).__name__}", n)


def _heuristics(c: Checker, d, fn: str) -> None:
    path = c.path_of(d.func) if isinstance(d, ast.Call) else None
    if path is None or not path.startswith(_HEURISTICS) or path[len(_HEURISTICS):] not in T.HEURISTICS:
        c.flag("allowlist-kernel", f"{fn}: decorator {ast.unparse(d)[:60]} is not one of Inductor's heuristics", d)
        return
    for a in d.args:
        _data(c, a, path)
    for k in d.keywords:
        if k.arg is None:
            c.flag("allowlist-kernel", f"{fn}: ** in a heuristics decorator", d)
        elif k.arg == "filename":
            if not (isinstance(k.value, ast.Name) and k.value.id == "__file__"):
                c.flag("allowlist-kernel", f"{fn}: filename is not __file__", k.value)
        elif k.arg in ("triton_meta", "inductor_meta"):
            _meta(c, k.value, k.arg, fn)
        else:
            _data(c, k.value, k.arg)


def _meta(c: Checker, node, which: str, fn: str) -> None:
    keys = T.TRITON_META if which == "triton_meta" else T.INDUCTOR_META
    if not isinstance(node, ast.Dict):
        c.flag("allowlist-kernel", f"{fn}: {which} is not a literal dictionary", node)
        return
    for k, v in zip(node.keys, node.values):
        key = k.value if isinstance(k, ast.Constant) else None
        if key not in keys:
            c.flag("allowlist-kernel", f"{fn}: {which} key {ast.unparse(k) if k else '**'} is not one Inductor writes", node)
            continue
        if key in T.META_FIXED and not (isinstance(v, ast.Constant) and v.value in T.META_FIXED[key]):
            c.flag("allowlist-kernel", f"{fn}: {which}[{key!r}] is {ast.unparse(v)}, not Inductor's default", v)
        elif key in T.META_NAMES:
            if not (isinstance(v, ast.List) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                    and IDENT.fullmatch(e.value) for e in v.elts)):
                c.flag("allowlist-kernel", f"{fn}: {which}[{key!r}] is not a list of names", v)
        elif key == "precomputed_grids":
            _grids(c, v, fn)
        else:
            _data(c, v, f"{which}[{key!r}]")


def _grids(c: Checker, node, fn: str) -> None:
    """precomputed_grids (a user Triton kernel's launch grids per config): the autotuner exec()s the "python"
    entries in its launcher, so each must be arithmetic on names and integers; "cpp" ones (C++ wrappers only) the
    same characters."""
    ok = isinstance(node, ast.List)
    for entry in node.elts if ok else ():
        if not isinstance(entry, ast.Dict) or not all(isinstance(k, ast.Constant) for k in entry.keys):
            ok = False
            continue
        for k, v in zip(entry.keys, entry.values):
            if k.value == "config":
                _data(c, v, "a precomputed grid's config")
            elif k.value in ("python", "python_slow", "cpp") and isinstance(v, ast.List):
                ok = ok and all(isinstance(e, ast.Constant) and isinstance(e.value, str) and _arithmetic(e.value, k.value)
                                for e in v.elts)
            else:
                ok = False
    if not ok:
        c.flag("allowlist-kernel", f"{fn}: precomputed_grids holds more than arithmetic on names", node)


_ARITH = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv,
          ast.Mod, ast.Pow, ast.USub, ast.UAdd)
_CPP_ARITH = re.compile(r"[A-Za-z0-9_ ()+\-*/%<>:,.]*")


def _arithmetic(expr: str, lang: str) -> bool:
    if lang == "cpp":
        return _CPP_ARITH.fullmatch(expr) is not None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False
    return all(isinstance(n, _ARITH) or (isinstance(n, ast.Constant) and type(n.value) is int) for n in ast.walk(tree))


def _data(c: Checker, node, where: str) -> None:
    """Literal data only: constants (strings that look like names), containers of data, DeviceProperties(...) and
    set() calls, members of the hint enums."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str) and not _SAFE_STR.fullmatch(node.value):
            c.flag("allowlist-kernel", f"{where}: the string {node.value[:40]!r} is not a name", node)
        return
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for e in node.elts:
            _data(c, e, where)
        return
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            if k is None:
                c.flag("allowlist-kernel", f"{where}: ** in data", node)
            else:
                _data(c, k, where)
            _data(c, v, where)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return
    if isinstance(node, ast.Call) and not node.args and (
            (isinstance(node.func, ast.Name) and node.func.id == "set" and not node.keywords)
            or c.path_of(node.func) == "torch._inductor.runtime.hints.DeviceProperties"):
        for k in node.keywords:
            if k.arg is None:
                c.flag("allowlist-kernel", f"{where}: ** in data", node)
            else:
                _data(c, k.value, where)
        return
    path = c.path_of(node)
    if path is not None and path.startswith("torch._inductor.runtime.hints.") and path.split(".")[-1].isupper() \
            and T.classify(path, kernel=True) == "leaf":
        return  # ReductionHint.INNER and the like
    c.flag("allowlist-kernel", f"{where}: {ast.unparse(node)[:60]} is not literal data", node)
