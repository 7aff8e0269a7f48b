"""Whole-graph re-lowering on CPU (real Inductor, real worker processes): capture keeps the repro Inductor
lowered, bound to the captured constants; a variant is lowered again in a worker, keeps the graph's ABI,
passes the static screen and gives the captured outputs; a config this torch lacks and a variant that
lowers to the same wrapper are skipped with their reasons, recorded like every screened variant."""

from __future__ import annotations

import torch

from tests import gate_helpers as h
from tilesmith.capture import loading
from tilesmith.capture import repro
from tilesmith.gate.static import screen
from tilesmith.search import relower
from tilesmith.search import Candidate
from tilesmith.workspace import Graph, load_graph_json


def test_capture_keeps_the_lowered_graphs_repro_and_says_it_can_be_lowered_again(inference_ws):
    gdir = h.graph_of(inference_ws)
    meta = load_graph_json(gdir)
    assert meta["relower"]["available"], meta["relower"]
    text = (gdir / repro.REPRO_FILE).read_text()
    assert "class Repro(" in text and "TORCHINDUCTOR_CACHE_DIR" not in text
    assert len(repro.placeholders(text)) == len(meta["inputs"])
    assert relower.available(Graph(gdir)) == (True, "")


def test_repro_status_binds_large_constants_by_name_and_says_why_when_it_cannot():
    text = ("class Repro(torch.nn.Module):\n    def __init__(self) -> None:\n        super().__init__()\n"
            "        self.register_buffer('_tensor_constant0', torch.randn([8, 4], dtype=torch.float32))\n"
            "        self.register_buffer('_tensor_constant1', tensor([2., 3.]))\n\n"
            "    def forward(self, arg0_1, arg1_1):\n        return (arg0_1,)\n")
    st = repro.status(text, {"_tensor_constant0": torch.zeros(8, 4)})
    assert st.available and st.bound == ["_tensor_constant0"] and st.inline == ["_tensor_constant1"]
    assert repro.placeholders(text) == ["arg0_1", "arg1_1"]
    missing = repro.status(text, {})
    assert not missing.available and "_tensor_constant0" in missing.reason
    wrong = repro.status(text, {"_tensor_constant0": torch.zeros(4, 8)})
    assert not wrong.available and "shape" in wrong.reason
    assert not repro.status("", {}).available


class _Track:
    """What the tuner hands an optimizer: the graph, the best source so far, a log, a clock."""

    def __init__(self, gdir):
        self.graph_dir, self.best_text, self.profile, self.records = gdir, (gdir / "wrapper.py").read_text(), None, []
        self.graph = Graph(gdir)

    def record(self, event: dict) -> None:
        self.records.append(event)

    def expired(self) -> bool:
        return False


def test_relowered_variant_keeps_the_abi_and_skipped_variants_say_why(inference_ws):
    gdir = h.graph_of(inference_ws)
    track = _Track(gdir)
    cfg = relower.RelowerConfig(enabled="1", jobs=2, variants=[
        relower.Variant("scalar C++", {"cpp.vec_isa_ok": False}),
        relower.Variant("missing", {"no_such_config": True}),
        relower.Variant("as captured", {}),
    ])
    # min_gain=-1: every variant that screens at all becomes a candidate (the gate would judge speed).
    gen = relower.search(track, Candidate, cfg, screen_budget_s=0.3, min_gain=-1.0)
    cand = next(gen)
    assert cand.label == relower.LABEL_PREFIX + "scalar C++"
    by = {r["variant"].removeprefix(relower.LABEL_PREFIX): r for r in track.records}
    assert "has no Inductor config no_such_config" in by["missing"]["error"]
    assert "same wrapper" in by["as captured"]["error"]
    assert by["scalar C++"]["median_ms"] and by["scalar C++"]["kernel"] == relower.WHOLE_GRAPH
    assert screen(cand.text) == []
    assert "at::vec::Vectorized" in track.best_text and "at::vec::Vectorized" not in cand.text  # scalar C++
    data = loading.load_graph_data(gdir)
    mod = loading.load_module(cand.text, data.constants)
    with torch.no_grad():
        out = mod.call(loading.clone_args(data.inputs))
    for a, b in zip(out, data.outputs):
        assert a.shape == b.shape and a.stride() == b.stride() and torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    try:
        gen.send({"accepted": True})
        raise AssertionError("the search went on after an accepted candidate")
    except StopIteration:
        pass


