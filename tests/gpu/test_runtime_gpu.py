"""The runtime on CUDA (run on the GPU machine: `make gpu-test`): a gate-accepted candidate on plain
launches and under mode="reduce-overhead" (CUDA graphs capture the artifact's code), and a perturbed
artifact whose effect shows through CUDA-graph replays. Artifacts with markers bypass the gate on
purpose (see tests/test_runtime.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402
from tests.test_runtime import SLOW, install_direct, keys, marker_artifact, number, run, stats_of  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_gate_accepted_faster_candidate_is_loaded_with_and_without_cuda_graphs(tmp_path, mode, inductor_cache):
    from tilesmith.gate.verdict import Policy
    from tilesmith.install import install
    from tilesmith.submit import submit

    extra = ["--device", "cuda", "--mode", mode]
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    assert run_capture_subprocess(SLOW, slow, "--slow", *extra).returncode == 0
    assert run_capture_subprocess(SLOW, fast, *extra).returncode == 0
    (sk,), (fk,) = keys(slow), keys(fast)
    result = submit(slow / "graphs" / sk, fast / "graphs" / fk / "wrapper.py", Policy(time_budget_s=8.0))
    assert result.accepted, result.verdict["reasons"]
    assert install(result.run_id).graphs[0].status == "installed"
    for cache in (tmp_path / "cache", tmp_path / "cache"):  # cold, then warm
        p = run(SLOW, "--slow", "--steps", "4", *extra, cache=cache)
        assert p.returncode == 0, p.stderr
        s = stats_of(p)
        assert (s["substituted"], s["fallbacks"], s["substituted_keys"]) == (1, [], [sk])
        assert number(p, "max_err") < 1e-4


def test_gpu_perturbed_artifact_is_what_the_cuda_graph_replays(tmp_path, inductor_cache):
    ws = tmp_path / "ws"
    args = ["--device", "cuda", "--mode", "reduce-overhead", "--steps", "5"]
    assert run_capture_subprocess(EXAMPLES / "inference.py", ws, *args).returncode == 0
    (k,) = keys(ws)
    baseline = number(run(EXAMPLES / "inference.py", *args, cache=tmp_path / "c", runtime=False), "checksum")
    install_direct(ws, k, marker_artifact((ws / "graphs" / k / "wrapper.py").read_text(), k, perturb=True))
    for cache in (tmp_path / "c2", tmp_path / "c2"):
        p = run(EXAMPLES / "inference.py", *args, cache=cache)
        assert p.returncode == 0, p.stderr
        s = stats_of(p)
        assert s["substituted"] == 1 and s["fallbacks"] == []
        # CUDA-graph replays skip Python: the marker runs at warm-up/record only, yet every output is perturbed.
        assert 1 <= len(s["marker_hits"]) < 5
        assert number(p, "checksum") > baseline + 1000


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_training_step_replays_every_graphed_artifact_without_a_plain_fallback(tmp_path, mode, inductor_cache):
    """The lean replay in a plain training loop (no cudagraph_mark_step_begin): forward graphs return
    inputs and saved activations, backward graphs read them and hand gradients to AccumulateGrad; every
    graph must replay (not fall back to plain calls) and the loss must be the plain program's. Under
    reduce-overhead the runtime turns Inductor's CUDA graphs off for these graphs."""
    from tilesmith.cudagraph import MAX_RECORDS
    from tilesmith.search.graphed import graphed_text

    ws = tmp_path / "ws"
    extra = ["--device", "cuda", "--mode", mode] if mode != "default" else ["--device", "cuda"]
    assert run_capture_subprocess(EXAMPLES / "training.py", ws, *extra).returncode == 0
    ks = keys(ws)
    assert len(ks) == 4
    for k in ks:
        install_direct(ws, k, graphed_text((ws / "graphs" / k / "wrapper.py").read_text()).encode())
    args = ["--steps", "8", *extra]
    plain = run(EXAMPLES / "training.py", *args, cache=tmp_path / "c", runtime=False)
    p = run(EXAMPLES / "training.py", *args, cache=tmp_path / "c")
    assert p.returncode == 0 and plain.returncode == 0, p.stderr + plain.stderr
    s = stats_of(p)
    assert s["substituted"] == 4 and s["fallbacks"] == []
    for k in ks:
        g = s["cuda_graphs"][k]
        assert g["replays"] >= 5 and g["plain_reasons"] == [], (k, g)
        # The loop settles with its saved activations read in place or copied, never at the last capture
        # that copies every input and every output (session 12: a GPT-2 backward ended there).
        assert all(lay["captures"] < MAX_RECORDS for lay in g["layouts"]), (k, g["layouts"])
    assert abs(number(p, "loss") - number(plain, "loss")) <= 1e-5 * max(1.0, abs(number(plain, "loss")))


PERTURB_CALL = """

_inductors_call = call


def call(args):
    out = _inductors_call(args)
    next(o for o in out if isinstance(o, torch.Tensor) and o.is_floating_point()).add_(1000.0)
    return out
"""


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_verify_passes_honest_replayed_training_graphs_and_drops_a_perturbed_one(tmp_path, mode, inductor_cache):
    """TILESMITH_VERIFY on CUDA: every graph of a plain training loop installed as tilesmith's CUDA-graph
    replay of Inductor's own code verifies (RNG states, copies of saved activations, the replay inside the
    check) with the plain program's loss; then the same with one forward graph perturbed: it is dropped on
    its first call, through tilesmith's replay of Inductor's code under reduce-overhead, and the loss is
    still the plain program's."""
    from tilesmith.search.graphed import graphed_text

    ws = tmp_path / "ws"
    extra = ["--device", "cuda", "--mode", mode] if mode != "default" else ["--device", "cuda"]
    assert run_capture_subprocess(EXAMPLES / "training.py", ws, *extra).returncode == 0
    ks = keys(ws)
    for k in ks:
        install_direct(ws, k, graphed_text((ws / "graphs" / k / "wrapper.py").read_text()).encode())
    args = ["--steps", "6", *extra]
    plain = run(EXAMPLES / "training.py", *args, cache=tmp_path / "c", runtime=False)
    p = run(EXAMPLES / "training.py", *args, cache=tmp_path / "c", env={"TILESMITH_VERIFY": "3"})
    assert p.returncode == 0 and plain.returncode == 0, p.stderr + plain.stderr
    s = stats_of(p)
    assert s["substituted"] == 4 and s["fallbacks"] == [], s
    assert all(v["failed"] == "" and v["verified_calls"] >= 1 for v in s["verified"].values()), s["verified"]
    assert abs(number(p, "loss") - number(plain, "loss")) <= 1e-5 * max(1.0, abs(number(plain, "loss")))

    fw = next(k for k in ks if json.loads((ws / "graphs" / k / "graph.json").read_text())["kind"] == "forward")
    # Its first floating-point output off by 1000, whatever the wrapper's own structure (on the H200 a
    # substitution of the first `return (` line changed nothing the call returned).
    text = (ws / "graphs" / fw / "wrapper.py").read_text() + PERTURB_CALL
    install_direct(ws, fw, text.encode(), force=True)  # over the honest replay installed above
    p = run(EXAMPLES / "training.py", *args, cache=tmp_path / "c", env={"TILESMITH_VERIFY": "3"})
    assert p.returncode == 0, p.stderr
    s = stats_of(p)
    assert s["verified"][fw]["failed"].startswith("output"), s["verified"][fw]
    assert abs(number(p, "loss") - number(plain, "loss")) <= 1e-5 * max(1.0, abs(number(plain, "loss")))
