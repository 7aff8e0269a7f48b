"""The capture workspace on disk: workspace.toml plus graphs/<key>/ (wrapper.py, graph.json, data.pt)."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tilesmith import paths
from tilesmith.errors import TilesmithError
from tilesmith.launch.secrets import redact

WORKSPACE_FILE = "workspace.toml"
WRAPPER_FILE = "wrapper.py"
GRAPH_FILE = "graph.json"
DATA_FILE = "data.pt"


@dataclass
class GraphInfo:
    """One graph Inductor produced, as the workspace lists it."""

    key: str
    kind: str  # forward | backward | inference
    device: str  # "cpu", "cuda:0", or several joined by "+"
    compile_mode: str  # plain | cudagraphs
    kernels: dict  # {"triton": n, "cpp": n, "template": n, "extern": n}
    eligible: bool
    reason: str = ""  # why not eligible; "" when eligible
    data_stored: bool = False
    seen: int = 1  # how many times Inductor handed this same graph back in the run
    fx_graph_cache_key: str = ""

    @property
    def short(self) -> str:
        return self.key[:12]


@dataclass
class Workspace:
    path: Path
    script: str
    argv: list[str]
    created: str
    environment: dict
    status: str = "complete"  # complete | script-failed | interrupted
    error: str = ""
    graphs: list[GraphInfo] = field(default_factory=list)

    def graph_dir(self, key: str) -> Path:
        return graph_dir(self.path, key)

    def find(self, prefix: str) -> GraphInfo:
        hits = [g for g in self.graphs if g.key.startswith(prefix)]
        if len(hits) != 1:
            raise TilesmithError(
                f"graph '{prefix}' matches {len(hits)} graphs in {self.path}",
                code="graph-not-found",
                hint="give a longer key prefix; `tilesmith capture --json` lists the keys",
            )
        return hits[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def graph_dir(ws_path: Path | str, key: str) -> Path:
    return Path(ws_path) / "graphs" / key


def _drop_none(obj):
    # TOML has no null: drop None values (they read back as the dataclass default).
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj if v is not None]
    return obj


def save(ws: Workspace) -> None:
    """Write workspace.toml atomically (temp file + rename)."""
    import tomli_w

    d = ws.to_dict()
    d.pop("path")
    text = tomli_w.dumps(_drop_none(d))
    atomic_write_text(ws.path / WORKSPACE_FILE, text)


def load(path: Path | str) -> Workspace:
    """Read a workspace; a missing or corrupt workspace.toml is a TilesmithError saying what to do."""
    path = paths.absolute(path)
    f = path / WORKSPACE_FILE
    if not f.exists():
        hint = "run `tilesmith capture SCRIPT` first, or pass --workspace DIR"
        if (path / "graphs").is_dir():
            hint = "the capture that wrote it did not finish; capture again with --force"
        raise TilesmithError(f"no workspace at {paths.shown(path)} ({WORKSPACE_FILE} is missing)", code="no-workspace", hint=hint)
    try:
        d = tomllib.loads(f.read_text())
        names = {x.name for x in fields(GraphInfo)}
        graphs = [GraphInfo(**{k: v for k, v in g.items() if k in names}) for g in d.pop("graphs", [])]
        return Workspace(path=path, graphs=graphs, **{k: v for k, v in d.items() if k in {x.name for x in fields(Workspace)}})
    except (tomllib.TOMLDecodeError, TypeError) as e:
        raise TilesmithError(
            f"{paths.shown(f)} is corrupt: {e}", code="corrupt-workspace", hint="capture again with --force"
        ) from None


def load_graph_json(gdir: Path | str) -> dict:
    f = Path(gdir) / GRAPH_FILE
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        raise TilesmithError(f"{paths.shown(gdir)} is not a captured graph ({GRAPH_FILE} is missing)", code="no-graph",
                             hint="pass a folder under <workspace>/graphs/") from None
    except json.JSONDecodeError as e:
        raise TilesmithError(f"{paths.shown(f)} is corrupt: {e}", code="corrupt-graph", hint="capture again") from None


def graph_devices(graph_dirs) -> list[str]:
    """The torch device of each captured graph (graph.json); "unknown" for one that cannot be read."""
    out = []
    for g in graph_dirs:
        try:
            out.append(str(load_graph_json(g).get("device") or "cpu"))
        except Exception:  # noqa: BLE001 - the worker itself reports the problem
            out.append("unknown")
    return out


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    """Atomically, with known secret values redacted (traces, verdicts and logs never hold a key)."""
    atomic_write_text(path, redact(json.dumps(obj, indent=2, sort_keys=True, default=str)) + "\n")
