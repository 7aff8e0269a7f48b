"""`import tilesmith.runtime`: later runs of a program load the installed artifacts instead of
Inductor's wrappers.

Importing this module registers one handler with `tilesmith.runtime.hook` and nothing else: it
imports no torch and no torch._inductor (the hook patches `CompiledFxGraph.post_compile` lazily, when
Inductor itself gets imported). For every graph Inductor hands back (fresh compile, FX-graph-cache hit
or AOTAutograd-cache hit), the handler

1. computes the graph key exactly as capture does: `source.canonicalize(src, (default_cache_dir(),))`
   plus `environment.fingerprint()`;
2. looks for manifests/<key>.json; no manifest: Inductor's module stays (counted, no warning);
3. checks that artifacts/<key>.py hashes to the manifest's sha256 and that the manifest's environment
   is this process's environment;
4. loads the verified bytes as a module with the graph's constants (PyCodeCache.write +
   load_by_key_path, the way Inductor loads its own wrappers) and swaps `current_callable`
   (+ `recursively_apply_fns` / `compiled_fn_runner` of graph-partition wrappers) before Inductor's
   post_compile runs, so cudagraphs (reduce-overhead) wrap the optimized code.

Any failure keeps Inductor's module and logs one warning per key ("tilesmith: <key12>: <why>; using
Inductor's code"); TILESMITH_RUNTIME_STRICT=1 raises instead (for CI). A substitution logs at INFO. When the
process exits, one line on stderr says what was substituted ("tilesmith: loaded 2 installed graph(s) in place of
Inductor's (1.60x, 1.21x faster at the gate)"), never when nothing was; TILESMITH_RUNTIME_QUIET=1 leaves it out.
What is written: the verified source, under its own content hash, into Inductor's code folder (as
PyCodeCache does for every module it loads) and the compiled kernels of that module. `source_code`
and FX-graph / AOTAutograd cache entries are never touched, so a later run without the runtime gets
Inductor's own code from the same cache.

The environment fingerprint: the stack part (torch, triton, CUDA, GPU) is computed once per process;
the numerics flags (TF32, reduced-precision reductions, determinism) are read again for every graph,
because a program may change them between compiles and an artifact proven under one setting must
not serve another. Capture computes the fingerprint when its session starts, so a script that
changes those flags before compiling gets keys that differ between capture and runtime: the runtime
then finds no artifact (safe, never wrong code).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass, field

from tilesmith import environment, paths, settings, source
from tilesmith.errors import TilesmithError
from tilesmith.runtime import hook

log = logging.getLogger("tilesmith.runtime")


class RuntimeStrictError(TilesmithError):
    """Raised instead of a fallback when TILESMITH_RUNTIME_STRICT=1."""

    fatal = True  # hook.py lets exceptions with this flag through to the compile


@dataclass
class Fallback:
    key: str
    reason: str


@dataclass
class RuntimeStats:
    graphs_seen: int = 0
    substituted: int = 0
    not_installed: int = 0  # graphs with no artifact in the store (normal, no warning)
    fallbacks: list[Fallback] = field(default_factory=list)  # artifact there but not used, and why
    substituted_keys: list[str] = field(default_factory=list)
    # Substituted artifacts that replay from CUDA graphs (tilesmith.cudagraph), by key: replays, plain
    # calls and why a layout runs plain.
    cuda_graphs: dict = field(default_factory=dict)
    # With TILESMITH_VERIFY=N, by key: calls checked against Inductor's code, and why a check failed.
    verified: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_lock = threading.Lock()
_stats = RuntimeStats()
_warned: set[str] = set()
_static_env: dict = {}
_cache_dirs: tuple[str, ...] | None = None
_graphed: dict = {}  # key -> tilesmith.cudagraph.Graphed of a substituted artifact
_verified: dict = {}  # key -> tilesmith.runtime.verify.Verified (TILESMITH_VERIFY)


def stats() -> RuntimeStats:
    """A copy of this process's counters: graphs seen, substituted, fallbacks with reasons."""
    with _lock:
        graphs = {k: {"replays": g.replays, "plain_calls": g.plain_calls, "plain_reasons": g.plain_reasons(),
                      "layouts": g.describe()}
                  for k, g in _graphed.items()}
        return RuntimeStats(_stats.graphs_seen, _stats.substituted, _stats.not_installed,
                            [Fallback(f.key, f.reason) for f in _stats.fallbacks], list(_stats.substituted_keys), graphs,
                            {k: v.describe() for k, v in _verified.items()})


def strict() -> bool:
    return settings.current().runtime_strict


class _Skip(Exception):
    """Why an installed artifact is not used."""


