"""The tuner's graph rewrites (tilesmith/search/rewrites), on CPU with real Inductor and real workers: each changes
a real captured graph (a transformer block's parallel linears, a ViT's patch embedding), keeps its ABI, gives its
captured outputs, and passes the gate's correctness check (static screen and allowlist included); a graph that
does not meet a rewrite's precondition is skipped with the reason. The rewrites are off unless TILESMITH_REWRITES
is set, and unset the re-lowering search's variants are exactly the config variants."""

from __future__ import annotations

import re

import pytest
import torch

from tests import gate_helpers as h
from tilesmith.capture import loading
from tilesmith.errors import TilesmithError
from tilesmith.gate import Policy, judge, static
from tilesmith.search import Candidate, relower, rewrites
from tilesmith.workspace import Graph

MERGE, PATCH = rewrites.REWRITES["merge-linears"], rewrites.REWRITES["patchify-conv"]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # workers inherit it: a shared 2-CPU machine


@pytest.fixture(scope="session")
def block_graph(tmp_path_factory, inductor_cache):
    from tests.conftest import FIXTURES, captured_workspace

    return h.graph_of(captured_workspace(tmp_path_factory, "ws-tiny-block", FIXTURES / "tiny_block.py"))


@pytest.fixture(scope="session")
def vit_graph(tmp_path_factory, inductor_cache):
    from tests.conftest import FIXTURES, captured_workspace

    return h.graph_of(captured_workspace(tmp_path_factory, "ws-tiny-vit", FIXTURES / "tiny_vit.py"))


class _Track:
    """What the tuner hands an optimizer: the graph, the best source so far, a profile, a log, a clock."""

    def __init__(self, gdir, profile=None):
        self.graph_dir, self.graph, self.best_text = gdir, Graph(gdir), (gdir / "wrapper.py").read_text()
        self.profile, self.records = profile, []

    def record(self, event: dict) -> None:
        self.records.append(event)

    def expired(self) -> bool:
        return False


def _calls(text: str, name: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if not ln.lstrip().startswith("#") and f"{name}(" in ln]


def _gives_captured_outputs(gdir, text: str) -> None:
    data = loading.load_graph_data(gdir)
    with torch.no_grad():
        out = loading.load_module(text, data.constants).call(loading.clone_args(data.inputs))
    assert len(out) == len(data.outputs)
    for a, b in zip(out, data.outputs):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _gate_finds_it_correct(gdir, text: str, tmp_path) -> None:
    """The gate's static screen, allowlist and correctness stages on every input set (no timing: CPU speed on a
    shared machine is not what these tests are about)."""
    assert static.screen(text) == [] and static.allowlist(text) == []
    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    v = judge(gdir, cand, Policy(correctness_only=True, confirm=False, random_sets=2))
    assert v.checked_only and v.reasons == [] and v.stage == "correctness", v.reasons
    assert v.first.correctness and all(c.ok for c in v.first.correctness)


def test_a_blocks_q_k_v_and_gate_up_projections_become_two_gemms_that_the_gate_finds_correct(block_graph, tmp_path):
    """Through the search as the tuner runs it on CPU (re-lowering `auto`, so the rewrites are its only variants):
    7 GEMMs become 4 (q/k/v one, gate/up one, o and down as they were); the other rewrite is skipped, with why."""
    track = _Track(block_graph)
    cfg = relower.RelowerConfig(enabled="auto", jobs=2, rewrites="1")
    gen = relower.search(track, Candidate, cfg, screen_budget_s=0.3, min_gain=-1.0)  # -1: every screened variant
    cand = next(gen)
    gen.close()
    assert cand.label == relower.LABEL_PREFIX + MERGE.label
    assert len(_calls(track.best_text, "extern_kernels.mm")) == 7
    mms = _calls(cand.text, "extern_kernels.mm")
    assert len(mms) == 4 and sum("(64, 192)" in c for c in mms) == 1 and sum("(64, 256)" in c for c in mms) == 1, mms
    by = {r["variant"].removeprefix(relower.LABEL_PREFIX): r for r in track.records}
    assert by[PATCH.label]["error"] == "the graph calls no aten.convolution"
    assert by[MERGE.label]["median_ms"] and by[MERGE.label]["current_ms"]  # screened on the whole call
    assert by[MERGE.label]["max_abs_error"] < 1e-5
    _gives_captured_outputs(block_graph, cand.text)
    _gate_finds_it_correct(block_graph, cand.text, tmp_path)


