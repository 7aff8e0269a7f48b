"""Stand-ins for a loaded wrapper's kernels: every launch handed to one function.

A wrapper looks its kernels up as module globals when `call` runs: a Triton kernel launches through
`.run(...)`, a C++ kernel is called, and library calls go through `extern_kernels.<name>(...)`. `instrument`
replaces each of those globals with a proxy that calls `launch(name, kind, fn, args, kwargs)` instead, where
`fn(*args, **kwargs)` is the real launch and `launch` returns its result. The profile worker records each
launch's arguments and times the CPU kernels through it (worker.py); the agent's kernel bench times each
launch (tilesmith/search/kernel_bench.py). The wrapper's own frame is two frames above `launch` (launch <-
the proxy's method <- the wrapper), for a launch function that reads the wrapper's line.
"""

from __future__ import annotations

from tilesmith.source import kernels_in


class Kernel:
    """Stands in for one kernel global: Triton kernels launch through .run, C++ kernels are called."""

    def __init__(self, inner, name: str, kind: str, launch):
        self._inner, self._name, self._kind, self._launch = inner, name, kind, launch

    def run(self, *args, **kwargs):
        return self._launch(self._name, self._kind, self._inner.run, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._launch(self._name, self._kind, self._inner, args, kwargs)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class Extern:
    """Stands in for `extern_kernels`: each library function launched as `extern_kernels.<name>`, kind "extern"."""

    def __init__(self, inner, launch):
        self._inner, self._launch = inner, launch

    def __getattr__(self, attr):
        fn = getattr(self._inner, attr)
        if not callable(fn):
            return fn
        name, launch = f"extern_kernels.{attr}", self._launch
        return lambda *args, **kwargs: launch(name, "extern", fn, args, kwargs)


def instrument(mod, wrapper: str, launch) -> dict:
    """Put proxies in place of every kernel global of `mod` that `wrapper` (its source without the FX header)
    defines, and of its `extern_kernels`; the globals they replace, by name, for `restore`."""
    originals = {}
    for k in kernels_in(wrapper):
        if hasattr(mod, k.name):
            originals[k.name] = getattr(mod, k.name)
            setattr(mod, k.name, Kernel(originals[k.name], k.name, k.kind, launch))
    if hasattr(mod, "extern_kernels"):
        originals["extern_kernels"] = mod.extern_kernels
        mod.extern_kernels = Extern(mod.extern_kernels, launch)
    return originals


def restore(mod, originals: dict) -> None:
    """Put back the globals `instrument` replaced (or any other set of them)."""
    for name, value in originals.items():
        setattr(mod, name, value)
