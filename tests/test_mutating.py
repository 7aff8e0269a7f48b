"""Graphs that update their inputs in place, from a training loop as users write it (tests/fixtures/train_step.py:
BatchNorm's running statistics in the forward, SGD with momentum compiled as its own step): captured as eligible,
their originals judged honestly (not faster than themselves, accepted against a slowed copy), the cheats of this
kind rejected for their own reasons (tests/redteam_updates.py), and the program run with artifacts for every graph
giving the same losses, statistics and weights as without them."""

from __future__ import annotations

import json
import re

import pytest

from tests import corpus, redteam_updates as cheats
from tests.conftest import FIXTURES, captured_workspace
from tests.test_runtime import install_direct, marker_artifact, number, run, stats_of, warnings_in

pytestmark = pytest.mark.slow
TRAIN = FIXTURES / "train_step.py"


@pytest.fixture(autouse=True)
def one_thread_per_worker(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as tests/test_gate_corpus.py: no OpenMP team on a shared 2-CPU box


@pytest.fixture(scope="module")
def ws(tmp_path_factory, inductor_cache):
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TILESMITH_IN_PLACE", raising=False)  # on by default (tilesmith/settings.py: IN_PLACE_DEFAULT)
        # One thread, as the tests' programs run (the autouse fixture): Inductor writes the thread count into CPU
        # kernels, so a capture with the machine's count has other graph keys than the program run with one.
        m.setenv("OMP_NUM_THREADS", "1")
        return captured_workspace(tmp_path_factory, "ws-train-step", TRAIN, "--optimizer", "sgd")


def _graphs(ws) -> dict:
    """graph.json by role: forward, backward, the first step (it makes the momentum buffers), the later step."""
    metas = [json.loads((g / "graph.json").read_text()) for g in sorted((ws / "graphs").iterdir())]
    steps = sorted((m for m in metas if m["kind"] == "inference"), key=lambda m: len(m["mutated_inputs"]))
    by = {m["kind"]: m for m in metas if m["kind"] != "inference"}
    return {**by, "first-step": steps[0], "step": steps[1]}


def _dir(ws, meta):
    return ws / "graphs" / meta["key"]


def test_graphs_that_update_inputs_in_place_are_eligible_and_say_which_inputs(ws):
    g = _graphs(ws)
    assert all(m["eligible"] for m in g.values()), {k: m["reason"] for k, m in g.items()}
    # BatchNorm: its batch counter, running mean and running variance, all module buffers
    fw = g["forward"]
    assert len(fw["mutated_inputs"]) == 3 and g["backward"]["mutated_inputs"] == []
    assert all(fw["inputs"][i]["parameter"] and fw["inputs"][i]["updated_in_place"] for i in fw["mutated_inputs"])
    # SGD with momentum: 6 parameters and their 6 momentum buffers; the gradients are read only
    step = g["step"]
    assert len(step["mutated_inputs"]) == 12 and len(step["inputs"]) == 18 and step["outputs"] == []
    assert sum(bool(d.get("updated_in_place")) for d in step["inputs"]) == 12


@pytest.mark.parametrize("role", ["forward", "first-step", "step"])
def test_an_updating_original_is_not_faster_than_itself_and_wins_against_a_slowed_copy(ws, role, tmp_path):
    g = _dir(ws, _graphs(ws)[role])
    text = (g / "wrapper.py").read_text()
    _, problem = corpus.judged(g, text, tmp_path / "aa", "aa")
    assert not problem, problem
    slow = corpus.slowed_copy(g, tmp_path / "slow")
    v, problem = corpus.judged(slow, text, tmp_path / "win", "win")
    assert not problem, problem


@pytest.mark.parametrize("role,maker,code", [
    ("step", cheats.stops_updating_after_n_calls, "wrong-values-in-timing"),
    ("forward", cheats.updates_copies_instead, "input-mutated"),
    ("step", cheats.updates_copies_instead, "input-mutated"),
    ("forward", cheats.updates_twice, "input-mutated"),
], ids=["step-stops-updating", "forward-skips-statistics", "step-skips-update", "forward-updates-twice"])
def test_a_candidate_that_skips_or_repeats_an_update_is_rejected_for_it(ws, role, maker, code, tmp_path):
    from tilesmith.gate import static

    g = _dir(ws, _graphs(ws)[role])
    cheat = maker((g / "wrapper.py").read_text())
    assert static.screen(cheat) == [] and static.allowlist(cheat) == []  # only the gate's dynamic checks can see it
    v, _ = corpus.judged(g, cheat, tmp_path, "cheat")
    assert not v.accepted and code in v.codes, (v.stage, v.reasons)
    if code == "wrong-values-in-timing":  # the reason names the value that differed, and by how much
        (msg,) = [r.message for r in v.reasons if r.code == code]
        assert re.search(r"\(value \d+ of \d+, \(.*\) \w+: values, worst difference \S+\)$", msg), msg


def test_the_training_loop_with_artifacts_for_every_graph_ends_with_the_same_losses_and_state(ws, tmp_path):
    """Every graph's artifact (Inductor's wrapper plus a marker) substituted and verified on its first calls: the
    loss, the running statistics and the weights after 6 steps are those of the run without tilesmith."""
    metas = _graphs(ws)
    for m in metas.values():
        install_direct(ws, m["key"], marker_artifact((_dir(ws, m) / "wrapper.py").read_text(), m["key"]))
    cache = tmp_path / "cache"
    p = run(TRAIN, "--steps", "6", cache=cache, env={"TILESMITH_VERIFY": "3"})
    plain = run(TRAIN, "--steps", "6", cache=cache, runtime=False)
    assert p.returncode == 0 and plain.returncode == 0, p.stderr[-3000:] + plain.stderr[-3000:]
    s = stats_of(p)
    assert s["substituted"] == 4 and s["fallbacks"] == [] and warnings_in(p) == [], s
    assert all(not v["failed"] for v in s["verified"].values()), s["verified"]
    for label in ("loss", "running_mean", "weight"):
        assert number(p, label) == number(plain, label), label


def test_with_the_setting_off_capture_leaves_them_to_inductor_and_says_how_to_opt_in(tmp_path, monkeypatch):
    from tests.conftest import run_capture_subprocess

    monkeypatch.setenv("TILESMITH_IN_PLACE", "0")
    p = run_capture_subprocess(TRAIN, tmp_path / "ws", "--steps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    metas = [json.loads((g / "graph.json").read_text()) for g in sorted((tmp_path / "ws" / "graphs").iterdir())]
    left = [m for m in metas if not m["eligible"]]
    assert len(left) == 3 and all("unset TILESMITH_IN_PLACE (or set it to 1)" in m["reason"] for m in left), [m["reason"] for m in metas]
    assert [m["kind"] for m in metas if m["eligible"]] == ["backward"]


@pytest.fixture(scope="module")
def decode_ws(tmp_path_factory, inductor_cache):
    with pytest.MonkeyPatch.context() as m:
        m.delenv("TILESMITH_IN_PLACE", raising=False)
        m.setenv("OMP_NUM_THREADS", "1")
        return captured_workspace(tmp_path_factory, "ws-decode-step", FIXTURES / "decode_step.py", "--tokens", "3")


def _decode_graph(decode_ws):
    metas = [json.loads((g / "graph.json").read_text()) for g in sorted((decode_ws / "graphs").iterdir())]
    (m,) = [m for m in metas if m["mutated_inputs"]]  # the compiled step: it writes the cache at its position
    return decode_ws / "graphs" / m["key"], m


def test_a_decode_step_that_writes_a_static_kv_cache_is_judged_honestly_and_a_skipped_write_is_rejected(decode_ws,
                                                                                                        tmp_path):
    """Hugging Face's StaticCache through torch.compile, one token per step (tests/fixtures/decode_step.py): the
    step's graph writes 2 layers' keys and values in place (and what else the cache keeps); its original is not faster than itself, wins against a
    slowed copy, and a candidate that writes copies of the cache instead is rejected."""
    g, meta = _decode_graph(decode_ws)
    # keys and values of 2 layers at least (this transformers' StaticCache updates 6 of the step's inputs)
    assert meta["eligible"] and len(meta["mutated_inputs"]) >= 4, (meta["reason"], meta["mutated_inputs"])
    text = (g / "wrapper.py").read_text()
    _, problem = corpus.judged(g, text, tmp_path / "aa", "aa")
    assert not problem, problem
    v, problem = corpus.judged(corpus.slowed_copy(g, tmp_path / "slow"), text, tmp_path / "win", "win")
    assert not problem, problem
    v, _ = corpus.judged(g, cheats.updates_copies_instead(text), tmp_path / "cheat", "cheat")
    assert not v.accepted and "input-mutated" in v.codes, (v.stage, v.reasons)


def test_a_tuners_screen_and_the_profile_call_a_decode_step_from_its_captured_state_every_time(decode_ws):
    """The tuner's screen calls each variant hundreds of times on one set of buffers: each call advanced the cache's
    position, until one ran past the cache's end (an index out of bounds: the screen lost every variant). Each
    timed call now starts from the captured state (capture/loading.state_reset), as the gate's samples do."""
    from tilesmith.profile.baseline import profile_graph
    from tilesmith.search import measure

    g, _ = _decode_graph(decode_ws)
    text = (g / "wrapper.py").read_text()
    screens = measure.screen(g, [("a", text), ("b", text)], budget_s=2.0)
    # 64 cache positions, 4 taken by the prompt: 60 calls from one state would have run past the end
    assert all(not s.error and len(s.samples_ms) > 60 for s in screens), [(s.error, len(s.samples_ms)) for s in screens]
    assert profile_graph(g, text, calls=70).wall_ms > 0


def test_state_reset_puts_the_captured_values_back_into_the_updated_inputs(decode_ws):
    from tilesmith.capture import loading

    g, _ = _decode_graph(decode_ws)
    data = loading.load_graph_data(g)
    args = loading.clone_args(data.inputs)
    reset = loading.state_reset(data, args)
    assert reset is not None
    mutated = [int(i) for i in data.meta["mutated_inputs"]]
    assert mutated
    for i in mutated:
        args[i].fill_(7)  # what calls from one set of buffers leave there
    assert not all(args[i].equal(data.inputs[i]) for i in mutated)
    reset()
    assert all(args[i].equal(data.inputs[i]) for i in mutated)


def test_the_agents_kernel_bench_calls_a_decode_step_from_its_captured_state_every_time(decode_ws):
    """`python -m tilesmith.search.kernel_bench` calls the graph 3 + 2 x --calls times on one set of buffers: 64 cache
    positions, 4 taken by the prompt, so 40 calls each would run past the cache's end without the reset."""
    from tilesmith.search import kernel_bench

    g, _ = _decode_graph(decode_ws)
    b = kernel_bench.bench((g / "wrapper.py").read_text(), g, calls=40)
    assert b.calls == 40 and b.wall_ms > 0 and b.kernels and b.instrumented_ms > 0


def test_the_gate_never_takes_a_decode_steps_cache_further_than_the_program_did(decode_ws, tmp_path):
    """The gate's samples and warm-ups call a graph back to back; where a parameter it updates in place carries state
    from call to call (the cache's position counter), each run of calls from the captured state is capped at the
    program's own count (3 tokens here: inputs.state_horizon) and the state is put back before every untimed call
    (gate/worker/setup.restart). Asked for 60 ms samples (64 buffer sets, 128 warm-up calls: on the H100 the gate's
    GPU-sized samples ran the 64-token cache out of bounds, "device-side assert triggered", and rejected the honest
    original as `raised`), the original is still judged not faster than itself, in launch and graph timing alike."""
    from tilesmith.gate.inputs import state_horizon

    g, meta = _decode_graph(decode_ws)
    assert state_horizon(meta) == 3, meta.get("program_gap")
    text = (g / "wrapper.py").read_text()
    v, problem = corpus.judged(g, text, tmp_path / "aa", "aa", target_sample_ms=60.0, confirm=False)
    assert not problem, problem
    assert v.first.timing.calls_per_sample <= 3, v.first.timing


def test_state_horizon_is_the_programs_own_call_count_where_a_parameter_carries_state():
    from tilesmith.gate import sizing
    from tilesmith.gate.inputs import state_horizon
    from tilesmith.gate.verdict import Policy

    inputs = [{"parameter": True}, {"parameter": False}]
    assert state_horizon({"inputs": inputs, "mutated_inputs": [], "program_gap": {"calls": 3}}) is None
    assert state_horizon({"inputs": inputs, "mutated_inputs": [1], "program_gap": {"calls": 3}}) is None  # refilled each sample
    assert state_horizon({"inputs": inputs, "mutated_inputs": [0], "program_gap": {"calls": 3}}) == 3
    assert state_horizon({"inputs": inputs, "mutated_inputs": [0]}) == 1  # an older capture: one call from the state
    assert state_horizon({"inputs": inputs, "mutated_inputs": [0], "program_gap": {"calls": 3}, "device": "cuda:0"}) == 3
    sets = [("a", [])]
    assert sizing.sample_size(Policy(target_sample_ms=2.0), 1e4, sets, set()) == (64, 64)
    assert sizing.sample_size(Policy(target_sample_ms=2.0), 1e4, sets, set(), horizon=3) == (3, 4)


def test_a_decode_step_that_answers_from_memory_when_its_state_comes_back_is_rejected(decode_ws, tmp_path):
    """The decode step's samples start from its captured state; its token and position have one recorded value each,
    so only a fresh scaling of the state's floats before each sample (worker/sample._set_content) makes every
    sample's calls new. A candidate that remembers each call's outputs and resulting state by a probe of its inputs
    (tests/redteam_updates.remembers_the_step_by_its_state; its state kept where Inductor's Runner keeps its own,
    which the screen allows) must not be accepted."""
    g, meta = _decode_graph(decode_ws)
    text = cheats.remembers_the_step_by_its_state((g / "wrapper.py").read_text(), [int(i) for i in meta["mutated_inputs"]])
    v, _ = corpus.judged(g, text, tmp_path / "cheat", "cheat")
    assert not v.accepted and v.stage in ("timing", "confirmation"), (v.stage, v.codes, [r.message[:200] for r in v.reasons])
