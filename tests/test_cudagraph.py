"""tilesmith.cudagraph on CPU (real captured wrappers): the screen lets exactly this helper in, the
helper makes the plain call where no CUDA graph can run, and the tuner proposes it only for CUDA
graphs that run as plain launches. The replay itself is tested on the GPU (tests/gpu)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from tests import gate_helpers as h
from tilesmith.capture import loading
from tilesmith.cudagraph import Graphed, graphed
from tilesmith.gate.static import screen
from tilesmith.search import tuner
from tilesmith.workspace import Graph


def test_graphed_wrapper_passes_the_static_screen_and_other_tilesmith_imports_do_not(inference_ws):
    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    g = tuner.graphed_text(text)
    assert g != text and tuner.graphed_text(g) == g  # applied once
    assert screen(g) == []
    for bad in ("from tilesmith.cudagraph import Graphed", "import tilesmith.cudagraph", "from tilesmith import store",
                "import tilesmith.gate.static", "from tilesmith.cudagraph import graphed, _Entry"):
        assert "static-tilesmith" in {f.code for f in screen(h.with_module_code(text, bad))}, bad


def test_gate_recognises_a_wrapper_that_replays_itself(inference_ws):
    from tilesmith.gate import own_replay

    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    assert own_replay(tuner.graphed_text(text)) and not own_replay(text)
    # Only where the module's call is the helper's replay (the runtime then turns Inductor's CUDA graphs off):
    # a call that merely uses a replay inside runs under Inductor's trees in the program.
    inner = text + "\nfrom tilesmith.cudagraph import graphed\n_g = graphed(call)\n\ndef call(args):\n    return _g(args)\n"
    assert not own_replay(inner)
    assert not own_replay(tuner.graphed_text(text) + "\ncall = call\n")
    assert not own_replay(tuner.graphed_text(text) + "\ndef call(args):\n    return None\n")
    assert not own_replay(text + "\nfrom tilesmith.cudagraph import graphed\nif True:\n    call = graphed(call)\n")
    # Statements after it that do not bind call (Inductor's benchmark block, comments) change nothing.
    tail = "\nfrom tilesmith.cudagraph import graphed\ncall = graphed(call)  # replay\n"
    assert own_replay(text + tail + "\ndef benchmark_compiled_module():\n    pass\n\nif __name__ == '__main__':\n    pass\n")


def test_a_reduce_overhead_original_is_timed_through_the_trees_against_a_candidate_that_replays_itself(
        inference_ws, tmp_path):
    """The gate's timing modes per role for a graph compiled with CUDA graphs (graph mode): a candidate that
    replays itself runs as plain calls of its replay, the original through Inductor's cudagraph trees (as the
    program runs it; gate/worker/trees.py), a best-so-far that replays itself as plain calls too. A candidate
    that does not replay itself, with no graph.json given: both in graph mode (with it: the next test). (The
    trees run on the GPU: tests/gpu.)"""
    from tilesmith.gate.modes import role_modes
    from tilesmith.gate.verdict import Verdict

    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    own = tuner.graphed_text(text).encode()
    v = Verdict(False, "timing", "k", "")
    assert role_modes(v, "graph", own, None) == {"candidate": "launch", "baseline": "trees"}
    assert "cudagraph trees" in v.warnings[-1].message
    best = tmp_path / "best.py"
    best.write_bytes(own)
    assert role_modes(Verdict(False, "timing", "k", ""), "graph", own, best) == {"candidate": "launch",
                                                                                           "baseline": "launch"}
    assert role_modes(v, "graph", text.encode(), None) == {} and role_modes(v, "launch", own, None) == {}


def test_the_originals_checks_read_a_kept_call_as_the_candidates_own_timing_mode_held_it(inference_ws):
    """Launch timing holds a kept call's outputs, and the inputs it updated in place, until the sample ends; the
    original's checks must read them the same way (late) wherever the candidate ran in launch mode: on a graph
    compiled with CUDA graphs that is a candidate replaying itself. Read by the graph's mode instead, a decode step's
    replay had its cache, held to the sample's end, compared with the original's as the kept call left it:
    `wrong-values-in-timing` on every GPU run (tests/gpu/test_decode_gpu.py)."""
    from tests.gate_helpers import decision_context
    from tilesmith.gate.modes import role_modes
    from tilesmith.gate.timed import kept_late
    from tilesmith.gate.verdict import Verdict

    text = (h.graph_of(inference_ws) / "wrapper.py").read_text()
    own = tuner.graphed_text(text).encode()
    replaying = role_modes(Verdict(False, "timing", "k", ""), "graph", own, None)
    assert kept_late(decision_context(mode="graph", modes=replaying))
    assert not kept_late(decision_context(mode="graph", modes={}))  # copied inside the sample, as the graph keeps them
    assert not kept_late(decision_context(mode="graph", modes={"candidate": "trees", "baseline": "trees"}))
    assert kept_late(decision_context(mode="launch", modes={}))



def test_a_candidate_that_does_not_replay_itself_runs_through_the_trees_as_the_original_where_each_call_has_its_inputs(
        inference_ws, tmp_path):
    """Code the program's trees will run (a reduce-overhead graph's plain candidate): the original and the
    candidate both through the trees, as the program runs installed code, where Inductor's static marks let
    each call read its own buffer set (gate.inputs.trees_static); never where every call would read the same
    inputs (a cache keyed on them). The candidate and the original beside it are set up in one request then
    (timed._setups), so the worker frees earlier trees once for both."""
    from types import SimpleNamespace

    from tilesmith.gate.modes import role_modes
    from tilesmith.gate.timed import _setups
    from tilesmith.gate.verdict import Verdict

    gdir = h.graph_of(inference_ws)
    meta = json.loads((gdir / "graph.json").read_text())
    text = (gdir / "wrapper.py").read_text()
    v = Verdict(False, "timing", "k", "")
    assert role_modes(v, "graph", text.encode(), None, meta) == {"candidate": "trees", "baseline": "trees"}
    assert [w.code for w in v.warnings] == ["trees"] and "cudagraph trees" in v.warnings[0].message
    unknown = {k: x for k, x in meta.items() if k != "inductor_static_inputs"}
    fed = {**meta, "inputs_from_graphs": [0]}
    for m in (unknown, fed, None):
        assert role_modes(Verdict(False, "timing", "k", ""), "graph", text.encode(), None, m) == {}
    best = tmp_path / "best.py"
    best.write_text(tuner.graphed_text(text))  # the best so far replays itself: it runs its replay in the program
    assert role_modes(Verdict(False, "timing", "k", ""), "graph", text.encode(), best, meta) == {
        "candidate": "trees", "baseline": "launch"}
    assert role_modes(Verdict(False, "timing", "k", ""), "launch", text.encode(), None, meta) == {}

    ref, w = SimpleNamespace(timer="T", base_role="original"), "W"
    trees = h.decision_context(mode="graph", modes={"candidate": "trees", "baseline": "trees"})
    assert _setups(trees, ref, w, "graph") == [("T", ["original"], "trees"), ("W", ["candidate", "baseline"], "trees")]
    own = h.decision_context(modes={"candidate": "launch", "baseline": "trees"})
    assert _setups(own, ref, w, "graph") == [("T", ["original"], "trees"), ("W", ["candidate"], "launch"),
                                             ("W", ["baseline"], "trees")]
    assert _setups(h.decision_context(modes={}), ref, w, "graph") == [("T", ["original"], "graph"),
                                                                   ("W", ["candidate"], "graph"),
                                                                   ("W", ["baseline"], "graph")]


def test_trees_mode_refuses_a_graph_that_updates_its_inputs_and_fits_this_torchs_cudagraphify(inference_ws):
    """The worker's trees mode falls back to a bare replay where the trees' cheapest path is unknown (inputs
    updated in place) or Inductor's cudagraphify wants what it is not given; on this torch it is set up
    (nothing is recorded until the first call, which needs CUDA)."""
    import pytest

    from tilesmith.gate.worker.trees import tree_function, tree_thunks

    gdir = h.graph_of(inference_ws)
    data = loading.load_graph_data(gdir)
    mod = loading.load_module((gdir / "wrapper.py").read_text(), data.constants)
    with pytest.raises(ValueError, match="updates inputs in place"):
        tree_thunks(mod.call, [loading.clone_args(data.inputs)] * 2, "cpu", [0])
    assert callable(tree_function(mod.call, loading.clone_args(data.inputs), "cpu"))
    assert callable(tree_function(mod.call, loading.clone_args(data.inputs), "cpu", static=[]))


def test_the_trees_mark_static_what_inductor_did_where_the_gate_keeps_it_at_one_address(inference_ws):
    """Capture records Inductor's static_input_idxs; the gate's trees mode marks exactly those static (and
    copies the rest in, as the program's trees do) only where each is an input the gate's buffer sets keep
    at one address; else None (every input static, the trees' cheapest path)."""
    from tilesmith.gate.inputs import parameter_indices, trees_static

    meta = json.loads((h.graph_of(inference_ws) / "graph.json").read_text())
    marked = meta["inductor_static_inputs"]
    assert isinstance(marked, list) and set(marked) <= parameter_indices(meta)
    assert trees_static(meta) == sorted(marked)
    params = sorted(parameter_indices(meta))
    assert params, "the example's weights are graph inputs"
    assert trees_static({**meta, "inductor_static_inputs": params[:1]}) == params[:1]
    assert trees_static({**meta, "inductor_static_inputs": []}) == []  # nothing static: every input copied
    moving = [i for i in range(len(meta["inputs"])) if i not in params]
    assert moving and trees_static({**meta, "inductor_static_inputs": params + moving[:1]}) is None
    assert trees_static({k: v for k, v in meta.items() if k != "inductor_static_inputs"}) is None


def test_graphed_makes_the_plain_call_on_cpu_with_the_same_outputs(inference_ws):
    gdir = h.graph_of(inference_ws)
    data = loading.load_graph_data(gdir)
    text = (gdir / "wrapper.py").read_text()
    plain = loading.load_module(text, data.constants)
    wrapped = loading.load_module(tuner.graphed_text(text), data.constants)
    assert isinstance(wrapped.call, Graphed) and graphed(wrapped.call) is wrapped.call
    for _ in range(2):
        args = loading.clone_args(data.inputs)
        got = wrapped.call(args)
        assert args == []  # the wrapper ABI: the callee clears the list
        want = plain.call(loading.clone_args(data.inputs))
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert wrapped.call.replays == 0 and wrapped.call.plain_calls == 2
    assert wrapped.call.plain_reasons() == ["not all tensors on one CUDA device"]


def test_graphed_runs_plain_for_arguments_it_cannot_key():
    seen = []
    g = graphed(lambda args: seen.append(list(args)) or (torch.zeros(1),))
    out = g([object(), torch.ones(2)])
    assert len(seen) == 1 and torch.equal(out[0], torch.zeros(1)) and g.plain_calls == 1


def test_tuner_proposes_the_cuda_graph_variant_for_launch_bound_cuda_graphs_also_under_reduce_overhead(inference_ws, tmp_path):
    import json
    import shutil

    cpu = h.graph_of(inference_ws)
    text = (cpu / "wrapper.py").read_text()
    track = lambda gdir, share, best=text: SimpleNamespace(  # noqa: E731
        graph_dir=gdir, graph=Graph(gdir), best_text=best,
        profile=None if share is None else SimpleNamespace(launch_overhead_share=share))
    cfg = tuner.TunerConfig()
    assert not tuner._graphable(track(cpu, 0.9), cfg)  # a CPU graph
    cuda = tmp_path / "g"
    shutil.copytree(cpu, cuda)
    meta = json.loads((cuda / "graph.json").read_text())
    (cuda / "graph.json").write_text(json.dumps({**meta, "device": "cuda:0", "compile_mode": "plain"}))
    assert tuner._graphable(track(cuda, 0.9), cfg) and tuner._graphable(track(cuda, None), cfg)
    assert not tuner._graphable(track(cuda, 0.05), cfg)  # kernel-bound: nothing to win
    assert not tuner._graphable(track(cuda, 0.9, tuner.graphed_text(text)), cfg)  # already graphed
    (cuda / "graph.json").write_text(json.dumps({**meta, "device": "cuda:0", "compile_mode": "cudagraphs"}))
    # Inductor replays it (reduce-overhead): our replay of the same code is tried against Inductor's.
    assert tuner._graphable(track(cuda, 0.9), cfg) and tuner._graphed_label(track(cuda, 0.9)) != tuner.GRAPHED_LABEL
    # Proposed to the gate without a screen there (the screen would time plain launches, the gate Inductor's
    # replay), and for a plainly compiled graph whose profile says launch overhead is most of the call.
    assert not tuner._screen_graphed(track(cuda, 0.3), cfg)
    (cuda / "graph.json").write_text(json.dumps({**meta, "device": "cuda:0", "compile_mode": "plain"}))
    assert not tuner._screen_graphed(track(cuda, 0.9), cfg)
    assert tuner._screen_graphed(track(cuda, 0.3), cfg) and tuner._screen_graphed(track(cuda, None), cfg)


def test_graphed_layout_key_is_the_arity_and_the_non_tensor_values():
    from tilesmith.replay.graphed import _layout

    x = torch.ones(3)
    assert _layout([x, 1]) != _layout([x, 2]) and _layout([x, 1]) == _layout([x.clone(), 1])
    assert _layout([x]) != _layout([x, x]) and _layout([[1]]) is None
    # Tensor shapes are not part of it: an Inductor wrapper's shapes follow from its size arguments.
    assert _layout([x]) == _layout([torch.ones(4)])
