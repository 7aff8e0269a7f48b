"""The gate's honest corpus on CUDA (tests/corpus.py): GPU-sized graphs of real models (transformers' GPT-2 and a
Llama-style decoder in bf16, torchvision's ResNet-18, timm's ViT, the MoE example in default and reduce-overhead
mode, GPT-2's training forward and backward), each original judged against itself (not faster, never a failure),
each default-mode graph's whole-call replay (the tuner's first move) and the original against a slowed copy
(genuine wins, accepted). Every model is captured at once, side by side, when the first test asks for one.

TILESMITH_CORPUS_KEEP=DIR keeps the captured workspaces there (tests/gpu/audit_probe.py reads them)."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import corpus  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ENTRIES = [corpus.entry("moe", "cuda", "reduce-overhead"), corpus.entry("moe", "cuda"), corpus.entry("gpt2", "cuda"),
           corpus.entry("llama", "cuda"), corpus.entry("resnet18", "cuda"), corpus.entry("vit", "cuda"),
           corpus.entry("gpt2-train", "cuda")]


@pytest.fixture(scope="module")
def captured(tmp_path_factory, inductor_cache):
    """Every entry captured side by side: entry name -> its eligible graphs, or the capture's failure."""
    root = tmp_path_factory.mktemp("corpus")

    def one(e):
        try:
            return corpus.capture(e, root / e.name.replace("@", "-") / "ws")
        except AssertionError as err:
            return err

    with ThreadPoolExecutor(len(ENTRIES)) as pool:
        out = dict(zip((e.name for e in ENTRIES), pool.map(one, ENTRIES)))
    keep = os.environ.get("TILESMITH_CORPUS_KEEP")
    if keep:
        shutil.copytree(root, keep, dirs_exist_ok=True)
    return out


def _graphs(captured, name):
    got = captured[name]
    if isinstance(got, AssertionError):
        raise got
    return got


@pytest.mark.parametrize("name", [e.name for e in ENTRIES])
def test_gpu_corpus_original_is_judged_not_faster_than_itself(captured, name, tmp_path):
    problems = []
    for g in _graphs(captured, name):
        v, problem = corpus.judged(g, (g / "wrapper.py").read_text(), tmp_path / g.name[:12], "aa")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("name", ["moe", "gpt2", "resnet18", "vit"])
def test_gpu_corpus_whole_call_replay_of_a_default_mode_graph_is_accepted(captured, name, tmp_path):
    from tilesmith.search.tuner import graphed_text

    problems = []
    for g in _graphs(captured, name):
        v, problem = corpus.judged(g, graphed_text((g / "wrapper.py").read_text()), tmp_path / g.name[:12], "replay")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("name", ["moe@reduce-overhead", "llama", "gpt2-train"])
def test_gpu_corpus_original_against_a_slowed_copy_is_accepted(captured, name, tmp_path):
    problems = []
    for g in _graphs(captured, name):
        slow = corpus.slowed_copy(g, tmp_path / "slow" / g.name[:12], reps=60)
        v, problem = corpus.judged(slow, (g / "wrapper.py").read_text(), tmp_path / g.name[:12], "win")
        if problem:
            problems.append(f"{g.name[:12]}: {problem}")
    assert not problems, problems


@pytest.mark.parametrize("maker", [corpus.makes_a_namedtuple_at_first_call, corpus.imports_a_module_lazily],
                         ids=["namedtuple", "lazy-import"])
def test_gpu_corpus_library_habits_at_first_call_are_not_rejected(captured, maker, tmp_path):
    g = _graphs(captured, "moe")[0]
    slow = corpus.slowed_copy(g, tmp_path / "slow", reps=60)
    v, problem = corpus.judged(slow, maker((g / "wrapper.py").read_text()), tmp_path / "cand", "win")
    assert not problem, problem
