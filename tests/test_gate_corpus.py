"""The gate's honest corpus on the CPU (tests/corpus.py): real graphs of real models (transformers' GPT-2 and a
Llama-style decoder, GPT-2's training forward and backward, the inference example), judged with the screen and
every dynamic defence on. Each original against itself is "not faster", never a load, process-state or protocol
failure; each original against a slowed copy of itself is accepted; and so are candidates that do what library code
does on its first call (a typing.NamedTuple made, a module imported lazily). The false-rejection rate is 0."""

from __future__ import annotations

import pytest

from tests import corpus
from tests.conftest import captured_workspace

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")



@pytest.fixture(autouse=True)
def one_thread_per_worker(monkeypatch):
    """Each gate worker on one thread, pinned to one CPU (as the gate's other CPU tests): with torch's default of
    a thread per CPU, on 2 CPUs shared with the other test process, OpenMP's threads wait on each other for whole
    scheduler slices, and CI saw the original run 18x slower per call than alone (unstable-timing), twice."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


ENTRIES = {name: corpus.entry(name, "cpu") for name in ("gpt2", "llama", "gpt2-train")}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, inductor_cache):
    """The corpus's captures, shared with the other test files of this process (the allowlist's corpus)."""
    return {name: corpus.eligible(captured_workspace(tmp_path_factory, name, e.script, *e.args))
            for name, e in ENTRIES.items()}


@pytest.fixture(scope="module")
def inference_graph(inference_ws):
    (g,) = sorted((inference_ws / "graphs").iterdir())
    return g


def test_corpus_originals_of_real_models_are_judged_not_faster_than_themselves(graphs, tmp_path):
    problems = []
    for name, gs in graphs.items():
        for g in gs:
            _, problem = corpus.judged(g, (g / "wrapper.py").read_text(), tmp_path / g.name[:12], "aa")
            if problem:
                problems.append(f"{name} {g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("name", ["gpt2", "llama", "gpt2-train"])
def test_corpus_original_of_a_real_model_against_a_slowed_copy_is_accepted(graphs, name, tmp_path):
    g = graphs[name][0]
    slow = corpus.slowed_copy(g, tmp_path / "slow")
    v, problem = corpus.judged(slow, (g / "wrapper.py").read_text(), tmp_path / "cand", "win")
    assert not problem, problem
    assert v.first.timing.speedup_low > 1.02


@pytest.mark.parametrize("maker", [corpus.makes_a_namedtuple_at_first_call, corpus.imports_a_module_lazily],
                         ids=["namedtuple", "lazy-import"])
def test_corpus_library_habits_at_a_first_call_are_not_rejected(inference_graph, maker, tmp_path):
    g = inference_graph
    slow = corpus.slowed_copy(g, tmp_path / "slow")
    v, problem = corpus.judged(slow, maker((g / "wrapper.py").read_text()), tmp_path / "cand", "win")
    assert not problem, problem
