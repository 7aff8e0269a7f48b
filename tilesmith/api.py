"""`tilesmith.compile(...)`: the whole pipeline from Python, in one call.

The returned object is the `torch.compile` callable, wrapped. Its first real call compiles with
Inductor while a capture session records every graph with its concrete inputs; then the same
driver, gate and store as `tilesmith optimize` run (candidate code only in worker subprocesses) and
accepted wrappers replace Inductor's `call` in place for the rest of the process and are installed
for later runs. Graphs Inductor compiles during the first call and until the second call starts
(the backward of a first training step) are captured; later recompiles are left to Inductor.
Nothing here raises into the user's forward pass: problems are warnings and Inductor's code runs on.
"""

from __future__ import annotations

import datetime as _dt
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from tilesmith import paths
from tilesmith.errors import TilesmithError

if TYPE_CHECKING:  # names only: importing tilesmith stays cheap
    from tilesmith.optimize import Agency, OptimizerName


def compile(model, *, example_inputs, agency: Agency = "medium", loops: int = 1, max_model_calls: int | None = None,
            optimizer: OptimizerName | None = None, block: bool = True, mode: str | None = None, options: dict | None = None,
            fullgraph: bool = False, dynamic: bool | None = None, max_minutes: float | None = None,
            workspace: str | Path | None = None, gate_time_budget_s: float | None = None):
    """torch.compile(model, ...) plus tilesmith on its first real call; see the module docstring.

    example_inputs: a tuple with at least one tensor (checked now; the first real call's inputs are
    the ones used). block=False keeps running Inductor's code while optimizing in the background.
    """
    import torch

    if not isinstance(example_inputs, tuple) or not any(isinstance(x, torch.Tensor) for x in example_inputs):
        raise TilesmithError("example_inputs must be a tuple with at least one tensor",
                             code="usage", hint="e.g. tilesmith.compile(model, example_inputs=(x,))")
    from tilesmith.optimize import OptimizeSettings

    settings = OptimizeSettings(optimizer=optimizer or "auto", agency=agency, loops=loops,
                                max_model_calls=max_model_calls, max_minutes=max_minutes,
                                gate_time_budget_s=gate_time_budget_s).resolved()
    compiled = torch.compile(model, mode=mode, options=options, fullgraph=fullgraph, dynamic=dynamic)
    return Optimized(compiled, settings, block, workspace)


def last_run_id(optimized) -> str | None:
    """The run id of the latest optimization round of a tilesmith.compile result (for `tilesmith report`)."""
    return getattr(optimized, "tilesmith_run_id", None)


class Optimized:
    """The torch.compile callable with tilesmith in front of its first two calls; attributes pass through."""

    def __init__(self, compiled, settings, block: bool, workspace):
        self._compiled, self._settings, self._block = compiled, settings, block
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
        self._ws = paths.absolute(workspace) if workspace else paths.home() / "compile" / stamp
        self._session = None
        self._calls = 0
        self._done_keys: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.tilesmith_run_id: str | None = None
        self.tilesmith_runs: list[str] = []
        self.tilesmith_swapped: list[str] = []  # graph keys now running an accepted wrapper

    def __getattr__(self, name):
        return getattr(self._compiled, name)

    def __call__(self, *args, **kwargs):
        with self._lock:
            self._calls += 1
            n = self._calls
            if n == 1:
                self._start_capture()
        if n == 2:
            self._round()  # the graphs of the first call's backward, if any
            self._stop_capture()
        out = self._compiled(*args, **kwargs)
        if n == 1:
            self._round()
        return out

    @property
    def tilesmith_busy(self) -> bool:
        """True while a background optimization round (block=False) is running."""
        t = self._thread
        return t is not None and t.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until a background optimization round (block=False) has finished."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    # -- capture -----------------------------------------------------------------------------
    def _start_capture(self) -> None:
        try:
            from tilesmith.capture import prepare_workspace
            from tilesmith.capture.session import CaptureSession
            from tilesmith.runtime import hook

            prepare_workspace(self._ws, force=False, append=False)
            self._session = CaptureSession(self._ws, 2 * 1024**3, watch_gaps=False)
            hook.add_handler(self._session)
        except Exception as e:
            self._session = None
            warnings.warn(f"tilesmith: capture could not start ({e}); running Inductor's code", stacklevel=3)

    def _stop_capture(self) -> None:
        if self._session is not None:
            from tilesmith.runtime import hook

            hook.remove_handler(self._session)

    # -- optimize and swap ---------------------------------------------------------------------
    def _round(self) -> None:
        s = self._session
        if s is None:
            return
        new = [k for k in s.graphs if k not in self._done_keys]
        if not new:
            return
        self._done_keys.update(new)
        if self._block:
            self._optimize(new)
        else:
            self.wait()  # one background round at a time
            self._thread = threading.Thread(target=self._optimize, args=(new,), name="tilesmith-optimize", daemon=True)
            self._thread.start()

    def _optimize(self, keys: list[str]) -> None:
        from tilesmith import workspace as wsmod
        from tilesmith.install import install
        from tilesmith.optimize import OptimizeSettings, optimize

        s = self._session
        ws = wsmod.Workspace(path=self._ws, script="<tilesmith.compile>", argv=[],
                             created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                             environment=s.env, graphs=list(s.graphs.values()))
        eligible = [g.key for g in ws.graphs if g.key in keys and g.eligible]
        if not eligible:
            why = "; ".join(sorted({g.reason for g in ws.graphs if g.key in keys})) or "none"
            warnings.warn(f"tilesmith: no eligible graph to optimize ({why}); running Inductor's code", stacklevel=2)
            return
        try:
            wsmod.save(ws)
            settings = OptimizeSettings(**{**self._settings.__dict__, "graphs": eligible})
            result = optimize(self._ws, settings)
            self.tilesmith_run_id = result.run_id
            self.tilesmith_runs.append(result.run_id)
            install(result.run_id)
        except Exception as e:  # provider errors, no device, a bug of ours: never the user's forward pass
            warnings.warn(f"tilesmith: optimization failed ({e}); running Inductor's code", stacklevel=2)
            return
        for t in result.tracks:
            # An accepted loop counts whatever ended the track after it (a track the time limit stopped in its
            # next loop is "interrupted": its confirmed win was installed above all the same).
            if t.loops_done or t.status == "cached":
                self._swap(t.key)

    def _swap(self, key: str) -> None:
        from tilesmith import runtime

        info = self._session.graphs.get(key)
        if info is not None and info.compile_mode == "cudagraphs":
            # The CUDA graph already recorded Inductor's code; the installed artifact serves later runs.
            return
        try:
            mod = runtime.load_installed(key, self._session.constants.get(key, {}))
        except Exception as e:
            warnings.warn(f"tilesmith: {key[:12]}: accepted but not loaded ({e}); running Inductor's code", stacklevel=2)
            return
        self._session.swap(key, mod.call)
        self.tilesmith_swapped.append(key)
