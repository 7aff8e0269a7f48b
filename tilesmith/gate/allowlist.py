"""The static stage's allowlist: a candidate is accepted only if everything it does is what a kernel wrapper needs.

Read from the syntax tree (stdlib only), whatever the source spells: every name is resolved to the dotted path it
stands for (`aten.mm.default` is `torch.ops.aten.mm.default`, through any import or alias) and every path must be
one the tables allow (gate/allowlist_tables.py); anything else a wrapper touches is a value (a tensor, a list), whose
attributes must be value attributes (tensor methods, container methods), never private or dunder ones. So `torch.os`,
`torch._dynamo.utils.sys`, `torch.library`, `operator.attrgetter`, `sys.modules` are out because nothing lists them,
not because a list of tricks names them. Also out: code from strings (exec, eval, compile, __import__: builtins that
are not on the list), attributes reached by a computed name (getattr/hasattr take a literal, checked as an attribute;
setattr never), attributes set on anything but the wrapper's own objects, classes that subclass anything but the
wrapper's own classes (a tensor subclass changes what torch does with its values), and a name that rebinds an
imported one.

Inductor's header binds modules it never uses (os, tempfile, random, ctypes' types): they may be bound and never
read (gate/allowlist_tables.INERT). Kernel sources are code too: the strings given to `async_compile.triton` are
Python modules Inductor imports, checked by gate/allowlist_kernel.py; those given to `async_compile.cpp_pybinding`
become native code, checked after the build by gate/allowlist_native.py.

The rules and the walk over the nodes are gate/allowlist_base.py's Checker; this module collects a wrapper's names
(collect), and gate/allowlist_kernel.py a Triton kernel module's.
"""

from __future__ import annotations

import ast

from tilesmith.gate import allowlist_tables as T
from tilesmith.gate.allowlist_base import Checker, Finding
from tilesmith.gate.allowlist_kernel import definition

CODES = ("allowlist-syntax", "allowlist-import", "allowlist-attribute", "allowlist-name", "allowlist-dynamic-code",
         "allowlist-kernel", "allowlist-native-symbol")


def check(text: str) -> list[Finding]:
    """Everything in the wrapper source `text` (FX header allowed) outside the allowlist, Triton kernels included."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        return [Finding("allowlist-syntax", f"does not parse: {e.msg}", e.lineno or 0)]
    c = Checker(tree, kernel=False)
    collect(c)
    c.visit_module()
    return sorted(c.found, key=lambda f: f.line)


def collect(c: Checker) -> None:
    """A wrapper's names: its imports, its own classes, its module-level aliases and objects (Checker.visit_module
    then checks every node)."""
    for node in c.sites:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _bind_import(c, node)
    for node in c.tree.body:
        if isinstance(node, ast.ClassDef):
            c.define(node.name, node, kind=("class", node.name))
            c.own[node.name] = _own_attributes(node)
    for node in c.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            _bind_assign(c, node.targets[0].id, node)
    c.check_bindings()


def _bind_import(c: Checker, node) -> None:
    for a in node.names:
        if isinstance(node, ast.ImportFrom):
            if node.level or a.name == "*" or node.module not in T.FROM_MODULES:
                c.flag("allowlist-import", f"imports from {'.' * node.level}{node.module}", node)
                continue
            path, name = f"{node.module}.{a.name}", a.asname or a.name
        else:
            if a.name not in T.IMPORTABLE and a.name not in T.INERT:
                c.flag("allowlist-import", f"imports {a.name}", node)
                continue
            path, name = (a.name, a.asname) if a.asname else (a.name.split(".")[0], a.name.split(".")[0])
        if T.classify(path) is None:
            c.flag("allowlist-import", f"imports {path}", node)
        else:
            c.define(name, node, path=path)


def _bind_assign(c: Checker, name: str, node: ast.Assign) -> None:
    v, node = node.value, node.targets[0]  # the target is where the name is bound
    path = c.path_of(v)
    if path is not None and T.classify(path) is not None:
        c.define(name, node, path=path)  # an alias of a module-level path: `aten = torch.ops.aten`
        c.handled.add(id(v))
    elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and c.kinds.get(v.func.id, ("",))[0] == "class":
        c.define(name, node, kind=("instance", v.func.id))  # runner = Runner(partitions=[])
    elif isinstance(v, ast.Call) and c.path_of(v.func) == "torch._inductor.async_compile.AsyncCompile" \
            and name == "async_compile" and not v.args and not v.keywords:
        c.define(name, node, kind=("async",))
        c.handled.add(id(v))
    elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and isinstance(v.func.value, ast.Name) \
            and c.kinds.get(v.func.value.id) == ("async",) and v.func.attr in ("triton", "cpp_pybinding"):
        c.define(name, node, kind=("triton",) if v.func.attr == "triton" else ("cpp",))
        c.handled.add(id(v))
        definition(c, name, v)


def _own_attributes(cls: ast.ClassDef) -> set[str]:
    """What a class of the wrapper's own defines: its methods and class attributes, and what its methods set on self."""
    out = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(n.name)
            params = n.args.posonlyargs + n.args.args
            me = params[0].arg if params else None
            for m in ast.walk(n):
                if isinstance(m, ast.Attribute) and not isinstance(m.ctx, ast.Load) and isinstance(m.value, ast.Name) \
                        and m.value.id == me:
                    out.add(m.attr)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                out.update(x.id for x in ast.walk(t) if isinstance(x, ast.Name))
    return {a for a in out if not (a.startswith("__") and a.endswith("__")) or a in T.OWN_DUNDERS}
