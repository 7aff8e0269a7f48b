"""A decode step that writes a static KV cache in place, on CUDA under reduce-overhead (tests/fixtures/decode_step.py):
its original judged against itself, and tilesmith's whole-call replay of it. On the H100 (2026-12-07, the model suite's
decode loop) the replay was rejected as `wrong-values-in-timing` ("call 16 of the timed stream returned outputs that
differ from the original's") while its eight correctness sets were exact: either a false rejection of an honest
candidate or a defect of the replay on a graph that updates its inputs in place; these tests say which. Not part of
`make gpu-smoke`: `make gpu-test-run GPU_TESTS=tests/gpu/test_decode_gpu.py TAG=decode`."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests import corpus  # noqa: E402
from tests.conftest import FIXTURES, captured_workspace  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def decode_graph(tmp_path_factory, inductor_cache):
    ws = captured_workspace(tmp_path_factory, "ws-decode-gpu", FIXTURES / "decode_step.py", "--device", "cuda",
                            "--mode", "reduce-overhead", "--tokens", "8")
    graphs = [g for g in sorted((ws / "graphs").iterdir())
              if json.loads((g / "graph.json").read_text()).get("mutated_inputs")]
    assert graphs, "the decode step's graph (it writes the cache) was not captured"
    return graphs[0]


def test_gpu_decode_step_original_is_judged_not_faster_than_itself(decode_graph, tmp_path):
    v, problem = corpus.judged(decode_graph, (decode_graph / "wrapper.py").read_text(), tmp_path, "aa")
    assert not problem, problem


def test_gpu_decode_step_replay_is_never_rejected_for_its_values(decode_graph, tmp_path):
    """The replay computes what the original does: accepted, or not faster; never wrong values."""
    from tilesmith.search.graphed import graphed_text

    v, _ = corpus.judged(decode_graph, graphed_text((decode_graph / "wrapper.py").read_text()), tmp_path, "replay")
    assert v.accepted or (v.stage in ("timing", "confirmation") and set(v.codes) <= corpus.NOT_FASTER), (
        v.stage, [(r.code, r.message[:300]) for r in v.reasons])