def test_merge_keeps_the_better_variants_setting_where_two_contradict():
    a = relower.Variant("a", {"max_autotune_gemm": True, "epilogue_fusion": False})
    b = relower.Variant("b", {"epilogue_fusion": True})
    c = relower.Variant("c", {"combo_kernels": True})
    m = relower.merge([a, b, c])
    assert m.label == "a + c" and m.patch == {"max_autotune_gemm": True, "epilogue_fusion": False, "combo_kernels": True}
    assert relower.merge([a, b]) is None  # one usable variant is no combination
    later = relower.Variant("c + d", {"combo_kernels": True, "triton.enable_pdl": True})  # a second wave's, on c
    assert relower.merge([later, c]).label == "c + d"
    t = relower.Variant("t", {}, trace="topk-as-sort")  # a graph rewrite combines with config patches
    assert relower.merge([t, c]) == relower.Variant("t + c", {"combo_kernels": True}, trace="topk-as-sort")


def test_variants_that_autotune_gemms_come_in_a_second_wave():
    fast, slow = relower._waves(relower.GPU_VARIANTS)
    assert fast and slow and all(v.patch.get("max_autotune_gemm") for v in slow)
    assert not any(v.patch.get("max_autotune_gemm") for v in fast)
    assert relower._waves(relower.CPU_VARIANTS) == [relower.CPU_VARIANTS]


def test_partition_signatures_are_compared_by_graph_inputs_and_counts():
    from tilesmith.search.relower_worker import _partitions

    a = "def partition_0(args):\n    arg0_1, arg1_1, buf2 = args\n    args.clear()\n    return (buf3, buf4, )\n"
    b = a.replace("buf2 = args", "buf7 = args").replace("buf3, buf4", "buf9, buf8")  # other buffer names
    c = a.replace("arg1_1, buf2 = args", "buf2 = args")  # no longer takes graph input arg1_1
    assert _partitions(a) == _partitions(b) == [("partition_0", ("arg0_1", "arg1_1"), 1, 2)]
    assert _partitions(c) != _partitions(a) and _partitions("def call(args):\n    pass\n") == []


def test_topk_traced_as_a_stable_sort_is_lowered_as_a_sort_and_gives_the_captured_outputs(tmp_path_factory,
                                                                                         inductor_cache, inference_ws):
    """The variant for a torch without triton.decompose_sort_ops (2.11 on the H200): each topk traced as a
    stable sort and its first k. On CPU Inductor calls ATen's sort for it (on CUDA it lowers small sorts to
    Triton); the outputs are the captured ones. A graph without topk is skipped before any compile."""
    from tests.conftest import FIXTURES, captured_workspace
    from tilesmith.search.relower_worker import TRACES
    from tilesmith.source import split_header

    gdir = h.graph_of(captured_workspace(tmp_path_factory, "ws-router", FIXTURES / "router_topk.py"))
    (variant,) = [v for v in relower.GPU_VARIANTS if v.trace]
    assert variant.trace in TRACES and variant.patch == {}
    (lw,) = relower.lower_variants(gdir, [variant], jobs=1)
    assert lw.text is not None, lw.reason
    calls = [ln.strip() for ln in split_header(lw.text)[1].splitlines() if "torch.ops.aten." in ln and "= torch" in ln]
    assert any("aten.sort.stable(" in c for c in calls) and not any("aten.topk" in c for c in calls), calls
    assert lw.max_abs_error == 0.0  # the same values; the indices' layout was checked with the ABI
    data = loading.load_graph_data(gdir)
    mod = loading.load_module(lw.text, data.constants)
    with torch.no_grad():
        out = mod.call(loading.clone_args(data.inputs))
    assert all(torch.equal(a, b) for a, b in zip(out, data.outputs))  # expert indices exactly as topk's
    (skipped,) = relower.lower_variants(h.graph_of(inference_ws), [variant], jobs=1)
    assert skipped.text is None and skipped.reason == "the graph calls no aten.topk" and skipped.compile_s is None


