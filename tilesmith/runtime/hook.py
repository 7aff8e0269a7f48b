"""The one place tilesmith touches Inductor: `CompiledFxGraph.post_compile`.

post_compile runs once for every graph Inductor hands back, fresh compile, FX-graph-cache hit or
AOTAutograd-cache hit alike, after the wrapper module is loaded and before cudagraphs or input
realignment wrap its `call` (research note inductor-hooks.md §0-§2). Handlers registered here see
the graph object first; each may return a callable that runs after the original post_compile.

Importing this module does not import torch: the patch is applied by a `sys.meta_path` finder the
moment `torch._inductor.output_code` is first imported (that import costs ~2 s, so we never force it).
"""

from __future__ import annotations

import importlib.machinery
import inspect
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("tilesmith")

TARGET = "torch._inductor.output_code"
_lock = threading.RLock()
_handlers: list[Callable[["PostCompile"], Callable[[], None] | None]] = []
_state = {"finder": None, "patched": False}


@dataclass
class PostCompile:
    """What a handler gets: the CompiledFxGraph and post_compile's arguments, bound by name."""

    graph: Any
    example_inputs: Any
    constants: Any
    graph_kwargs: dict


def add_handler(fn: Callable[[PostCompile], Callable[[], None] | None]) -> None:
    """Register `fn`; it runs before Inductor's own post_compile for every graph from now on."""
    with _lock:
        if fn not in _handlers:
            _handlers.append(fn)
        _ensure_patched()


def handlers() -> list:
    """The handlers registered now, in the order they run."""
    with _lock:
        return list(_handlers)


def remove_handler(fn) -> None:
    with _lock:
        if fn in _handlers:
            _handlers.remove(fn)


def _bind(orig, self, args, kwargs) -> PostCompile:
    # Bind by name: 2.11/2.13 have (example_inputs, constants, graph_kwargs); older trees ordered
    # them differently (note §0).
    a = inspect.signature(orig).bind(self, *args, **kwargs).arguments
    gk = a.get("graph_kwargs") or {}
    return PostCompile(self, a.get("example_inputs", ()), a.get("constants"), gk)


def _patch(module) -> None:
    cls = getattr(module, "CompiledFxGraph", None)
    if cls is None or getattr(cls.post_compile, "_tilesmith", False):
        return
    orig = cls.post_compile

    def post_compile(self, *args, **kwargs):
        afters = []
        try:
            call = _bind(orig, self, args, kwargs)
            for handler in list(_handlers):
                try:
                    after = handler(call)
                except Exception as e:  # a handler must never break the user's program ...
                    if getattr(e, "fatal", False):  # ... unless it asks to (TILESMITH_RUNTIME_STRICT=1)
                        raise
                    log.warning("tilesmith: post_compile handler %s failed: %r", getattr(handler, "__name__", handler), e)
                    continue
                if after is not None:
                    afters.append(after)
        except Exception as e:
            if getattr(e, "fatal", False):
                raise
            log.warning("tilesmith: could not inspect an Inductor graph: %r", e)
        result = orig(self, *args, **kwargs)
        for after in afters:
            try:
                after()
            except Exception as e:
                log.warning("tilesmith: post_compile follow-up failed: %r", e)
        return result

    post_compile._tilesmith = True  # type: ignore[attr-defined]
    post_compile._tilesmith_orig = orig  # type: ignore[attr-defined]
    cls.post_compile = post_compile
    _state["patched"] = True


class _Finder:
    """Patches `torch._inductor.output_code` right after its module body runs.

    A plain class (sys.meta_path needs only find_spec): importlib.abc costs ~10-30 ms to import."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            with _lock:
                _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _ensure_patched() -> None:
    if _state["patched"]:
        return
    module = sys.modules.get(TARGET)
    if module is not None:
        _patch(module)
    elif _state["finder"] is None:
        _state["finder"] = _Finder()
        sys.meta_path.insert(0, _state["finder"])


def is_patched() -> bool:
    return bool(_state["patched"])
