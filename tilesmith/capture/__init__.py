"""`capture`: run an unmodified script in-process and dump every graph Inductor produced."""

from __future__ import annotations

import datetime as _dt
import runpy
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from tilesmith import paths
from tilesmith import workspace as wsmod
from tilesmith.errors import TilesmithError
from tilesmith.workspace import GraphInfo, Workspace

DEFAULT_MAX_INPUT_BYTES = 2 * 1024**3  # 2 GiB of first-call inputs per workspace, storages counted once


@dataclass
class CaptureResult:
    workspace: Workspace
    script_error: str = ""  # tail of the user's traceback when their script raised
    exit_code: int = 0  # the script's own sys.exit code
    new_graphs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"workspace": self.workspace.to_dict(), "script_error": self.script_error,
                "exit_code": self.exit_code, "new_graphs": self.new_graphs}


def capture(script: str | Path, argv: list[str] | None = None, workspace: str | Path = "tilesmith-workspace",
            *, force: bool = False, append: bool = False, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
            on_graph=None) -> CaptureResult:
    """Run `script` as __main__ with `argv`, capture every Inductor graph into `workspace`.

    Raises TilesmithError for bad input (missing script, existing workspace, no torch.compile);
    a script that raises still returns, with `script_error` set and what was captured kept.
    """
    script = Path(script)
    argv = list(argv or [])
    if not script.is_file():
        raise TilesmithError(f"script not found: {paths.shown(script)}", code="script-not-found",
                             hint="pass the path of a Python script, e.g. `tilesmith capture train.py -- --epochs 1`")
    ws_path = paths.absolute(workspace)
    previous = prepare_workspace(ws_path, force=force, append=append)

    from tilesmith.capture.session import CaptureSession
    from tilesmith.runtime import hook

    session = CaptureSession(ws_path, max_input_bytes, on_graph=on_graph)
    ws = Workspace(path=ws_path, script=str(script.resolve()), argv=argv,
                   created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   environment=session.env)
    hook.add_handler(session)
    script_error, exit_code, interrupted = "", 0, False
    try:
        exit_code = _run_as_main(script, argv)
    except KeyboardInterrupt:
        interrupted = True
    except _ScriptFailed as e:
        script_error = e.tail
    finally:
        hook.remove_handler(session)
        session.finish()
        ws.graphs = _merge(previous, list(session.graphs.values()))
        ws.status = "interrupted" if interrupted else ("script-failed" if script_error else "complete")
        ws.error = script_error
        if ws.graphs or previous is not None or not interrupted:
            ws_path.mkdir(parents=True, exist_ok=True)
            wsmod.save(ws)
    if interrupted:
        raise KeyboardInterrupt
    result = CaptureResult(ws, script_error, exit_code, sorted(session.graphs))
    if not session.graphs and not script_error:
        raise TilesmithError(
            f"{script.name} ran to the end but Inductor compiled no graph",
            code="no-graphs",
            hint="the script must call torch.compile (backend 'inductor', the default) and run the compiled code",
        )
    return result


class _ScriptFailed(Exception):
    def __init__(self, tail: str):
        super().__init__(tail)
        self.tail = tail


def _run_as_main(script: Path, argv: list[str]) -> int:
    """runpy the script as __main__ with its own argv and sys.path[0]; returns its exit code."""
    old_argv = sys.argv
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            raise _ScriptFailed(f"the script exited with status {code}") from None
        return 0
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # the user's exception: keep its traceback tail, never ours
        tb = traceback.extract_tb(e.__traceback__)
        user = [f for f in tb if not f.filename.startswith(str(Path(__file__).parent))
                and "runpy" not in f.filename] or tb
        lines = traceback.format_list(user[-4:]) + traceback.format_exception_only(type(e), e)
        raise _ScriptFailed("".join(lines).rstrip()) from None
    finally:
        sys.argv = old_argv
        if sys.path and sys.path[0] == str(script.resolve().parent):
            sys.path.pop(0)


def prepare_workspace(ws_path: Path, *, force: bool, append: bool) -> Workspace | None:
    """Make `ws_path` ready for a capture: empty (or replaced with --force), or the workspace to add to."""
    if force and append:
        raise TilesmithError("--force and --append contradict each other", code="usage", hint="pick one")
    if ws_path.exists() and not ws_path.is_dir():
        raise TilesmithError(f"{paths.shown(ws_path)} exists and is not a folder", code="workspace-exists",
                             hint="pass another --workspace")
    if ws_path.exists() and any(ws_path.iterdir()):
        if append:
            return wsmod.load(ws_path)
        if not force:
            raise TilesmithError(f"workspace {paths.shown(ws_path)} already exists", code="workspace-exists",
                                 hint="use --force to replace it, --append to add to it, or --workspace DIR")
        if not (ws_path / wsmod.WORKSPACE_FILE).exists() and not (ws_path / "graphs").exists():
            raise TilesmithError(f"{paths.shown(ws_path)} is not a tilesmith workspace; refusing to delete it",
                                 code="workspace-exists", hint="pass another --workspace")
        shutil.rmtree(ws_path)
    try:
        (ws_path / "graphs").mkdir(parents=True, exist_ok=True)
        probe = ws_path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise TilesmithError(f"cannot write the workspace {paths.shown(ws_path)}: {e.strerror}", code="workspace-unwritable",
                             hint="pass a writable --workspace DIR") from None
    return None


def _merge(previous: Workspace | None, new: list[GraphInfo]) -> list[GraphInfo]:
    merged = {g.key: g for g in (previous.graphs if previous else [])}
    for g in new:
        if g.key in merged:
            merged[g.key].seen += g.seen
        else:
            merged[g.key] = g
    return list(merged.values())
