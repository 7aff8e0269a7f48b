"""The capture handler: sees every Inductor graph, writes its wrapper and metadata, and snapshots the
inputs and outputs of its first real call (research note inductor-hooks.md §4)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import torch

from tilesmith import environment, paths, runtime, settings, source
from tilesmith.capture import tensors
from tilesmith.capture.gaps import GapWatch
from tilesmith.runtime import hook
from tilesmith.workspace import DATA_FILE, GRAPH_FILE, WRAPPER_FILE, GraphInfo, graph_dir, write_json

_KIND_RX = re.compile(r"^# AOT ID: \['\d+_(\w+)'\]", re.M)


def count_kernels(src: str) -> dict:
    """Kernels by kind, read from the wrapper text."""
    return {
        "triton": len(re.findall(r"async_compile\.triton\(\s*'triton_(?!tem_)", src)),
        "template": len(re.findall(r"async_compile\.triton\(\s*'triton_tem_", src))
        + len(re.findall(r"async_compile\.cuda\(", src)),
        "cpp": len(re.findall(r"async_compile\.cpp(?:_pybinding)?\(", src)),
        "extern": len(re.findall(r"\bextern_kernels\.\w+\(", src)) + len(re.findall(r"\btorch\.ops\.\w+\.\w+", src)),
    }


OUTPUT_CALLS = 16  # calls per graph whose output storages capture remembers (see _inputs_from_graphs)


class CaptureSession:
    """Collects graphs into `ws_path/graphs/`; `graphs` maps key -> GraphInfo."""

    records_inductor_code = True  # the runtime stands aside while a capture records Inductor's own code

    def __init__(self, ws_path: Path, max_input_bytes: int, on_graph=None, watch_gaps: bool = True):
        self.ws_path = paths.absolute(ws_path)
        self.max_input_bytes = max_input_bytes
        self.on_graph = on_graph or (lambda info: None)
        self.env = environment.fingerprint()
        self.graphs: dict[str, GraphInfo] = {}
        self._lock = threading.Lock()
        self._stored_bytes = 0
        self._seen_storages: set[tuple] = set()
        self._cache_dirs = _cache_dirs()
        self.targets: dict[str, list] = {}  # key -> [the callable the graph's call runs]
        self.constants: dict[str, dict] = {}  # key -> the module globals Inductor injected
        # Storages of the outputs of each graph's first OUTPUT_CALLS calls: a graph whose first call reads one
        # (a graph after a graph break, fed by the one before) has inputs the program's cudagraph trees read in
        # place as their own earlier outputs, never copied (graph.json "inputs_from_graphs"; gate.inputs.trees_static).
        self._out_storages: dict[str, set] = {}
        self._outputs_known = True  # False once a graph ran past OUTPUT_CALLS: later first calls cannot tell
        # The program's host time between each graph's calls (graph.json "program_gap"); not for tilesmith.compile,
        # whose session sees two calls and whose wrappers would stay in the program for good.
        self.gaps = GapWatch() if watch_gaps else None
        self._metas: dict[str, tuple[Path, dict]] = {}

    def swap(self, key: str, fn) -> None:
        """From the next call on, graph `key` runs `fn` (a loaded wrapper's call) instead."""
        self.targets[key][0] = fn

    # -- the post_compile handler ------------------------------------------------------------
    def __call__(self, pc: hook.PostCompile):
        g = pc.graph
        src = getattr(g, "source_code", None)
        if not src or getattr(g, "current_callable", None) is None:
            return None
        canon = source.canonicalize(src, self._cache_dirs)
        # The fingerprint is read per graph, as the runtime does: a script may change numerics
        # flags (TF32, ...) between compiles, and a graph is only valid under the flags it ran with.
        env = environment.fingerprint()
        key = source.graph_key(canon, env)
        with self._lock:
            if key in self.graphs:  # the same graph again (recompile to identical code): capture once
                self.graphs[key].seen += 1
                return None
            consts = runtime.graph_constants(g, pc)
            info = self._describe(g, pc, canon, key, consts)
            self.graphs[key] = info
            self.constants[key] = consts
        gdir = graph_dir(self.ws_path, key)
        gdir.mkdir(parents=True, exist_ok=True)
        fx = getattr(g, "inductor_post_grad_graph_str", None) or "(FX program not available)"
        (gdir / WRAPPER_FILE).write_text(source.add_header(fx, canon))
        meta = self._graph_meta(g, info, consts)
        # What Inductor's cudagraph trees read in place (the gate's trees mode: worker_trees.py): fx_kwargs is
        # what cudagraph_post_compile hands the trees, also on a cache hit (whose graph_kwargs lack it).
        static = (getattr(g, "fx_kwargs", None) or {}).get("static_input_idxs")
        if static is None:
            static = pc.graph_kwargs.get("static_input_idxs")
        if static is not None:
            meta["inductor_static_inputs"] = sorted(int(i) for i in static)
        meta["environment"] = env
        _store_repro(g, gdir, meta, consts)
        write_json(gdir / GRAPH_FILE, meta)
        self._metas[key] = (gdir, meta)
        self._wrap_first_call(g, info, gdir, meta)

        def after():  # cudagraphs is decided inside Inductor's post_compile
            cg = pc.graph_kwargs.get("cudagraphs")
            info.compile_mode = "cudagraphs" if cg is not None and bool(cg) else "plain"
            meta["compile_mode"] = info.compile_mode
            write_json(gdir / GRAPH_FILE, meta)
            if self.gaps is not None and getattr(g, "current_callable", None) is not None:  # the outermost callable: the trees' replay too
                g.current_callable = self.gaps.wrap(key, info.device, g.current_callable)
            self.on_graph(info)

        return after

    def _describe(self, g, pc, canon: str, key: str, consts: dict) -> GraphInfo:
        fxk = getattr(g, "fx_kwargs", None) or {}
        m = _KIND_RX.search(g.source_code)
        if pc.graph_kwargs.get("is_backward", fxk.get("is_backward")):
            kind = "backward"
        elif fxk.get("is_inference") or (m and m.group(1) == "inference"):
            kind = "inference"
        else:
            kind = m.group(1) if m and m.group(1) in ("forward", "backward") else "forward"
        devices = sorted(f"{t}:{i}" if t != "cpu" else "cpu"
                         for t in (getattr(g, "device_types", None) or set())
                         for i in ((getattr(g, "device_idxs", None) or {0}) if t != "cpu" else {0}))
        info = GraphInfo(key=key, kind=kind, device="+".join(sorted(set(devices))) or "cpu", compile_mode="plain",
                         kernels=count_kernels(canon), eligible=True,
                         fx_graph_cache_key=getattr(g, "_fx_graph_cache_key", None) or "")
        reason = self._static_ineligibility(g, pc, info, consts)
        if reason:
            info.eligible, info.reason = False, reason
        return info

    def _static_ineligibility(self, g, pc, info: GraphInfo, consts: dict) -> str:
        fx = getattr(g, "inductor_post_grad_graph_str", "") or ""
        if "Sym(" in fx or any(isinstance(x, torch.SymInt) for x in (pc.example_inputs or ())) or getattr(g, "guards_expr", None):
            return "dynamic shapes (symbolic sizes): only static-shape graphs are optimized"
        if "+" in info.device:
            return f"several devices ({info.device}): only single-device graphs are optimized"
        if getattr(g, "mutated_input_idxs", None) and not settings.current().in_place:
            names = ", ".join(sorted(getattr(g, "mutated_inputs", None) or [])) or "some inputs"
            return f"updates its inputs in place ({names}): unset TILESMITH_IN_PLACE (or set it to 1) to optimize such graphs"
        if getattr(g, "frozen_param_names", None) and any(
            getattr(t, "is_mkldnn", False) for t in consts.values() if isinstance(t, torch.Tensor)
        ):
            return "frozen mkldnn weights cannot be stored and replayed"
        if not any(info.kernels.values()):
            return "no kernels or library calls: nothing to optimize"
        return ""

    def _graph_meta(self, g, info: GraphInfo, consts: dict) -> dict:
        return {
            "key": info.key,
            "kind": info.kind,
            "device": info.device,
            "compile_mode": info.compile_mode,
            "kernels": info.kernels,
            "eligible": info.eligible,
            "reason": info.reason,
            "mutated_inputs": sorted(getattr(g, "mutated_input_idxs", None) or []),
            "constants": {k: tensors.describe(v, i) for i, (k, v) in enumerate(consts.items())
                          if isinstance(v, torch.Tensor)},
            "fx_graph_cache_key": info.fx_graph_cache_key,
            "environment": self.env,
            "inputs": None,
            "outputs": None,
            "data_stored": False,
            "data_note": "the graph was not called during the script",
        }

    def finish(self) -> None:
        """After the script: each graph's program_gap into its graph.json (capture/gaps.py)."""
        if self.gaps is None:
            return
        self.gaps.close()
        for key, (gdir, meta) in self._metas.items():
            info = self.graphs.get(key)
            gap = self.gaps.result(key, compiled=info.seen if info is not None else 1)
            if gap is not None:
                meta["program_gap"] = gap
                try:
                    write_json(gdir / GRAPH_FILE, meta)
                except OSError:
                    pass

    # -- first real call ----------------------------------------------------------------------
    def _wrap_first_call(self, g, info: GraphInfo, gdir: Path, meta: dict) -> None:
        # target[0] is what runs: Inductor's call, until swap() puts an accepted wrapper's call there
        # (tilesmith.compile). A call reads it once, so a call in flight finishes on the code it began with.
        target = [g.current_callable]
        state = {"done": False, "calls": 0}
        lock = threading.Lock()
        session = self
        self.targets[info.key] = target

        def first_call(args):
            inner = target[0]
            if state["done"]:
                if state["calls"] >= OUTPUT_CALLS:
                    return inner(args)
                return session._note_outputs(info.key, state, inner(args))
            with lock:
                if state["done"]:
                    return inner(args)
                state["done"] = True
                try:
                    saved = [tensors.snapshot(a) if isinstance(a, torch.Tensor) else a for a in args]
                    refs = list(args)  # call() does args.clear()
                    rng = _rng_state(refs)
                    meta["inputs_from_graphs"] = session._inputs_from_graphs(refs)
                except Exception as e:  # never break the user's program over a capture problem
                    session._mark(info, meta, gdir, f"could not snapshot inputs: {e!r}")
                    return inner(args)
            out = session._note_outputs(info.key, state, inner(args))
            try:
                session._store_first_call(g, info, gdir, meta, refs, saved, rng, out)
            except Exception as e:
                session._mark(info, meta, gdir, f"could not store the first call: {e!r}")
            return out

        first_call.__name__ = "call"
        g.current_callable = first_call

    def _note_outputs(self, key: str, state: dict, out):
        """Remember the storages `out` lives in (a graph's first OUTPUT_CALLS calls); returns `out`."""
        try:
            outs = out if isinstance(out, (list, tuple)) else [out]
            ptrs = {(o.untyped_storage().data_ptr(), str(o.device)) for o in outs if isinstance(o, torch.Tensor)}
            with self._lock:
                state["calls"] += 1
                self._out_storages.setdefault(key, set()).update(ptrs)
                if state["calls"] >= OUTPUT_CALLS:
                    self._outputs_known = False
        except Exception:  # noqa: BLE001 - never break the user's program over a capture problem
            self._outputs_known = False
        return out

    def _inputs_from_graphs(self, refs: list) -> list[int] | None:
        """Positions of the inputs that live in a storage an earlier graph's output lives in; None when that
        cannot be told (a graph ran past OUTPUT_CALLS before this one's first call)."""
        with self._lock:
            if not self._outputs_known:
                return None
            seen = set().union(*self._out_storages.values()) if self._out_storages else set()
        return [i for i, a in enumerate(refs) if isinstance(a, torch.Tensor)
                and (a.untyped_storage().data_ptr(), str(a.device)) in seen]

    def _store_first_call(self, g, info, gdir, meta, refs, saved, rng, out) -> None:
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        meta["inputs"] = [tensors.describe(a, i) for i, a in enumerate(refs)]
        for i in meta.get("mutated_inputs") or []:  # updated by the call: described as the call found them
            if i < len(refs) and isinstance(saved[i], torch.Tensor):
                meta["inputs"][i].update(updated_in_place=True, range=tensors.value_range(saved[i]))
        meta["outputs"] = [tensors.describe(o, i) for i, o in enumerate(outs)]
        if any(isinstance(a, int) and not isinstance(a, bool) for a in refs) and info.eligible:
            info.eligible, info.reason = False, "dynamic shapes (integer size arguments): only static-shape graphs are optimized"
        new_bytes = 0
        storages = set()
        for a in refs:
            if isinstance(a, torch.Tensor):
                sid = (a.untyped_storage().data_ptr(), str(a.device))
                if sid not in self._seen_storages and sid not in storages:
                    storages.add(sid)
                    new_bytes += tensors.nbytes(a)
        with self._lock:
            over = self._stored_bytes + new_bytes > self.max_input_bytes
            if not over:
                self._stored_bytes += new_bytes
                self._seen_storages |= storages
        if over:
            self._mark(info, meta, gdir, f"inputs not stored: over the --max-input-bytes budget "
                                         f"({self.max_input_bytes} bytes); metadata only")
            return
        data = {
            "inputs": saved,
            "outputs": [tensors.snapshot(o) if isinstance(o, torch.Tensor) else o for o in outs],
            "constants": {k: v for k, v in self.constants[info.key].items() if isinstance(v, torch.Tensor)},
            "rng": rng,
        }
        tmp = gdir / (DATA_FILE + ".tmp")
        torch.save(data, tmp)
        tmp.replace(gdir / DATA_FILE)
        info.data_stored = True
        meta.update(data_stored=True, data_note="", eligible=info.eligible, reason=info.reason)
        write_json(gdir / GRAPH_FILE, meta)

    def _mark(self, info, meta, gdir, note: str) -> None:
        info.data_stored = False
        if info.eligible:
            info.eligible, info.reason = False, note
        meta.update(data_stored=False, data_note=note, eligible=info.eligible, reason=info.reason)
        write_json(gdir / GRAPH_FILE, meta)


def _store_repro(g, gdir: Path, meta: dict, consts: dict) -> None:
    """Keep the runnable repro Inductor lowered (re-lowering under other configs needs it)."""
    from tilesmith.capture import repro

    try:
        text = getattr(g, "runnable_graph_str", None) or ""
        st = repro.status(text, consts)
        if text:
            (gdir / repro.REPRO_FILE).write_text(repro.clean(text))
    except Exception as e:  # never break the user's program over a capture problem
        st = repro.ReproStatus(False, f"could not store the repro: {e!r}"[:300])
    meta["relower"] = st.to_dict()


def _rng_state(refs) -> dict:
    rng = {"cpu": torch.get_rng_state()}
    for a in refs:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            idx = a.device.index or 0
            rng.setdefault(f"cuda:{idx}", torch.cuda.get_rng_state(idx))
    return rng


def _cache_dirs() -> tuple[str, ...]:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return (default_cache_dir(),)
    except Exception:
        return ()
