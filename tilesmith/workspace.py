"""The capture workspace on disk: workspace.toml (Workspace) plus graphs/<key>/ (Graph: wrapper.py, graph.json,
data.pt)."""

from __future__ import annotations

import functools
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


class Graph:
    """One captured graph, graphs/<key>/ of a workspace, each of its files read once, when first asked for:
    `meta` (graph.json: inputs and outputs with their layouts and value ranges, device, kind, compile mode, the
    program's gap between calls), `wrapper` (wrapper.py: the FX program as comments, then the canonical wrapper)
    and `data()` (data.pt: the first real call's inputs, outputs, constants and RNG state; this one loads torch).
    A missing or corrupt graph.json is a TilesmithError when `meta` is first read."""

    def __init__(self, folder: Path | str):
        self.dir = Path(folder)
        self._data: dict = {}  # device_map (as repr) -> GraphData

    def __repr__(self) -> str:
        return f"Graph({str(self.dir)!r})"

    @functools.cached_property
    def meta(self) -> dict:
        f = self.dir / GRAPH_FILE
        try:
            return json.loads(f.read_text())
        except FileNotFoundError:
            raise TilesmithError(f"{paths.shown(self.dir)} is not a captured graph ({GRAPH_FILE} is missing)",
                                 code="no-graph", hint="pass a folder under <workspace>/graphs/") from None
        except json.JSONDecodeError as e:
            raise TilesmithError(f"{paths.shown(f)} is corrupt: {e}", code="corrupt-graph", hint="capture again") from None

    @functools.cached_property
    def wrapper(self) -> str:
        return (self.dir / WRAPPER_FILE).read_text()

    @property
    def key(self) -> str:
        return str(self.meta["key"])

    @property
    def device(self) -> str:
        """The torch device it runs on: "cpu", "cuda:0"."""
        return str(self.meta.get("device") or "cpu")

    @property
    def compile_mode(self) -> str:
        """plain | cudagraphs (Inductor replays it: reduce-overhead, max-autotune); "" where not recorded."""
        return str(self.meta.get("compile_mode") or "")

    def data(self, device_map=None) -> GraphData:
        """data.pt, with graph.json as `meta` (loaded once per `device_map`, torch.load's map_location);
        a TilesmithError when the capture stored none or it cannot be read."""
        if repr(device_map) not in self._data:
            self._data[repr(device_map)] = _load_data(self, device_map)
        return self._data[repr(device_map)]


@dataclass
class GraphData:
    """The first real call of a graph: inputs, outputs, constants and the RNG state before it."""

    meta: dict
    inputs: list
    outputs: list
    constants: dict
    rng: dict


def _load_data(graph: Graph, device_map) -> GraphData:
    import torch

    meta, f = graph.meta, graph.dir / DATA_FILE
    if not f.exists():
        raise TilesmithError(f"{graph.dir.name[:12]}: no stored inputs ({meta.get('data_note') or 'data.pt missing'})",
                             code="no-data", hint="capture again (raise --max-input-bytes if the budget was hit)")
    if device_map is None and "cuda" in str(meta.get("device") or ""):
        _init_cuda(torch)
    try:
        data = torch.load(f, map_location=device_map, weights_only=False)
    except Exception as e:
        raise TilesmithError(f"{f} is unreadable: {e}", code="corrupt-graph", hint="capture again") from None
    return GraphData(meta, data["inputs"], data["outputs"], data.get("constants", {}), data.get("rng", {}))


def _init_cuda(torch) -> None:
    """Start CUDA before loading CUDA tensors. Before it starts, torch.cuda.device_count() asks NVML, and in a
    worker forked from the zygote (which imported torch with NVML-based checks) NVML counted no device while
    the CUDA runtime saw one: torch.load then refused the graph's data ("device_count() is 0"), which failed
    every forked profile and screen worker on the H200. Once CUDA has started the count comes from the CUDA
    runtime. The gate's workers never met it: they create their CUDA context before loading."""
    try:
        torch.cuda.init()
    except Exception:  # noqa: BLE001 - no usable CUDA: torch.load says so in its own words just below
        pass


def load_graph_json(gdir: Path | str) -> dict:
    """graph.json of the captured graph in `gdir` (Graph(gdir).meta)."""
    return Graph(gdir).meta


def graph_devices(graph_dirs) -> list[str]:
    """The torch device of each captured graph (graph.json); "unknown" for one that cannot be read."""
    out = []
    for g in graph_dirs:
        try:
            out.append(Graph(g).device)
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
