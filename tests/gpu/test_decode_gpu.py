"""A decode step that writes a static KV cache in place, on CUDA under reduce-overhead (tests/fixtures/decode_step.py):
its original judged against itself, and tilesmith's whole-call replay of it. On the H100 (2026-12-07) the original
against itself had `raised` ("device-side assert triggered": the gate's 128 warm-up calls of 64 buffer sets took the
cache's position counter past its 64 tokens); with the guards on carried state (gate/inputs.py state_horizon,
gate/worker/setup.restart) it is rejected as not faster. The replay was rejected as `wrong-values-in-timing` on every
run until the gate read the original's checks as the replay's own launch timing held its kept calls (gate.timed.
kept_late: the cache held to the sample's end, not copied after the kept call); since, not faster (0.907x on the
H100). Not part of `make gpu-smoke`: `make gpu-test-run GPU_TESTS=tests/gpu/test_decode_gpu.py TAG=decode`."""

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


def test_gpu_decode_step_replay_matches_the_plain_call_over_rotating_buffer_sets(decode_graph):
    """The replay alone, outside the gate, fed as the gate's timed stream feeds it: four buffer sets in turn (the
    inputs graph.json marks parameters one tensor for all, the others one per set), every set refilled from the
    captured state before each sample of four calls, one call's outputs kept alive across the sample as the gate
    keeps a drawn call's. Each call's outputs and updated inputs must equal the plain wrapper's on its own copy of
    the same stream, to bf16's rounding (the same kernels; a stale state differs by far more); a mismatch says which
    call and what the replay did."""
    import random

    from tilesmith.capture import loading
    from tilesmith.search.graphed import graphed_text

    data = loading.load_graph_data(decode_graph)
    shared = {i for i, d in enumerate(data.meta.get("inputs") or []) if d.get("parameter")}
    updated = sorted(int(i) for i in data.meta["mutated_inputs"])
    text = (decode_graph / "wrapper.py").read_text()
    plain = loading.load_module(text, data.constants)
    replay = loading.load_module(graphed_text(text), data.constants)

    def buffer_sets() -> list:
        base = loading.clone_args(data.inputs)
        return [[x if i in shared or not isinstance(x, torch.Tensor) else x.clone() for i, x in enumerate(base)]
                for _ in range(4)]

    def refill(sets) -> None:
        for b, bufs in enumerate(sets):
            for i, x in enumerate(bufs):
                if isinstance(x, torch.Tensor) and (i not in shared or (b == 0 and i in updated)):
                    x.copy_(data.inputs[i])

    sets_a, sets_b = buffer_sets(), buffer_sets()
    rnd, problems = random.Random(0), []
    with torch.no_grad():
        for sample in range(6):
            refill(sets_a)
            refill(sets_b)
            kept = rnd.randrange(4)
            held = None
            for b in range(4):
                oa, ob = plain.call(list(sets_a[b])), replay.call(list(sets_b[b]))
                oa = list(oa) if isinstance(oa, (list, tuple)) else [oa]
                ob = list(ob) if isinstance(ob, (list, tuple)) else [ob]
                got = ob + [sets_b[b][i] for i in updated]
                want = oa + [sets_a[b][i] for i in updated]
                bad = [k for k, (x, y) in enumerate(zip(got, want)) if isinstance(y, torch.Tensor) and not _same(x, y)]
                if bad:
                    problems.append(f"sample {sample} call {b}: outputs/updated inputs {bad[:6]} differ "
                                    f"(of {len(oa)} outputs, then {len(updated)} updated inputs)")
                if b == kept:
                    held = ob  # the gate keeps a drawn call's outputs until the sample ends
            del held
    torch.cuda.synchronize()
    assert not problems, (problems[:6], replay.call.describe())


def _same(x, y) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if not y.dtype.is_floating_point:
        return torch.equal(x.cpu(), y.cpu())
    return torch.allclose(x.float().cpu(), y.float().cpu(), rtol=2e-2, atol=2e-2, equal_nan=True)
