"""The gate's honest corpus on CUDA (tests/corpus.py): GPU-sized graphs of real models (transformers' GPT-2 and a
Llama-style decoder in bf16, torchvision's ResNet-18, timm's ViT, the MoE example in default and reduce-overhead
mode, GPT-2's training forward and backward, and a training loop's graphs that update their inputs in place: a
BatchNorm forward and an SGD step compiled as its own graph), each original judged against itself (not faster, never a failure),
each default-mode graph's whole-call replay (the tuner's first move) and the original against a slowed copy
(genuine wins, accepted). Every model is captured at once, side by side, when the first test asks for one.

TILESMITH_CORPUS_KEEP=DIR captures into DIR/corpus and keeps the workspaces (tests/gpu/audit_probe.py reads them).
Runs under pytest-xdist (`-n 6`): the captures are shared, the decisions spread over the processes."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import corpus, redteam_updates  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ENTRIES = [corpus.entry("moe", "cuda", "reduce-overhead"), corpus.entry("moe", "cuda"), corpus.entry("gpt2", "cuda"),
           corpus.entry("llama", "cuda"), corpus.entry("resnet18", "cuda"), corpus.entry("vit", "cuda"),
           corpus.entry("gpt2-train", "cuda"), corpus.entry("step-sgd", "cuda")]


@pytest.fixture(scope="session")
def captured(tmp_path_factory, inductor_cache):
    """Every entry captured side by side, once for all test processes (pytest-xdist's share one folder: the first to
    take the lock captures, the others wait for it): entry name -> its eligible graphs, or the capture's failure."""
    import fcntl
    import pickle

    base = tmp_path_factory.getbasetemp()
    root = Path(os.environ.get("TILESMITH_CORPUS_KEEP") or (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base)) / "corpus"
    root.mkdir(parents=True, exist_ok=True)
    done = root / "captured.pkl"
    with open(root / "capture.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            def one(e):
                try:
                    return corpus.capture(e, root / e.name.replace("@", "-") / "ws")
                except AssertionError as err:
                    return str(err)

            with ThreadPoolExecutor(len(ENTRIES)) as pool:
                done.write_bytes(pickle.dumps(dict(zip((e.name for e in ENTRIES), pool.map(one, ENTRIES)))))
    return pickle.loads(done.read_bytes())


def _graphs(captured, name):
    got = captured[name]
    if isinstance(got, str):  # the capture failed: its message
        pytest.fail(got)
    return got


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_gpu_corpus_original_is_judged_not_faster_than_itself(captured, name, tmp_path):
    problems = []
    for g in _graphs(captured, name):
        v, problem = corpus.judged(g, (g / "wrapper.py").read_text(), tmp_path / g.name[:12], "aa")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("name", ["moe", "gpt2", "resnet18", "vit", "step-sgd"])
def test_gpu_corpus_whole_call_replay_of_a_default_mode_graph_is_accepted(captured, name, tmp_path):
    from tilesmith.search.graphed import graphed_text

    problems = []
    for g in _graphs(captured, name):
        if json.loads((g / "graph.json").read_text())["kernels"].get("triton") == 1 and name == "step-sgd":
            # The SGD step is one fused kernel: in the gate its gradients move between buffer sets, so its replay is a
            # copy of them and a graph launch against one kernel launch, no win to expect (0.966x on an H100). In the
            # program they stay in place and the replay is read whole: 1.22x there (the smoke's training flow).
            continue
        v, problem = corpus.judged(g, graphed_text((g / "wrapper.py").read_text()), tmp_path / g.name[:12], "replay")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("name", ["moe@reduce-overhead", "llama", "gpt2-train", "step-sgd"])
def test_gpu_corpus_original_against_a_slowed_copy_is_accepted(captured, name, tmp_path):
    problems = []
    for g in _graphs(captured, name):
        slow = corpus.slowed_copy(g, tmp_path / "slow" / g.name[:12])
        v, problem = corpus.judged(slow, (g / "wrapper.py").read_text(), tmp_path / g.name[:12], "win")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("maker", [corpus.makes_a_namedtuple_at_first_call, corpus.imports_a_module_lazily],
                         ids=["namedtuple", "lazy-import"])
def test_gpu_corpus_library_habits_at_first_call_are_not_rejected(captured, maker, tmp_path):
    g = _graphs(captured, "moe")[0]
    slow = corpus.slowed_copy(g, tmp_path / "slow")
    v, problem = corpus.judged(slow, maker((g / "wrapper.py").read_text()), tmp_path / "cand", "win")
    assert not problem, problem


@pytest.mark.parametrize("maker,code", [(redteam_updates.stops_updating_after_n_calls, "wrong-values-in-timing"),
                                        (redteam_updates.updates_copies_instead, "input-mutated")],
                         ids=["stops-updating", "updates-copies"])
def test_gpu_an_optimizer_step_that_skips_its_update_is_rejected_for_it(captured, maker, code, tmp_path):
    """The SGD step (12 inputs updated in place, no outputs), cheated two ways: the gate names each."""
    (g,) = [g for g in _graphs(captured, "step-sgd")
            if len(json.loads((g / "graph.json").read_text())["mutated_inputs"]) == 12]
    v, _ = corpus.judged(g, maker((g / "wrapper.py").read_text()), tmp_path, "cheat")
    assert not v.accepted and code in v.codes, (v.stage, v.reasons)