def test_a_vits_patch_convolution_becomes_a_gemm_alone_or_with_q_k_v_merged_and_the_gate_finds_both_correct(
        vit_graph, tmp_path):
    """Alone; then with merge-linears, as relower.merge combines two screened winners (applied one after the
    other): 7 addmm and a convolution become 6 addmm (the patches', q/k/v as one, o, the MLP's two, the head)."""
    orig = (vit_graph / "wrapper.py").read_text()
    assert len(_calls(orig, "extern_kernels.convolution")) == 1 and len(_calls(orig, "extern_kernels.addmm")) == 7
    both = relower.merge([relower.Variant(PATCH.label, {}, trace=PATCH.name),
                          relower.Variant(MERGE.label, {}, trace=MERGE.name)])
    assert both.trace == "patchify-conv+merge-linears" and both.label == f"{PATCH.label} + {MERGE.label}"
    alone, lw = relower.lower_variants(vit_graph, [relower.Variant(PATCH.label, {}, trace=PATCH.name), both], jobs=2)
    assert alone.text is not None and lw.text is not None, (alone.reason, lw.reason)
    assert not _calls(alone.text, "extern_kernels.convolution") and not _calls(lw.text, "extern_kernels.convolution")
    # [2*4*4 patches, 3*8*8] times the weight as [192, 64], with the bias
    assert any("(32, 192)" in c and "(192, 64)" in c for c in _calls(alone.text, "extern_kernels.addmm"))
    addmms = _calls(lw.text, "extern_kernels.addmm")
    assert len(addmms) == 6 and sum("(64, 192)" in c for c in addmms) == 1, addmms
    for text in (alone.text, lw.text):
        _gives_captured_outputs(vit_graph, text)
        _gate_finds_it_correct(vit_graph, text, tmp_path)


def test_in_a_training_forward_the_merged_q_k_v_it_returns_for_the_backward_keep_their_layout(tmp_path_factory,
                                                                                             inductor_cache, tmp_path):
    """The forward graph returns q, k and v (views of the GEMMs' outputs) for the backward: those slices are copied
    to buffers of the original layout, so the graph's ABI holds; the gate finds the forward correct."""
    import json

    from tests.conftest import FIXTURES, captured_workspace

    ws = captured_workspace(tmp_path_factory, "ws-tiny-block-train", FIXTURES / "tiny_block.py", "--train")
    (fwd,) = [g for g in (ws / "graphs").iterdir() if json.loads((g / "graph.json").read_text())["kind"] == "forward"]
    (lw,) = relower.lower_variants(fwd, [relower.Variant(MERGE.label, {}, trace=MERGE.name)], jobs=1)
    assert lw.text is not None, lw.reason
    before = _calls((fwd / "wrapper.py").read_text(), "extern_kernels.mm")
    assert len(_calls(lw.text, "extern_kernels.mm")) == len(before) - 3  # q/k/v as one, gate/up as one
    (bwd,) = [g for g in (ws / "graphs").iterdir() if json.loads((g / "graph.json").read_text())["kind"] == "backward"]
    (skipped,) = relower.lower_variants(bwd, [relower.Variant(MERGE.label, {}, trace=MERGE.name)], jobs=1)
    # the backward's GEMMs read the gradients, each its own (merging those that share a right operand: not yet)
    assert skipped.text is None and skipped.reason.startswith("no two of its "), skipped.reason
    assert skipped.reason.endswith("of one kind read the same input")
    _gives_captured_outputs(fwd, lw.text)
    _gate_finds_it_correct(fwd, lw.text, tmp_path)


def test_unset_or_0_the_rewrites_are_off_and_the_search_is_what_it_was(block_graph, monkeypatch):
    monkeypatch.delenv("TILESMITH_REWRITES", raising=False)
    track = _Track(block_graph)
    for value in (None, "0", "off", ""):
        if value is not None:
            monkeypatch.setenv("TILESMITH_REWRITES", value)
        cfg = relower.RelowerConfig(enabled="1")
        assert rewrites.chosen(cfg.rewrites) == []
        assert relower._variants(track, cfg, [], True) == relower.CPU_VARIANTS
        # re-lowering `auto` on a CPU graph: nothing to try, nothing started, nothing recorded
        assert list(relower.search(track, Candidate, relower.RelowerConfig(enabled="auto"))) == []
    assert track.records == []
    monkeypatch.setenv("TILESMITH_REWRITES", "patchify-conv")
    cfg = relower.RelowerConfig(enabled="1")
    assert relower._variants(track, cfg, rewrites.chosen(cfg.rewrites), True) == \
        [relower.Variant(PATCH.label, {}, trace="patchify-conv"), *relower.CPU_VARIANTS]
    assert relower._variants(track, cfg, [PATCH], False) == [relower.Variant(PATCH.label, {}, trace="patchify-conv")]
    off = relower.RelowerConfig(enabled="0", rewrites="1")  # TILESMITH_RELOWER=0 turns the rewrites off too
    assert list(relower.search(track, Candidate, off)) == []