def _handle(pc: hook.PostCompile):
    g = pc.graph
    src = getattr(g, "source_code", None)
    if not src or getattr(g, "current_callable", None) is None or _capture_active():
        return None
    with _lock:
        _stats.graphs_seen += 1
    key = "?" * 64
    try:
        env = current_environment()
        key = source.graph_key(source.canonicalize(src, _default_cache_dirs()), env)
        mpath = paths.manifests_dir() / f"{key}.json"
        if not mpath.exists():
            with _lock:
                _stats.not_installed += 1
            return None
        return _substitute(g, pc, key, mpath, env)
    except _Skip as e:
        _fallback(key, str(e))
    except RuntimeStrictError:
        raise
    except Exception as e:  # an artifact that raises at import, a torch API that moved: never the user's problem
        _fallback(key, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
    return None


def _capture_active() -> bool:
    # `tilesmith capture` imports tilesmith.runtime.hook, which imports this package and so registers
    # this handler: a capture must record Inductor's own code and outputs, never an artifact's.
    return any(getattr(h, "records_inductor_code", False) for h in hook.handlers())


def load_installed(key: str, constants: dict, env: dict | None = None):
    """The installed artifact for `key` as a module, after checking its bytes and environment against
    its manifest; raises _Skip (a reason) when it must not be used."""
    env = env if env is not None else current_environment()
    mpath = paths.manifests_dir() / f"{key}.json"
    try:
        manifest = json.loads(mpath.read_text())
        want_sha, want_env = manifest["sha256"], manifest["environment_id"]
    except FileNotFoundError:
        raise _Skip("no artifact installed") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _Skip(f"manifest unreadable ({type(e).__name__})") from None
    try:
        data = (paths.artifacts_dir() / f"{key}.py").read_bytes()
    except FileNotFoundError:
        raise _Skip("artifact file missing") from None
    if hashlib.sha256(data).hexdigest() != want_sha:
        raise _Skip("artifact bytes do not match the manifest's sha256 (modified or half-written)")
    if want_env != environment.fingerprint_id(env):
        raise _Skip(f"installed for another environment ({environment.describe(manifest.get('environment') or {})}; "
                    f"this process: {environment.describe(env)})")
    mod = load_source(data.decode(), constants)
    if not callable(getattr(mod, "call", None)):
        raise _Skip("the artifact defines no call(args)")
    return mod


def _substitute(g, pc: hook.PostCompile, key: str, mpath, env: dict) -> None:
    mod = load_installed(key, graph_constants(g, pc), env)
    call = mod.call
    inductors = g.current_callable
    g.current_callable = call
    # Graph-partition wrappers: Inductor's post_compile cudagraphifies partitions through these.
    if hasattr(g, "recursively_apply_fns"):
        g.recursively_apply_fns = getattr(mod, "recursively_apply_fns", None)
    if hasattr(g, "compiled_fn_runner"):
        g.compiled_fn_runner = getattr(mod, "runner", None)
    from tilesmith.replay.graphed import Graphed

    after = None
    if isinstance(call, Graphed):
        # Inputs Inductor marks static (parameters, buffers; saved activations of a backward) are kept
        # in place across address changes. The artifact replays itself: Inductor's own CUDA graphs
        # (reduce-overhead) are off for this graph's post_compile, and back on after it, for the other
        # graphs of the same compile that share the flag (a backward compiled later).
        call.static_hint = frozenset(pc.graph_kwargs.get("static_input_idxs") or ())
        box = pc.graph_kwargs.get("cudagraphs")
        if box is not None and bool(box) and hasattr(box, "value"):
            box.value = False
            after = lambda: setattr(box, "value", True)  # noqa: E731
    from tilesmith.runtime import verify

    g.current_callable = verify.wrap(call, inductors, key, g, pc.graph_kwargs.get("static_input_idxs"),
                                     after is not None, _revoked)
    with _lock:
        _stats.substituted += 1
        _stats.substituted_keys.append(key)
        if isinstance(call, Graphed):
            _graphed[key] = call
        if isinstance(g.current_callable, verify.Verified):
            _verified[key] = g.current_callable
    log.info("tilesmith: %s: loaded the installed artifact instead of Inductor's wrapper", key[:12])
    return after


def load_source(text: str, constants: dict):
    """Exec wrapper source (FX header allowed) as a fresh module with `constants` as its globals, through
    Inductor's PyCodeCache, the way Inductor loads its own wrappers."""
    from torch._inductor.codecache import PyCodeCache

    _, src = source.split_header(text)
    mkey, path = PyCodeCache.write(src)
    # attrs given (a dict, even empty) -> a fresh module object per graph; positional: 2.11 has no
    # set_sys_modules keyword.
    return PyCodeCache.load_by_key_path(mkey, path, None, constants)


def graph_constants(g, pc: hook.PostCompile) -> dict:
    """The module globals Inductor injects into the graph's wrapper (constants, frozen params)."""
    consts = pc.constants
    if consts is None:
        return dict(getattr(g, "constants", None) or {})
    return dict(consts.unwrap(g))


def _fallback(key: str, reason: str) -> None:
    with _lock:
        _stats.fallbacks.append(Fallback(key, reason))
        first = key not in _warned
        _warned.add(key)
    if strict():
        raise RuntimeStrictError(f"tilesmith: {key[:12]}: {reason}", code="runtime-fallback",
                                 hint="unset TILESMITH_RUNTIME_STRICT to fall back to Inductor's code")
    if first:
        log.warning("tilesmith: %s: %s; using Inductor's code", key[:12], reason)


def _revoked(key: str, reason: str) -> None:
    """A TILESMITH_VERIFY check found the artifact wrong in this program: it is removed from the store (no later run
    loads it; `tilesmith installed` says why) and said so once on stderr, as any fallback, before strict mode raises."""
    try:
        from tilesmith import store

        gone = store.revoke(key, reason)
    except Exception as e:  # noqa: BLE001 - the program goes on with Inductor's code whatever the store says
        gone, reason = False, f"{reason} (removing it from the store failed: {type(e).__name__})"
    _fallback(key, reason + ("; removed from the store" if gone else ""))


def current_environment() -> dict:
    """This process's fingerprint: the stack part cached, the numerics flags read now."""
    global _static_env
    if not _static_env:
        _static_env = environment.fingerprint()
        return dict(_static_env)
    import torch

    return {**_static_env, "numerics": environment.numerics_flags(torch)}


def _default_cache_dirs() -> tuple[str, ...]:
    # default_cache_dir() costs ~0.1 s per call (getpass): once per process, as capture does.
    global _cache_dirs
    if _cache_dirs is None:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            _cache_dirs = (default_cache_dir(),)
        except Exception:
            _cache_dirs = ()
    return _cache_dirs


def enable() -> None:
    """Register the substitution handler (done on import; calling it again does nothing)."""
    hook.add_handler(_handle)
    _verbose_logging()
    global _notice_pid
    if _notice_pid is None:
        _notice_pid = os.getpid()
        atexit.register(_say_at_exit)


NOTICE = "tilesmith: loaded "  # how the exit line starts (warnings start "tilesmith: <key12>: ")
_notice_pid: int | None = None  # the process that registered the exit line (a forked child that exits normally
                                # inherits the handler and a copy of the counters: it says nothing)


def notice() -> str:
    """The line the runtime writes on stderr at exit: how many graphs ran installed code in place of Inductor's,
    each with the speedup the gate proved for it, and those TILESMITH_VERIFY dropped; "" when nothing was
    substituted."""
    s = stats()
    keys = list(dict.fromkeys(s.substituted_keys))
    if not keys:
        return ""
    dropped = [k for k in keys if (s.verified.get(k) or {}).get("failed")]
    speedups = sorted((x for x in map(_proven_speedup, keys) if x), reverse=True)
    shown = ", ".join(f"{x:.2f}x" for x in speedups) if len(speedups) <= 4 else \
        f"{speedups[-1]:.2f}x to {speedups[0]:.2f}x"
    line = f"{NOTICE}{len(keys)} installed graph(s) in place of Inductor's" + \
        (f" ({shown} faster at the gate)" if shown else "")
    if dropped:
        line += f"; TILESMITH_VERIFY dropped {len(dropped)} of them for Inductor's code"
    return line + "; TILESMITH_RUNTIME_QUIET=1 hides this line"


def _proven_speedup(key: str) -> float | None:
    """The speedup recorded with the installed artifact (its manifest's evidence), None when unreadable."""
    try:
        x = json.loads((paths.manifests_dir() / f"{key}.json").read_text())["evidence"]["speedup"]
        return float(x) if isinstance(x, (int, float)) and x > 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _say_at_exit() -> None:
    """Write notice() on stderr, once, in the process that substituted; never raises (an exit is no place for it)."""
    try:
        if os.getpid() != _notice_pid or settings.current().runtime_quiet:
            return
        line = notice()
        if line:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    except Exception:
        pass


def _verbose_logging() -> None:
    """TILESMITH_RUNTIME_VERBOSE=1: one line on stderr per graph loaded from the store, so a user can see
    the runtime at work without changing the program (the library never prints otherwise)."""
    if not settings.current().runtime_verbose or log.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def disable() -> None:
    hook.remove_handler(_handle)


enable()