def test_topk_as_sort_keeps_an_unsorted_or_0_d_topk_and_matches_a_sorted_one():
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilesmith.search.relower_worker import TRACES

    table = TRACES["topk-as-sort"][1]
    x = torch.randn(5, 7)
    for largest in (True, False):
        want = torch.topk(x, 3, dim=0, largest=largest)
        got = make_fx(lambda t: torch.ops.aten.topk.default(t, 3, 0, largest, True), decomposition_table=table)(x)
        targets = {str(n.target) for n in got.graph.nodes if n.op == "call_function"}
        assert "aten.sort.stable" in targets and "aten.topk.default" not in targets
        v, i = got(x)
        assert torch.equal(v, want.values) and torch.equal(i, want.indices) and v.is_contiguous()
    for f, arg in ((lambda t: torch.ops.aten.topk.default(t, 3, -1, True, False), x),  # unsorted: left as is
                   (lambda t: torch.ops.aten.topk.default(t, 1), torch.tensor(2.0))):  # 0-d: left as is
        gm = make_fx(f, decomposition_table=table)(arg)
        assert "aten.topk.default" in {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


def test_a_replayed_search_sends_each_relowered_variant_to_the_gate_replayed_as_the_screen_timed_it(inference_ws):
    """After the gate found our replay of a reduce-overhead graph not slower than Inductor's trees but short
    of the threshold (GPU-bound), a re-lowered variant goes to the gate replayed too: the two gains add."""
    from tilesmith.search import tuner

    track = _Track(h.graph_of(inference_ws))
    cfg = relower.RelowerConfig(enabled="1", jobs=1, variants=[relower.Variant("scalar C++", {"cpp.vec_isa_ok": False})])
    cand = next(relower.search(track, Candidate, cfg, screen_budget_s=0.3, min_gain=-1.0, replayed=True))
    assert cand.label == relower.LABEL_PREFIX + "scalar C++" + relower.REPLAYED_SUFFIX
    assert tuner.GRAPHED_IMPORT in cand.text and cand.text.count(tuner.GRAPHED_IMPORT) == 1
    assert "at::vec::Vectorized" not in cand.text and screen(cand.text) == []


def test_relowered_variants_go_replayed_only_after_a_near_even_replay_of_a_graph_inductor_replays(tmp_path):
    import json

    from tilesmith.search import tuner

    def near(mode, verdict):
        (tmp_path / "graph.json").write_text(json.dumps({"compile_mode": mode, "device": "cuda:0"}))
        return tuner.replay_near_even(type("T", (), {"graph_dir": tmp_path, "graph": Graph(tmp_path)})(), verdict)

    def timed(speedup, accepted=False, stage="timing", code="not-faster"):
        return {"accepted": accepted, "stage": stage, "first": {"timing": {"speedup": speedup}},
                "reasons": [] if accepted else [{"code": code, "message": "..."}]}

    assert near("cudagraphs", timed(1.003)) and near("cudagraphs", timed(1.0, stage="confirmation"))
    assert not near("cudagraphs", timed(0.98))  # our replay is slower there: re-lowered code goes plain
    assert not near("cudagraphs", timed(1.01, code="wrong-values-in-timing"))  # rejected for its values
    assert not near("cudagraphs", timed(1.01, stage="confirmation", code="wrong-values"))
    assert not near("cudagraphs", timed(1.2, accepted=True))  # accepted: the next loop builds on it
    assert not near("cudagraphs", {"accepted": False, "stage": "correctness", "first": None})
    assert not near("cudagraphs", None)  # no replay proposed
    assert not near("none", timed(1.01))  # a graph Inductor does not replay: the replay has its own candidate


def test_after_an_accepted_relowering_of_a_graph_inductor_replays_the_replay_of_the_new_code_is_proposed(tmp_path,
                                                                                                    monkeypatch):
    """Less GPU work leaves the trees' host time the larger part of the step: after a re-lowered candidate is
    accepted on a reduce-overhead graph, the whole-call replay of the new code goes to the gate next, once,
    and the re-lowering search then goes on with its own verdict."""
    import json

    from tilesmith.search import tuner

    got = []

    def inner():
        got.append(("lowered-1", (yield Candidate("lowered-1", "re-lowered: a"))["n"]))
        got.append(("lowered-2", (yield Candidate("lowered-2", "re-lowered: b"))["n"]))

    def replayed(track, cfg):
        got.append(("replay", (yield Candidate(tuner.graphed_text(track.best_text), "replay"))["n"]))

    monkeypatch.setattr(tuner, "_graphed_step", replayed)
    for mode, want in (("cudagraphs", ["lowered-1", "replay", "lowered-2"]), ("none", ["lowered-1", "lowered-2"])):
        (tmp_path / "graph.json").write_text(json.dumps({"compile_mode": mode, "device": "cuda:0"}))
        track = type("T", (), {"graph_dir": tmp_path, "graph": Graph(tmp_path), "best_text": "def call(args):\n    pass\n"})()
        got.clear()
        gen = tuner._relowered_then_replayed(inner(), track, tuner.TunerConfig())
        seen = [next(gen).text]
        for _ in range(4):
            try:
                seen.append(gen.send({"accepted": True, "n": len(seen)}).text)
            except StopIteration:
                break
        assert [s if s.startswith("lowered") else "replay" for s in seen] == want, seen
        assert sorted(got, key=lambda g: g[1]) == [(w, i + 1) for i, w in enumerate(want)]  # each its own verdict
    closed = []

    def endless():
        try:
            while True:
                yield Candidate("lowered", "re-lowered: c")
        finally:
            closed.append(True)

    gen = tuner._relowered_then_replayed(endless(), track, tuner.TunerConfig())
    next(gen)
    gen.close()  # the tuner's time limit: the re-lowering search is closed with it
    assert closed == [True]


# Inductor's shape of a wrapper with graph partitions (torch/_inductor/codegen/wrapper.py codegen_partition_call): the
# caller builds `partitionN_args` and the partition unpacks it in the same order.
_PARTITIONED = '''
def partition_0(args):
    {unpack} = args
    args.clear()
    buf0 = arg0_1 * 2 + arg2_1
    buf1 = buf0 - arg1_1 * s0
    return (buf1, )


class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def call(self, args):
        arg0_1, arg1_1, arg2_1 = args
        args.clear()
        s0 = 3
        partition0_args = [{unpack}]
        del arg0_1, arg1_1, arg2_1
        (buf1, ) = self.partitions[0](partition0_args)
        del partition0_args
        return (buf1, )


runner = Runner(partitions=[partition_0, ])
call = runner.call
'''


def _run(src: str) -> dict:
    ns: dict = {}
    exec(compile(src, "<wrapper>", "exec"), ns)
    return ns


def test_a_rewritten_graphs_partition_inputs_are_put_in_the_originals_order():
    """patchify-conv on the ViT on an H100 was refused as "changes the graph's ABI: graph partitions": the rewritten
    graph's partition took the same inputs in another order, and Inductor's trees pass them by the original compile's
    positions. The reordered source computes what it did, and reads right when called by the original's positions."""
    from tilesmith.search.relower_worker import _partitions, in_original_order, partition_difference

    orig = _PARTITIONED.format(unpack="arg0_1, arg2_1, arg1_1, s0")
    new = _PARTITIONED.format(unpack="arg0_1, arg1_1, arg2_1, s0")
    assert "same 3 graph inputs in another order (at position 1: arg1_1, the original arg2_1)" \
        in partition_difference(new, orig)
    fixed = in_original_order(new, orig)
    assert _partitions(fixed) == _partitions(orig) and partition_difference(fixed, orig) == ""
    a, b, c = 5.0, 7.0, 11.0
    want = (a * 2 + c) - b * 3
    assert _run(new)["call"]([a, b, c]) == _run(fixed)["call"]([a, b, c]) == (want, )
    # the trees call the partition with the original compile's positions: (arg0_1, arg2_1, arg1_1, s0)
    assert _run(fixed)["partition_0"]([a, c, b, 3]) == (want, )
    assert _run(new)["partition_0"]([a, c, b, 3]) != (want, )  # what the check refuses: the inputs swapped


def test_partitions_that_differ_otherwise_are_left_for_the_check_to_refuse():
    from tilesmith.search.relower_worker import in_original_order, partition_difference

    orig = _PARTITIONED.format(unpack="arg0_1, arg2_1, arg1_1, s0")
    other = _PARTITIONED.format(unpack="arg0_1, arg2_1, arg1_1")  # one input fewer
    assert in_original_order(other, orig) == other
    assert "0 other inputs and 1 outputs, the original 1 and 1" in partition_difference(other, orig)
    swapped = _PARTITIONED.format(unpack="arg0_1, arg2_1, arg3_1, s0")
    assert in_original_order(swapped, orig) == swapped
    assert "takes graph inputs arg3_1 the original's does not, and not arg1_1" in partition_difference(swapped, orig)
    assert in_original_order(orig, orig) == orig and partition_difference(orig, orig) == ""
    # the same graph inputs in the same order among the other inputs, placed elsewhere: put where the original has them
    moved = _PARTITIONED.format(unpack="s0, arg0_1, arg2_1, arg1_1")
    assert in_original_order(moved, orig) == orig