def test_the_setting_takes_all_some_or_none_and_an_unknown_name_is_a_usage_error():
    assert rewrites.chosen("1") == rewrites.chosen(" All ") == [MERGE, PATCH]
    assert rewrites.chosen("patchify-conv, merge-linears,patchify-conv") == [PATCH, MERGE]
    with pytest.raises(TilesmithError, match="names no rewrite merge-gemms") as e:
        rewrites.chosen("merge-linears,merge-gemms")
    assert e.value.code == "usage"


def _kernel(name: str, ms: float, headroom_ms=None):
    from tilesmith.profile.baseline import KernelTime

    return KernelTime(name, "extern", 1, ms, 0.0, headroom_ms=headroom_ms)


def test_the_profile_orders_the_rewrites_by_the_time_in_their_kernels_and_rules_out_those_with_none(block_graph):
    from tilesmith.profile.baseline import Profile

    def prof(*kernels):
        return Profile("k", "cpu", 1.0, 1.0, 0.0, 0.0, kernels=list(kernels))

    vit_like = prof(_kernel("extern_kernels.mm", 0.2), _kernel("extern_kernels.convolution", 0.5),
                    _kernel("cpp_fused_gelu_0", 0.3))
    assert rewrites.ordered([MERGE, PATCH], vit_like) == ([PATCH, MERGE], [])
    gpu_like = prof(_kernel("triton_tem_fused_addmm_1", 0.4, headroom_ms=0.3), _kernel("extern_kernels.bmm", 1.0),
                    _kernel("triton_tem_fused_convolution_0", 0.5, headroom_ms=0.1))
    assert rewrites.ordered([PATCH, MERGE], gpu_like) == ([MERGE, PATCH], [])  # by headroom, not time
    mm_only = prof(_kernel("extern_kernels.mm", 0.2), _kernel("extern_kernels.bmm", 1.0))
    kept, skipped = rewrites.ordered([MERGE, PATCH], mm_only)
    assert kept == [MERGE] and [r for r, _ in skipped] == [PATCH] and "no time" in skipped[0][1]
    assert rewrites.ordered([MERGE, PATCH], None) == ([MERGE, PATCH], [])
    tiny_conv = prof(_kernel("extern_kernels.mm", 0.5), _kernel("extern_kernels.convolution", 0.005))  # of 1 ms
    kept, skipped = rewrites.ordered([MERGE, PATCH], tiny_conv, min_share=0.01)
    assert kept == [MERGE] and [r for r, _ in skipped] == [PATCH] and "take 0.5% of the call" in skipped[0][1]
    assert rewrites.ordered([MERGE, PATCH], tiny_conv, min_share=-1.0) == ([MERGE, PATCH], [])
    track = _Track(block_graph, profile=prof(_kernel("extern_kernels.mm", 0.2)))
    cfg = relower.RelowerConfig(enabled="auto", rewrites="1")
    assert relower._variants(track, cfg, [MERGE, PATCH], False) == [relower.Variant(MERGE.label, {}, trace=MERGE.name)]
    (rec,) = track.records
    assert rec["variant"] == relower.LABEL_PREFIX + PATCH.label and "no time" in rec["error"]


def test_the_profiles_kernel_patterns_match_library_calls_and_templates_but_not_batched_gemms():
    gemms = ["extern_kernels.mm", "extern_kernels.addmm", "triton_tem_fused_addmm_3", "triton_tem_fused_mm_0"]
    others = ["extern_kernels.bmm", "triton_tem_fused_bmm_0", "cpp_fused_mean_2", "extern_kernels.convolution"]
    assert [n for n in gemms + others if re.search(MERGE.kernels, n)] == gemms
    assert [n for n in gemms + others if re.search(PATCH.kernels, n)] == ["extern_kernels.convolution"]


def test_graph_rewrites_combine_with_each_other_but_not_with_a_decomposition():
    t = relower.Variant("t", {}, trace="topk-as-sort")
    m = relower.Variant("m", {}, trace=MERGE.name)
    p = relower.Variant("p", {"combo_kernels": True}, trace=PATCH.name)
    assert relower.merge([m, t]) is None  # one usable variant: no combination
    assert relower.merge([m, p, t]) == relower.Variant("m + p", {"combo_kernels": True},
                                                       trace="merge-linears+patchify-conv")
    assert relower._combined("merge-linears+patchify-conv", MERGE.name) == "merge-linears+patchify-conv"
    assert relower._combined("topk-as-sort", "") == "topk-as-sort" and relower._combined(MERGE.name, "topk-as-sort") is None
    assert rewrites.named("patchify-conv+merge-linears") == [PATCH, MERGE]
    assert rewrites.named("topk-as-sort") == rewrites.named("merge-linears+topk-as-sort") == rewrites.named("") == []
