"""A graph whose only non-weight input cannot vary between the gate's samples (one token id, one recorded value:
tests/fixtures/lookup_step.py): the weights are scaled afresh before each sample (gate/inputs.py
rescaled_parameters), so a candidate that answers from memory by a probe of its inputs finds nothing it has seen.
Before, it read 5.8x on this graph (tests/redteam.py remembers_outputs_by_address_and_first_value)."""

from __future__ import annotations

import json

import pytest

from tests import corpus, redteam
from tests.conftest import FIXTURES, captured_workspace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lookup_graph(tmp_path_factory, inductor_cache):
    with pytest.MonkeyPatch.context() as m:
        m.setenv("OMP_NUM_THREADS", "1")
        ws = captured_workspace(tmp_path_factory, "ws-lookup-step", FIXTURES / "lookup_step.py")
    (g,) = [g for g in sorted((ws / "graphs").iterdir()) if json.loads((g / "graph.json").read_text())["eligible"]]
    return g


@pytest.fixture(autouse=True)
def one_thread_per_worker(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_a_lookup_whose_token_never_varies_has_its_weights_rescaled(lookup_graph):
    from tilesmith.gate.inputs import parameter_indices, rescaled_parameters

    meta = json.loads((lookup_graph / "graph.json").read_text())
    assert rescaled_parameters(meta) == parameter_indices(meta) != set()
    moved = {**meta, "inputs": [{**d, "range": {"min": 0, "max": 511}} if not d.get("parameter") else d
                                for d in meta["inputs"]]}
    assert rescaled_parameters(moved) == set()  # a token that varies: the weights stay as captured


def test_a_memo_keyed_on_a_probe_of_the_inputs_is_not_accepted_and_the_original_is_not_faster(lookup_graph, tmp_path):
    text = (lookup_graph / "wrapper.py").read_text()
    v, problem = corpus.judged(lookup_graph, text, tmp_path / "aa", "aa")
    assert not problem, problem
    v, _ = corpus.judged(lookup_graph, redteam.remembers_outputs_by_address_and_first_value(text), tmp_path / "cheat",
                         "cheat")
    assert not v.accepted, (v.stage, v.codes)
    assert v.first is None or v.first.timing is None or v.first.timing.speedup < 2.0, v.first.timing
