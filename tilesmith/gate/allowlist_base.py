"""What the wrapper's allowlist (gate/allowlist.py) and the Triton kernel's (gate/allowlist_kernel.py) share, stdlib
only: a Finding, the pattern of an identifier, and the Checker, which holds one module's names (what each stands for)
and checks every node against the rules. Each of the two modules collects its kind of module's names into a Checker
(its own `collect`) and then has the Checker visit the module; this one imports neither.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

from tilesmith.gate import allowlist_tables as T

_BUILTIN_NAMES = frozenset(dir(builtins))
_DYNAMIC = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "setattr", "delattr", "dir"}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Finding:
    code: str
    message: str
    line: int


class Checker(ast.NodeVisitor):
    """One module's names (what each stands for), then every node against the rules. kernel: a Triton kernel
    module's rules (gate/allowlist_kernel.py) instead of a wrapper's."""

    def __init__(self, tree: ast.Module, kernel: bool):
        self.tree, self.kernel = tree, kernel
        self.found: list[Finding] = []
        self.paths: dict[str, str] = {}  # name -> the dotted path it stands for (imports, module-level aliases)
        self.kinds: dict[str, tuple] = {}  # name -> ("async",) ("triton",) ("cpp",) ("class", C) ("instance", C)
        self.own: dict[str, set[str]] = {}  # the wrapper's own classes -> the attributes they define
        self.handled: set[int] = set()  # ids of nodes checked as a whole (kernel definitions, Inductor's idioms)
        self.defs: dict[str, set[int]] = {}  # name -> ids of the statements that define it
        self.sites = [n for n in ast.walk(tree) if _bindings(n)]  # every node that binds a name (imports too)
        self.trailer = False  # inside Inductor's benchmarking trailer
        self.selfs: dict[str, str] = {}  # a method's first parameter -> its class

    def flag(self, code: str, message: str, node) -> None:
        self.found.append(Finding(code, message, getattr(node, "lineno", 0)))

    def visit_module(self) -> None:
        """Every module-level statement against the rules, once the names are collected (by gate/allowlist.py's
        collect or gate/allowlist_kernel.py's)."""
        for node in self.tree.body:
            self._top(node)

    # -- what the names stand for ----------------------------------------------------------------------------
    def define(self, name: str, node, path: str | None = None, kind: tuple | None = None) -> None:
        """`name` stands for `path` (or is a `kind` of object) from `node` on; once (an import may repeat)."""
        if name in self.kinds or (name in self.paths and (path is None or self.paths[name] != path)):
            self.flag("allowlist-name", f"binds {name} twice", node)
            return
        if path is not None:
            self.paths[name] = path
        else:
            self.kinds[name] = kind
        self.defs.setdefault(name, set()).add(id(node))

    def check_bindings(self) -> None:
        """Dunder names and left-out builtins are never bound; a name that stands for a path or an object of a
        known kind is bound only where it is defined."""
        for node in self.sites:
            for name in _bindings(node):
                if name.startswith("__") and name.endswith("__"):
                    if not isinstance(node, ast.FunctionDef):  # a dunder method: _function decides
                        self.flag("allowlist-name", f"binds {name}", node)
                elif name in _BUILTIN_NAMES and (name not in self._builtins() or name in ("getattr", "hasattr")):
                    self.flag("allowlist-name", f"binds {name}, a builtin the allowlist leaves out", node)
                elif (name in self.paths or name in self.kinds) and id(node) not in self.defs.get(name, ()):
                    self.flag("allowlist-name", f"rebinds {name}", node)

    def path_of(self, node) -> str | None:
        """The dotted path an attribute chain rooted at an imported name stands for (None: not such a chain)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.paths:
            return ".".join([self.paths[node.id]] + parts[::-1])
        return None

    # -- module level ----------------------------------------------------------------------------------------
    def _top(self, node) -> None:
        if _is_main_guard(node):
            self.trailer = True
            for n in node.body + node.orelse:
                self.visit(n)
            self.trailer = False
        elif isinstance(node, ast.FunctionDef) and node.name in T.TRAILER_FUNCTIONS and not self.kernel:
            self.trailer = True
            self.visit(node)
            self.trailer = False
        elif _is_wait_idiom(node, self.kinds) or _is_del_async(node, self.kinds):
            pass  # Inductor's `async_compile.wait(globals())` and `del async_compile`
        else:
            self.visit(node)

    # -- nodes -----------------------------------------------------------------------------------------------
    def visit_Import(self, node) -> None:
        self._import_use(node, [a.asname or a.name.split(".")[0] for a in node.names])

    def visit_ImportFrom(self, node) -> None:
        self._import_use(node, [a.asname or a.name for a in node.names])

    def _import_use(self, node, names: list[str]) -> None:
        for name in names:
            if self.paths.get(name) in T.TRAILER and not self.trailer:
                self.flag("allowlist-import", f"imports {self.paths[name]} outside Inductor's benchmarking trailer", node)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return  # bindings: _check_bindings
        name = node.id
        if name in self.paths:
            self._use_path(self.paths[name], node)
        elif name in self.kinds and self.kinds[name][0] in ("async", "triton", "cpp"):
            self.flag("allowlist-name", f"uses the kernel object {name} other than by launching it", node)
        elif name in self.kinds and self.kinds[name][0] == "class":
            # only made into instances: through the class, a method's `self` could be any object (a torch class)
            self.flag("allowlist-name", f"uses its class {name} other than by making an instance", node)
        elif name in T.TRAILER_FUNCTIONS and not self.trailer and not self.kernel:
            self.flag("allowlist-name", f"calls Inductor's benchmarking trailer ({name})", node)
        elif name in _BUILTIN_NAMES and name not in self._builtins():
            code = "allowlist-dynamic-code" if name in _DYNAMIC else "allowlist-name"
            self.flag(code, f"uses the builtin {name}", node)
        elif name.startswith("__") and name.endswith("__"):
            self.flag("allowlist-name", f"reads {name}", node)

    def _builtins(self) -> frozenset:
        return T.KERNEL_BUILTINS if self.kernel else T.BUILTINS

    def _use_path(self, path: str, node) -> None:
        if path in T.INERT:
            self.flag("allowlist-name", f"uses {path}, which only Inductor's header may import (unused)", node)
        elif path in T.TRAILER and not self.trailer:
            self.flag("allowlist-name", f"uses {path} outside Inductor's benchmarking trailer", node)
        elif path == "torch._inductor.async_compile.AsyncCompile":
            self.flag("allowlist-name", "makes an AsyncCompile other than Inductor's one", node)
        elif T.classify(path, self.kernel) == "namespace" and id(node) not in self.handled:
            self.flag("allowlist-attribute", f"uses the module {path} as a value", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) in self.handled:
            return
        chain, root = [], node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        chain.reverse()
        state = self._root_state(root)
        for i, attr in enumerate(chain):
            last = i == len(chain) - 1
            if last and not isinstance(node.ctx, ast.Load):
                if state[0] != "self":
                    self.flag("allowlist-attribute", f"sets or deletes .{attr} on an object it does not own", node)
                elif attr.startswith("__"):
                    self.flag("allowlist-attribute", f"sets .{attr}", node)
                break
            state = self._step(state, attr, node)
            if state is None:
                break
        else:
            if state[0] == "path" and T.classify(state[1], self.kernel) == "namespace":
                self.flag("allowlist-attribute", f"uses the module {state[1]} as a value", node)
            elif state[0] in ("async", "triton", "cpp"):
                self.flag("allowlist-name", "uses a kernel object other than by launching it", node)
        if not isinstance(root, ast.Name):
            self.visit(root)

    def _root_state(self, root) -> tuple:
        if not isinstance(root, ast.Name):
            return ("value",)
        name = root.id
        if name in self.paths:
            path = self.paths[name]
            if path in T.INERT or (path in T.TRAILER and not self.trailer):
                self._use_path(path, root)
                return ("stop",)
            return ("path", path)
        if name in self.kinds:
            return self.kinds[name]
        if name in self.selfs:
            return ("self", self.selfs[name])
        self.visit(root)
        return ("value",)

    def _step(self, state: tuple, attr: str, node) -> tuple | None:
        kind = state[0]
        if kind == "stop":
            return None
        if kind == "path":
            path = f"{state[1]}.{attr}"
            c = T.classify(path, self.kernel)
            if c is None:
                self.flag("allowlist-attribute", f"reaches {path}", node)
                return None
            return ("value",) if c == "leaf" else ("path", path)
        if kind == "triton" and attr == "run":
            return ("value",)
        if kind in ("self", "instance") and attr in self.own.get(state[1], ()):
            return ("value",)
        if kind == "value" and not attr.startswith("_") and attr in (T.TL_VALUE_ATTRS if self.kernel else T.VALUE_ATTRS):
            return ("value",)
        what = {"value": "a value", "async": "the AsyncCompile", "triton": "a Triton kernel", "cpp": "a C++ kernel"}
        self.flag("allowlist-attribute", f"reaches .{attr} on {what.get(kind, f'its own {state[-1]}')}", node)
        return None

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) in self.handled:
            return
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr"):
            self._literal_getattr(node)
            return
        if not (isinstance(f, ast.Name) and self.kinds.get(f.id, ("",))[0] in ("cpp", "class")):
            self.visit(f)  # (a C++ kernel is launched by calling it, a class of its own called to make an instance)
        for a in node.args + [k.value for k in node.keywords]:
            self.visit(a)

    def _literal_getattr(self, node: ast.Call) -> None:
        args = node.args
        name = args[1] if len(args) >= 2 else None
        if node.keywords or not (isinstance(name, ast.Constant) and isinstance(name.value, str)) \
                or not IDENT.fullmatch(name.value) or name.value.startswith("_") or len(args) > 3:
            self.flag("allowlist-dynamic-code", f"{node.func.id} with a computed or private name", node)
            return
        self.visit(ast.copy_location(ast.Attribute(value=args[0], attr=name.value, ctx=ast.Load()), node))
        for a in args[2:]:
            self.visit(a)

    def visit_FunctionDef(self, node) -> None:
        self._function(node, None)

    def visit_AsyncFunctionDef(self, node) -> None:
        self.flag("allowlist-syntax", f"defines the coroutine {node.name}", node)

    def visit_Await(self, node) -> None:
        self.flag("allowlist-syntax", "awaits", node)

    def _function(self, node, cls: str | None) -> None:
        dunder = node.name.startswith("__") and node.name.endswith("__")
        if dunder and not (cls is not None and node.name in T.OWN_DUNDERS):
            self.flag("allowlist-name", f"defines {node.name}", node)
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        saved = dict(self.selfs)
        params = node.args.posonlyargs + node.args.args
        for p in params + node.args.kwonlyargs:
            self.selfs.pop(p.arg, None)  # a parameter of a nested function is not its method's self
        if cls is not None and params and self._plain_method(node, params[0].arg):
            self.selfs[params[0].arg] = cls
        for n in node.body:
            self.visit(n)
        self.selfs = saved

    def _plain_method(self, node, me: str) -> bool:
        """Whether `me`, the method's first parameter, is its instance for sure: no decorator (a staticmethod's
        first parameter is anything) and never rebound in it."""
        if node.decorator_list:
            self.flag("allowlist-syntax", f"method {node.name} has decorators", node)
            return False
        first, last = node.body[0].lineno, node.body[-1].end_lineno
        if any(first <= getattr(n, "lineno", 0) <= last and me in _bindings(n) for n in self.sites):
            self.flag("allowlist-name", f"method {node.name} rebinds {me}", node)
            return False
        return True

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node in self.tree.body and not self.kernel:
            for b in node.bases:
                if not (isinstance(b, ast.Name) and self.kinds.get(b.id, ("",))[0] == "class"):
                    self.flag("allowlist-syntax", f"class {node.name} subclasses {ast.unparse(b)}, not a class of "
                                                  "its own", node)
            if node.keywords or node.decorator_list:
                self.flag("allowlist-syntax", f"class {node.name} has a metaclass, keywords or decorators", node)
            for n in node.body:
                if isinstance(n, ast.FunctionDef):
                    self._function(n, node.name)
                else:
                    self.visit(n)
        else:
            self.flag("allowlist-syntax", f"defines the class {node.name} inside another scope", node)



def _bindings(node) -> list[str]:
    """The names `node` binds in its scope."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):  # `del name` unbinds: nothing to check
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def _is_main_guard(node) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__" and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)
            and isinstance(node.test.comparators[0], ast.Constant) and node.test.comparators[0].value == "__main__")


def _is_wait_idiom(node, kinds: dict) -> bool:
    v = node.value if isinstance(node, ast.Expr) else None
    return (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "wait"
            and isinstance(v.func.value, ast.Name) and kinds.get(v.func.value.id) == ("async",) and len(v.args) == 1
            and not v.keywords and isinstance(v.args[0], ast.Call) and isinstance(v.args[0].func, ast.Name)
            and v.args[0].func.id == "globals" and not v.args[0].args and not v.args[0].keywords)


def _is_del_async(node, kinds: dict) -> bool:
    return isinstance(node, ast.Delete) and all(isinstance(t, ast.Name) and kinds.get(t.id) == ("async",)
                                                for t in node.targets)
