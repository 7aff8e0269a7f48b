"""The gate's trees mode without a GPU: which roles run through Inductor's cudagraph trees, what happens when
the trees cannot be set up for one of them (gate/timed.py set_up), the worker's bookkeeping of which roles hold
trees and when they are freed (gate/worker/setup.py op_time_setup), and that candidate code cannot change the trees
unseen (the patch watch). The trees themselves run on the GPU: tests/gpu/test_cudagraph_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests import gate_helpers as h
from tilesmith.gate import timed
from tilesmith.gate.worker import patches, trees
from tilesmith.gate.worker import setup as worker_setup
from tilesmith.gate.worker.state import State
from tilesmith.gate.verdict import Reason

META = {"inputs": [{"parameter": True}, {}], "inductor_static_inputs": [0], "inputs_from_graphs": []}


def _ctx(modes: dict):
    both = modes.get("candidate") == "trees"
    return h.decision_context(modes=dict(modes), warnings=[Reason("trees", "both through the trees")] if both else [],
                              solo_in_mode_ns=123)


def _send(replies: dict):
    """A send(worker, roles, mode) that records each request and answers from `replies` {(worker, mode): reply}."""
    sent = []

    def send(worker, roles, mode):
        sent.append((worker, roles, mode))
        return replies.get((worker, mode), {})
    return send, sent


REF = SimpleNamespace(timer="T", base_role="original")


def test_both_roles_through_the_trees_are_set_up_once_each_worker():
    ctx = _ctx({"candidate": "trees", "baseline": "trees"})
    send, sent = _send({})
    timed.set_up(ctx, REF, "W", "graph", send)
    assert sent == [("T", ["original"], "trees"), ("W", ["candidate", "baseline"], "trees")]
    assert ctx.modes == {"candidate": "trees", "baseline": "trees"} and [w.code for w in ctx.warnings] == ["trees"]


def test_a_candidate_that_fails_through_the_trees_where_the_original_did_not_is_rejected_not_timed_otherwise():
    ctx = _ctx({"candidate": "trees", "baseline": "trees"})
    send, sent = _send({("W", "trees"): {"trees_fallback": {"candidate": "RuntimeError: capture failed"}}})
    with pytest.raises(timed.CandidateTreesFailed, match="capture failed"):
        timed.set_up(ctx, REF, "W", "graph", send)
    assert len(sent) == 2 and ctx.modes["candidate"] == "trees"  # nothing set up again in another mode
    assert timed._trees_failed(timed.CandidateTreesFailed("x")).code == "trees-failed"


@pytest.mark.parametrize("failing", [("T", "original"), ("W", "baseline")])
def test_where_the_originals_trees_fail_every_role_is_set_up_again_as_bare_replays(failing):
    """Never the candidate through the trees against a bare replay of the original, or the reverse; the
    confirmation pass then starts in graph mode and sizes its samples anew."""
    worker_name, role = failing
    ctx = _ctx({"candidate": "trees", "baseline": "trees"})
    send, sent = _send({(worker_name, "trees"): {"trees_fallback": {role: "TypeError: no trees here"}}})
    timed.set_up(ctx, REF, "W", "graph", send)
    assert sent[2:] == [("T", ["original"], "graph"), ("W", ["candidate"], "graph"), ("W", ["baseline"], "graph")]
    assert ctx.modes == {} and ctx.solo_in_mode_ns is None
    assert [w.code for w in ctx.warnings] == ["trees-unavailable"]
    assert "original and the candidate" in ctx.warnings[0].message and "no trees here" in ctx.warnings[0].message


def test_against_a_candidate_that_replays_itself_a_bare_replay_of_the_original_is_kept_with_a_warning():
    ctx = _ctx({"candidate": "launch", "baseline": "trees"})
    send, sent = _send({("T", "trees"): {"trees_fallback": {"original": "TypeError: no trees here"}}})
    timed.set_up(ctx, REF, "W", "graph", send)
    assert sent == [("T", ["original"], "trees"), ("W", ["candidate"], "launch"), ("W", ["baseline"], "trees")]
    assert ctx.modes == {"candidate": "launch", "baseline": "trees"}
    assert [w.code for w in ctx.warnings] == ["trees-unavailable"] and "original was timed" in ctx.warnings[0].message


@pytest.fixture
def fake_trees(monkeypatch, tmp_path):
    """A worker State on CPU whose trees and CUDA graphs are stand-ins that record how they were asked for."""
    log = {"thunks": [], "resets": 0, "captured": []}

    def tree_thunks(fn, bufsets, device, mutated, static=None, *, reset=True):
        if log.get("fail") in ("all", fn.role):
            raise RuntimeError(f"trees failed for {fn.role}")
        log["thunks"].append((fn.role, static, reset, len(bufsets)))
        return [lambda: None] * len(bufsets), object()

    def reset_trees():
        log["resets"] += 1

    def capture_graph(st, role, fn, bufs):
        log["captured"].append(role)
        return lambda: None

    monkeypatch.setattr(trees, "tree_thunks", tree_thunks)
    monkeypatch.setattr(trees, "reset_trees", reset_trees)
    monkeypatch.setattr(worker_setup, "_capture_graph", capture_graph)
    st = State()
    st.data = SimpleNamespace(meta=dict(META))
    class Call:  # a wrapper's call(args) that says which role it is
        def __init__(self, role):
            self.role = role

        def __call__(self, args):
            return (args[0] + args[1],)

    st.fns = {r: Call(r) for r in ("candidate", "baseline")}
    sets = tmp_path / "sets.pt"
    torch.save({"inputs": [[torch.ones(2), torch.zeros(2)], [torch.ones(2), torch.ones(2)]]}, sets)

    def setup(roles, mode, buffers=2):
        return worker_setup.op_time_setup(st, {"sets_file": str(sets), "roles": roles, "mode": mode, "buffers": buffers})
    return st, log, setup


def test_the_worker_frees_the_trees_only_when_no_other_role_runs_through_them(fake_trees):
    st, log, setup = fake_trees
    assert "trees_fallback" not in setup(["candidate", "baseline"], "trees")
    assert log["thunks"] == [("candidate", [0], False, 2), ("baseline", [0], False, 2)] and log["resets"] == 0
    assert st.trees_roles == {"candidate", "baseline"} and st.trees_live
    assert st.bufs["candidate"][1][0] is st.bufs["candidate"][0][0]  # the static input at one address
    assert st.bufs["candidate"][1][1] is not st.bufs["candidate"][0][1]  # the other input rotates
    setup(["candidate", "baseline"], "trees", buffers=3)  # set up again (more buffer sets): the old trees go first
    assert log["resets"] == 1 and len(log["thunks"]) == 4
    setup(["candidate"], "launch")  # the baseline still runs through the trees: nothing is freed under it
    assert log["resets"] == 1 and st.trees_roles == {"baseline"}
    setup(["baseline"], "graph")  # no role runs through them any more: freed
    assert log["resets"] == 2 and st.trees_roles == set() and not st.trees_live
    setup(["baseline"], "graph")
    assert log["resets"] == 2  # nothing left to free


def test_a_candidate_is_never_run_through_the_trees_with_every_input_static(fake_trees):
    st, log, setup = fake_trees
    st.data.meta = {k: v for k, v in META.items() if k != "inductor_static_inputs"}
    rep = setup(["candidate", "baseline"], "trees")
    assert set(rep["trees_fallback"]) == {"candidate"} and "static marks" in rep["trees_fallback"]["candidate"]
    assert [t[0] for t in log["thunks"]] == ["baseline"] and log["thunks"][0][1] is None  # the original: every input static
    assert log["captured"] == ["candidate", "candidate"]  # one bare graph per buffer set
    assert st.trees_roles == {"baseline"}


def test_trees_failures_are_reported_per_role(fake_trees):
    st, log, setup = fake_trees
    log["fail"] = "baseline"
    rep = setup(["candidate", "baseline"], "trees")
    assert set(rep["trees_fallback"]) == {"baseline"} and "failed for baseline" in rep["trees_fallback"]["baseline"]
    assert st.trees_roles == {"candidate"} and st.trees_live
    log["fail"] = "all"
    rep = setup(["candidate", "baseline"], "trees")
    assert set(rep["trees_fallback"]) == {"candidate", "baseline"} and log["resets"] == 1


def test_candidate_code_that_changes_the_cudagraph_trees_is_named_by_the_patch_watch():
    import torch._inductor.cudagraph_trees as ct

    before = patches.snapshot()
    saved = ct.CUDAGraphNode.check_invariants
    ct.CUDAGraphNode.check_invariants = lambda self, inputs: (True, None)
    try:
        names = patches.replaced(before)
    finally:
        ct.CUDAGraphNode.check_invariants = saved
    assert any("CUDAGraphNode" in n and "check_invariants" in n for n in names), names
    assert patches.replaced(before) == []
