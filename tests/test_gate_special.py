"""Inputs beyond the recorded range (issue 35, item 3): the gate's special-value sets (NaN, +-inf, extreme
magnitudes, subnormals, -0.0 in the float activations; gate/inputs.py special_sets), the comparison that requires
NaN/inf where the original has them ("nonfinite-mismatch"), the user's escape hatch
(--allow-nonfinite-differences), and the red team of this class (tests/redteam_special.py), judged on real
captures with the screen on and off."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from tests import gate_helpers as h
from tests import redteam_special as rs
from tests.conftest import FIXTURES, captured_workspace
from tilesmith.gate import Policy, judge, static
from tilesmith.gate.correctness import Special, compare_set, compare_special
from tilesmith.gate.inputs import SPECIAL_KINDS, special_sets

_SCREEN = static.screen  # bound at import, before a fixture switches it off


def _meta(*inputs: dict) -> dict:
    return {"inputs": [{"kind": "tensor", **d} for d in inputs]}


def _subnormal(t: torch.Tensor) -> torch.Tensor:
    return (t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)


def test_special_sets_change_float_activations_only_and_keep_weights_as_captured_and_indices_in_range():
    idx = torch.randint(3, 9, (64,))
    x = torch.randn(64, 128)
    w = torch.randn(128, 16)
    mask = torch.rand(64) > 0.5
    eps = torch.tensor(1e-5)
    zeros = torch.zeros(64, 128)  # an all-zero mask: configuration, not data
    meta = _meta({"dtype": "int64", "range": {"min": 3, "max": 8}}, {"dtype": "float32", "range": {"min": -4.0, "max": 4.0,
                 "mean": 0.0, "std": 1.0}}, {"dtype": "float32", "parameter": True}, {"dtype": "bool"},
                 {"dtype": "float32"}, {"dtype": "float32", "range": {"min": 0.0, "max": 0.0, "mean": 0.0, "std": 0.0}},
                 {"kind": "int"})
    sets = dict(special_sets(meta, [idx, x, w, mask, eps, zeros, 7], seed=0))
    assert list(sets) == list(SPECIAL_KINDS)
    for name, (i, a, weight, m, e, z, n) in sets.items():
        assert 3 <= int(i.min()) and int(i.max()) <= 8, name
        assert torch.equal(weight, w) and m.dtype == torch.bool and n == 7
        assert bool(torch.isfinite(e)) and bool(torch.isfinite(z).all()) and not bool(_subnormal(z).any()), name
    a = sets["nonfinite"][1]
    counts = [int(a.isnan().sum()), int((a == math.inf).sum()), int((a == -math.inf).sum())]
    assert all(c >= 8 for c in counts) and sum(counts) <= 8192 // 256, counts  # 1/256 of the elements
    a = sets["extremes"][1]
    assert bool(torch.isfinite(a).all())
    assert int(_subnormal(a).sum()) >= 30 and int(((a == 0) & a.signbit()).sum()) >= 30
    assert float(a.abs().max()) > 1e16 and int((a.abs() > 1e5).sum()) >= 15  # far beyond the recorded [-4, 4]
    assert special_sets(_meta({"dtype": "int64"}, {"dtype": "float32", "parameter": True}), [idx, w], 0) == []


@pytest.mark.parametrize("dtype,top", [(torch.float16, 65504.0), (torch.bfloat16, 2.0**59), (torch.float64, 2.0**507)])
def test_extreme_values_span_each_dtypes_own_exponents_without_rounding_to_inf(dtype, top):
    """Up to the dtype's largest value (float16, computed in float32) or the square root of what its arithmetic holds
    (a product of two then cannot overflow in one order of a sum and not in another)."""
    x = torch.randn(64, 128, dtype=dtype)
    (_, (a,)), = [s for s in special_sets(_meta({"dtype": str(dtype)[6:]}), [x], seed=1) if s[0] == "extremes"]
    assert a.dtype == dtype and bool(torch.isfinite(a).all())
    assert top / 16 < float(a.abs().max()) <= top and int(_subnormal(a).sum()) >= 30
    if dtype == torch.float64:
        assert float(a[a != 0].abs().min()) < 1e-300  # float64's subnormals, not float32's


def _compared(c, o, ref=None, allow=False, scale=1.0):
    out = {"outputs": [o], "layouts": [{}], "inputs_after": []}
    return compare_set("nonfinite", {"outputs": [c], "layouts": [{}], "inputs_after": []}, out,
                       None if ref is None else [ref], Special([scale], allow))


def test_a_position_drawn_twice_gets_its_later_value_on_any_thread_count():
    """The special values go in through positions drawn at random, a few hundred of them drawn twice in a 256x1024
    activation: each gets the value of its later draw, as one thread assigns them, on two threads too. (Through
    torch's parallel indexing either value landed there, 2 in 10 times on two threads under load: a seed's sets then
    differed between decisions, and an original's outputs kept from an earlier decision were compared with a
    candidate's run on other inputs.) The same values as before on one thread."""
    from tilesmith.gate import inputs

    n, seed = 256 * 1024, 3
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, n, (n // 32,), generator=g)
    vals = inputs._extremes(n // 32, torch.float32, g).float()
    assert pos.unique().numel() < n // 32  # some positions come twice
    want = torch.zeros(n)
    for p_, v in zip(pos.tolist(), vals.tolist()):  # one after the other: the later draw stays
        want[p_] = v
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for _ in range(10 if t > 1 else 1):
                got = torch.zeros(n)
                inputs._inject(got, "extremes", torch.Generator().manual_seed(seed))
                assert torch.equal(got, want), (t, int((got != want).sum()))
    finally:
        torch.set_num_threads(threads)


def test_nan_or_inf_placed_unlike_the_original_is_its_own_reason_that_says_where_and_how_many():
    o = torch.ones(4, 8)
    o[1, 2], o[2, 5], o[3, 0] = math.nan, math.inf, -math.inf
    c = o.clone()
    c[1, 2] = 0.0  # zeroed where the original has NaN
    c[3, 0] = math.inf  # the sign of an infinity flipped
    r = _compared(c, o)
    assert [x.code for x in r.reasons] == ["nonfinite-mismatch"] and r.summary.nonfinite_mismatches == 2
    msg = r.reasons[0].message
    assert "2 of 32 elements" in msg and "index (1, 2)" in msg and "original nan" in msg, msg
    assert "the original has 1 NaN, 1 +inf, 1 -inf, the candidate 0 NaN, 2 +inf, 0 -inf" in msg, msg
    assert _compared(o.clone(), o).reasons == []


def test_allowing_nonfinite_differences_passes_their_placement_with_a_warning_and_still_compares_finite_values():
    o = torch.ones(4, 8)
    o[1, 2] = math.nan
    c = o.clone()
    c[1, 2] = 0.0
    r = _compared(c, o, allow=True)
    assert r.reasons == [] and [w.code for w in r.warnings] == ["nonfinite-differences-allowed"]
    c[0, 0] = 1.5
    assert [x.code for x in _compared(c, o, allow=True).reasons] == ["wrong-values"]


def test_a_sum_in_another_order_at_extreme_magnitudes_is_not_a_difference_with_or_without_the_float64_reference():
    """Honest code: the same matmul summed in two other orders, on activations holding values up to 1e38."""
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(64, 512, generator=g)
        (_, (x,)), = [s for s in special_sets(_meta({"dtype": "float32"}), [x], seed) if s[0] == "extremes"]
        w = torch.randn(512, 64, generator=g) / 20
        o, ref = x @ w, x.double() @ w.double()
        scale = float((torch.randn(64, 512, generator=g) @ w).abs().max())
        for c in ((x.unsqueeze(2) * w).sum(1), (x.unsqueeze(2) * w).flip(1).sum(1)):
            assert compare_special(c, o, ref, scale).ok and compare_special(c, o, None, scale).ok, seed
        assert not compare_special(x.half().float() @ w, o, ref, scale).ok  # rounded to half: not honest


def test_a_matmul_of_two_activations_summed_in_another_order_places_nan_and_inf_as_the_original():
    """Both operands hold special values (attention, a backward's weight gradient): a bf16 matmul accumulated in
    fp32 in three other orders. Extreme magnitudes up to 3.4e38 made this fail on every seed (a sum's overflow
    depended on its order); up to 2**59 no product of two comes near overflow."""
    meta = _meta({"dtype": "bfloat16"}, {"dtype": "bfloat16"})
    x, w = torch.randn(256, 1024).bfloat16(), (torch.randn(1024, 256) / 32).bfloat16()
    for seed in range(6):
        for name, (a, b) in special_sets(meta, [x, w], seed):
            o = torch.relu(a @ b)
            for c in (torch.relu((a.float() @ b.float()).bfloat16()),
                      torch.relu((a.float().flip(1) @ b.float().flip(0)).bfloat16()),
                      torch.relu((a[:, :512].float() @ b[:512].float() + a[:, 512:].float() @ b[512:].float()).bfloat16())):
                v = compare_special(c, o, None, 10.0)
                assert v.ok, (seed, name, v.where)


def test_one_huge_output_element_does_not_excuse_an_error_elsewhere_in_the_output():
    o = torch.ones(4, 8)
    o[0, 0] = 1e30
    c = o.clone()
    c[2, 3] = 0.0  # another row: judged at that row's magnitude, not at 1e30's
    v = compare_special(c, o, None, 1.0)
    assert not v.ok and "index (2, 3)" in v.where
    c = o.clone()
    c[0, 3] = 1.5  # its own row: within the rounding of a row that holds 1e30
    assert compare_special(c, o, None, 1.0).ok


# -- the red team, on real captures ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inf_graph(inference_ws):
    return h.graph_of(inference_ws)


@pytest.fixture(scope="module")
def log_graph(tmp_path_factory, inductor_cache):
    return h.graph_of(captured_workspace(tmp_path_factory, "ws-log-ratio", FIXTURES / "log_ratio.py"))


# (maker, graph fixture, reasons, the sets that fail): no ordinary set holds a value that shows any of them.
CHEATS = [
    (rs.zeros_where_an_input_is_nonfinite, "inf_graph", ["nonfinite-mismatch"], ["nonfinite"]),
    # Infinities are large too: it zeroes them (non-finite placement) and the 1e5..1e38 (finite values).
    (rs.zeros_where_an_input_is_large, "inf_graph", ["nonfinite-mismatch", "wrong-values"], ["nonfinite", "extremes"]),
    (rs.clamps_large_magnitudes, "inf_graph", ["nonfinite-mismatch", "wrong-values"], ["nonfinite", "extremes"]),
    (rs.flushes_subnormal_inputs, "log_graph", ["nonfinite-mismatch"], ["extremes"]),  # log(0) = -inf
    (rs.flushes_negative_zero, "log_graph", ["nonfinite-mismatch"], ["extremes"]),  # x / +0.0 for x / -0.0
    (rs.zeros_its_nan_outputs, "inf_graph", ["nonfinite-mismatch"], ["nonfinite"]),
]
IDS = [m.__name__ for m, *_ in CHEATS]


def _judge_cheat(request, tmp_path, maker, graph):
    g = request.getfixturevalue(graph)
    text = maker((g / "wrapper.py").read_text())
    assert _SCREEN(text) == []  # nothing for the static screen to see
    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    return judge(g, cand, Policy(seed=0, time_budget_s=2.0, confirm=False))


@pytest.mark.parametrize("maker,graph,codes,failed", CHEATS, ids=IDS)
def test_gate_rejects_a_candidate_that_is_wrong_only_beyond_the_recorded_range(request, tmp_path, maker, graph, codes,
                                                                                failed):
    v = _judge_cheat(request, tmp_path, maker, graph)
    assert not v.accepted and v.stage == "correctness" and v.codes == codes, v.reasons
    assert [c.name for c in v.first.correctness if not c.ok] == failed


@pytest.fixture
def screen_off(monkeypatch):
    monkeypatch.setattr(static, "screen", lambda text: [])  # judge() looks it up at each call


@pytest.mark.parametrize("maker,graph,codes,failed", CHEATS, ids=IDS)
def test_the_special_sets_reject_those_cheats_with_the_static_screen_off(request, tmp_path, screen_off, maker, graph,
                                                                         codes, failed):
    v = _judge_cheat(request, tmp_path, maker, graph)
    assert not v.accepted and v.stage == "correctness" and v.codes == codes, v.reasons


@pytest.fixture(scope="module")
def float_index_graph(tmp_path_factory, inductor_cache):
    return h.graph_of(captured_workspace(tmp_path_factory, "ws-float-index", FIXTURES / "float_index.py"))


def test_a_special_set_the_original_itself_fails_on_is_left_out_with_a_warning_not_a_failed_decision(
        float_index_graph, tmp_path):
    """NaN survives the clamp and indexes out of bounds: Inductor's own bounds check ends the original's process.
    The decision goes on without that set (the extreme finite values index in bounds and are compared)."""
    g = float_index_graph
    v = h.settled(lambda: judge(g, g / "wrapper.py", Policy(seed=0, time_budget_s=2.0, confirm=False)))
    assert v.stage == "timing" and v.codes in (["not-faster"], h.TOO_BUSY), v.reasons
    assert [w.code for w in v.warnings if w.code.startswith("special")] == ["special-sets-skipped"]
    assert "set nonfinite" in next(w.message for w in v.warnings if w.code == "special-sets-skipped")
    names = [c.name for c in v.first.correctness]
    assert "extremes" in names and "nonfinite" not in names


def test_validate_allow_nonfinite_differences_lets_the_placement_differ_and_records_it(log_graph, tmp_path):
    from tilesmith_cli.app import app

    cand = tmp_path / "candidate.py"
    cand.write_text(rs.flushes_negative_zero((log_graph / "wrapper.py").read_text()))
    r = CliRunner().invoke(app, ["validate", str(log_graph), str(cand), "--json", "--allow-nonfinite-differences"])
    v = json.loads(r.stdout)
    assert r.exit_code == 1 and v["stage"] in ("timing", "confirmation"), r.stdout  # judged on: no faster, though
    assert [x["code"] for x in v["reasons"]] == ["not-faster"] and v["allow_nonfinite_differences"] is True
    warned = [w["message"] for w in v["warnings"] if w["code"] == "nonfinite-differences-allowed"]
    assert warned and warned[0].startswith("set extremes: output 0 places NaN/inf unlike the original at"), warned
    assert any(c["name"] == "extremes" and c["nonfinite_mismatches"] > 0 for c in v["first"]["correctness"])


def test_a_win_accepted_with_allow_nonfinite_differences_says_so_in_the_report(slow_matmul_graph, tmp_path, monkeypatch):
    """The honest extern-mm win for slow_matmul.py, with NaN outputs made 0 (rejected by default, as above): accepted
    with the option, and the report says the win used it."""
    from tilesmith.report import build_report
    from tilesmith.submit import submit

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cand = tmp_path / "candidate.py"
    cand.write_text(rs.zeros_its_nan_outputs(h.mm_instead_of_loops((slow_matmul_graph / "wrapper.py").read_text())))
    res = submit(slow_matmul_graph, cand, Policy(time_budget_s=6.0, allow_nonfinite_differences=True))
    v = res.verdict
    assert v["accepted"] and v["allow_nonfinite_differences"], v["reasons"]
    assert "nonfinite-differences-allowed" in [w["code"] for w in v["warnings"]]
    (g,) = [g for g in build_report(res.run_id).graphs if g.key == res.key]
    assert any(n.startswith("accepted with --allow-nonfinite-differences: the win places NaN/inf unlike the original")
               for n in g.notes), g.notes


def test_optimize_takes_allow_nonfinite_differences_to_the_gates_policy(tmp_path):
    from tilesmith.optimize import OptimizeSettings, _policy
    from tilesmith_cli.app import app

    assert _policy(OptimizeSettings(allow_nonfinite_differences=True).resolved(), 0, None).allow_nonfinite_differences
    assert not _policy(OptimizeSettings().resolved(), 0, None).allow_nonfinite_differences
    r = CliRunner().invoke(app, ["optimize", "--allow-nonfinite-differences", "-w", str(tmp_path / "none"), "--json"])
    assert r.exit_code == 1 and "workspace" in r.stdout + r.stderr  # parsed; no workspace there
