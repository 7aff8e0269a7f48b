"""Capture on CPU with real Inductor: examples, cache hits, ineligible graphs, replay, CLI errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import EXAMPLES, run_capture_subprocess
from tilesmith import workspace as wsmod
from tilesmith.capture.rerun import rerun
from tilesmith_cli.app import app

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def test_training_capture_has_forward_and_backward_graphs_on_both_sides_of_the_graph_break(training_ws):
    ws = wsmod.load(training_ws)
    kinds = sorted(g.kind for g in ws.graphs)
    assert kinds == ["backward", "backward", "forward", "forward"]
    assert ws.status == "complete" and ws.script.endswith("training.py") and ws.argv == ["--steps", "1"]
    for g in ws.graphs:
        assert g.eligible and g.data_stored and g.device == "cpu" and g.compile_mode == "plain"
        assert g.kernels["cpp"] >= 1
        meta = wsmod.load_graph_json(ws.graph_dir(g.key))
        assert meta["key"] == g.key and meta["inputs"] and meta["outputs"]
        text = (ws.graph_dir(g.key) / "wrapper.py").read_text()
        assert text.startswith("# ==== tilesmith: FX program") and "def call(" in text
    params = [i for g in ws.graphs if g.kind == "forward" for i in wsmod.load_graph_json(ws.graph_dir(g.key))["inputs"]
              if i.get("parameter")]
    assert len(params) == 4  # fc1 and fc2 weight and bias



def test_capture_records_inductors_static_marks_and_which_inputs_are_earlier_graphs_outputs(training_ws):
    """The second forward graph reads the first one's output (h, across the graph break) and each backward
    reads what its forward saved: the program's cudagraph trees read such inputs in place, so the gate's
    trees mode must not copy them (gate.inputs.trees_static: the every-input-static path for those graphs)."""
    from tilesmith.gate.inputs import parameter_indices, trees_static

    ws = wsmod.load(training_ws)
    metas = {g.key: wsmod.load_graph_json(ws.graph_dir(g.key)) for g in ws.graphs}
    by_kind: dict = {}
    for g in ws.graphs:
        by_kind.setdefault(g.kind, []).append(metas[g.key])
    for meta in metas.values():
        assert isinstance(meta["inductor_static_inputs"], list)
        assert meta["inputs_from_graphs"] is None or isinstance(meta["inputs_from_graphs"], list)
    fed = [m for m in by_kind["forward"] if m["inputs_from_graphs"]]
    first = [m for m in by_kind["forward"] if m["inputs_from_graphs"] == []]
    assert len(fed) == 1 and len(first) == 1, [m["inputs_from_graphs"] for m in by_kind["forward"]]
    assert not set(fed[0]["inputs_from_graphs"]) & parameter_indices(fed[0])  # h, not a weight
    assert trees_static(fed[0]) is None
    assert trees_static(first[0]) == first[0]["inductor_static_inputs"]
    for meta in by_kind["backward"]:
        assert meta["inputs_from_graphs"] and trees_static(meta) is None


def test_inference_under_no_grad_is_captured_as_one_inference_graph_with_value_ranges(inference_ws):
    ws = wsmod.load(inference_ws)
    assert [g.kind for g in ws.graphs] == ["inference"]
    inputs = wsmod.load_graph_json(ws.graph_dir(ws.graphs[0].key))["inputs"]
    x = [i for i in inputs if i["shape"] == [64, 128] and not i["parameter"]][0]
    assert -10 < x["range"]["min"] < 0 < x["range"]["max"] < 10 and 0.5 < x["range"]["std"] < 1.5


def test_capture_twice_on_a_cold_and_a_warm_inductor_cache_gives_the_same_keys(tmp_path, training_ws):
    # training_ws compiled into the session cache; a brand-new cache dir compiles from scratch,
    # and the run after it hits the FX and AOTAutograd caches.
    cold = tmp_path / "cold"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fresh-cache")}
    assert run_capture_subprocess(EXAMPLES / "training.py", cold, "--steps", "1", env=env).returncode == 0
    warm = tmp_path / "warm"
    p = run_capture_subprocess(EXAMPLES / "training.py", warm, "--steps", "1", env=env)
    assert p.returncode == 0, p.stderr
    keys = lambda w: sorted(g.key for g in wsmod.load(w).graphs)  # noqa: E731
    assert keys(cold) == keys(warm) == keys(training_ws)
    assert all(g.data_stored for g in wsmod.load(warm).graphs)
    # Inductor's static marks on a cache hit too (read from the compiled graph's fx_kwargs), the same as cold
    marks = lambda w: {g.key: wsmod.load_graph_json(wsmod.load(w).graph_dir(g.key))["inductor_static_inputs"]  # noqa: E731
                       for g in wsmod.load(w).graphs}
    assert marks(warm) == marks(cold) and all(isinstance(v, list) for v in marks(warm).values())


def test_every_eligible_graph_replays_in_a_fresh_process_to_the_captured_outputs(training_ws, inference_ws):
    from concurrent.futures import ThreadPoolExecutor

    gdirs = [ws.graph_dir(g.key) for ws in map(wsmod.load, (training_ws, inference_ws)) for g in ws.graphs]
    assert len(gdirs) == 5
    # Each replay is its own process (mostly importing torch): two at a time use both cores of a small CI box.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(rerun, gdirs))
    for gdir, r in zip(gdirs, results):
        assert r.ok, r.problems
        assert r.outputs == len(wsmod.load_graph_json(gdir)["outputs"])


def test_dynamic_shapes_are_recorded_as_not_eligible_with_reasons(ineligible_capture):
    ws_path, stdout = ineligible_capture  # captured once per session (conftest), also read by test_report
    assert "ineligible fixture done" in stdout  # the user's own output still reaches the terminal
    graphs = wsmod.load(ws_path).graphs
    reasons = sorted(g.reason.split(" ")[0] for g in graphs if not g.eligible)
    assert reasons == ["dynamic", "dynamic"], [g.reason for g in graphs]
    assert sum(g.eligible for g in graphs) == 1


def test_inputs_past_the_byte_budget_keep_metadata_only_and_say_so(tmp_path, inductor_cache):
    ws_path = tmp_path / "ws"
    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(FIXTURES / "ineligible.py"), "-w", str(ws_path),
           "--max-input-bytes", "1000", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    plain = [g for g in wsmod.load(ws_path).graphs if g.reason.startswith("inputs not stored")]
    assert len(plain) == 1 and not plain[0].data_stored and not plain[0].eligible
    meta = wsmod.load_graph_json(wsmod.graph_dir(ws_path, plain[0].key))
    assert meta["inputs"][0]["shape"] == [4096] and not (wsmod.graph_dir(ws_path, plain[0].key) / "data.pt").exists()


def test_capture_json_lists_graphs_and_passes_the_scripts_own_arguments(tmp_path, inductor_cache):
    p = run_capture_subprocess(EXAMPLES / "inference.py", tmp_path / "ws", "--steps", "1", "--batch", "8")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout[p.stdout.index("{"):])
    assert doc["workspace"]["argv"] == ["--steps", "1", "--batch", "8"]
    (g,) = doc["workspace"]["graphs"]
    meta = wsmod.load_graph_json(wsmod.graph_dir(tmp_path / "ws", g["key"]))
    assert [8, 128] in [i["shape"] for i in meta["inputs"]]


@pytest.fixture(scope="module")
def raises_capture(tmp_path_factory, inductor_cache):
    """tests/fixtures/raises.py captured once (it compiles one graph, then raises): the workspace and the
    finished process. Read-only: test_append_adds_new_graphs_to_an_existing_workspace appends to a copy."""
    ws = tmp_path_factory.mktemp("ws-raises") / "ws"
    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(FIXTURES / "raises.py"), "-w", str(ws)]
    return ws, subprocess.run(cmd, capture_output=True, text=True)


def test_script_that_raises_exits_1_with_its_traceback_and_keeps_the_graph_captured_before(raises_capture):
    ws_path, p = raises_capture
    assert p.returncode == 1
    assert "boom from the user's script" in p.stderr and "raises.py" in p.stderr
    assert "run the script without tilesmith" in p.stderr
    ws = wsmod.load(ws_path)
    assert ws.status == "script-failed" and len(ws.graphs) == 1 and ws.graphs[0].data_stored


def test_script_that_never_calls_torch_compile_is_an_error_with_a_hint(tmp_path):
    r = runner.invoke(app, ["capture", str(FIXTURES / "no_compile.py"), "-w", str(tmp_path / "ws"), "--", "--flag"])
    assert r.exit_code == 1
    assert "compiled no graph" in r.stderr and "hint:" in r.stderr
    assert "argv: ['--flag']" in r.stdout


def test_missing_script_is_an_error_and_writes_nothing(tmp_path):
    r = runner.invoke(app, ["capture", str(tmp_path / "nope.py"), "-w", str(tmp_path / "ws")])
    assert r.exit_code == 1 and "script not found" in r.stderr
    assert not (tmp_path / "ws").exists()


def test_existing_workspace_is_refused_unless_force_or_append(tmp_path, training_ws):
    r = runner.invoke(app, ["capture", str(FIXTURES / "no_compile.py"), "-w", str(training_ws)])
    assert r.exit_code == 1 and "already exists" in r.stderr and "--force" in r.stderr
    assert len(wsmod.load(training_ws).graphs) == 4  # untouched
    other = tmp_path / "not-a-workspace"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    r = runner.invoke(app, ["capture", str(FIXTURES / "no_compile.py"), "-w", str(other), "--force"])
    assert r.exit_code == 1 and (other / "precious.txt").exists()


def test_append_adds_new_graphs_to_an_existing_workspace(tmp_path, raises_capture):
    ws_path = tmp_path / "ws"
    shutil.copytree(raises_capture[0], ws_path)  # a copy: the module's capture stays as it was
    assert [g.kind for g in wsmod.load(ws_path).graphs] == ["inference"]
    cmd = [sys.executable, "-m", "tilesmith_cli.app", "capture", str(EXAMPLES / "inference.py"), "-w", str(ws_path),
           "--append", "--", "--steps", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert sorted(g.kind for g in wsmod.load(ws_path).graphs) == ["inference", "inference"]


def test_unwritable_workspace_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = runner.invoke(app, ["capture", str(FIXTURES / "no_compile.py"), "-w", str(blocker / "ws")])
    assert r.exit_code == 1 and "cannot write the workspace" in r.stderr


def test_workspace_without_its_toml_says_the_capture_did_not_finish(tmp_path):
    (tmp_path / "graphs").mkdir()
    with pytest.raises(Exception, match="workspace.toml is missing") as e:
        wsmod.load(tmp_path)
    assert "did not finish" in e.value.hint


@pytest.mark.parametrize("module", ["tilesmith", "tilesmith.runtime"])
def test_importing_the_library_loads_no_inductor_cli_or_agent_modules(module):
    code = (f"import sys, {module}; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('typer', 'rich', 'langchain', 'deepagents', 'tilesmith_cli') or m.startswith('torch._inductor')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
