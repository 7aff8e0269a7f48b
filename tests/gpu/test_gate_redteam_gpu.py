"""The gate's second line on CUDA (run on the GPU machine): workers run in the OS sandbox with CUDA usable
inside, and the outputs of timed calls are checked in launch mode and in CUDA-graph replay, with the
static screen switched off so that only the dynamic defences act (tests/redteam.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests import gate_helpers as h  # noqa: E402
from tests import redteam  # noqa: E402
from tests.conftest import EXAMPLES, run_capture_subprocess  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def cuda_graph(tmp_path_factory, inductor_cache) -> Path:
    ws = tmp_path_factory.mktemp("ws-cuda-redteam") / "ws"
    p = run_capture_subprocess(EXAMPLES / "inference.py", ws, "--device", "cuda", "--steps", "3")
    assert p.returncode == 0, p.stderr
    return h.graph_of(ws)


def test_gpu_sandbox_has_namespaces_and_cuda_works_inside(tmp_path):
    from tilesmith.launch import sandbox

    assert sandbox.level() == "namespaces"
    code = ("import os, torch; x = torch.ones(1024, device='cuda'); torch.cuda.synchronize(); "
            "print(int(x.sum().item()), len([p for p in os.listdir('/proc') if p.isdigit()]))")
    p = subprocess.run(sandbox.wrap([sys.executable, "-c", code], sandbox.Spec(scratch=str(tmp_path))),
                       capture_output=True, text=True, timeout=300, env=sandbox.scrubbed_env(tmp_path), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    total, procs = map(int, p.stdout.split())
    assert total == 1024 and procs <= 3


def _judged_screen_off(graph, maker, tmp_path, monkeypatch, **policy):
    """The cheat `maker` makes of the graph's wrapper (which the static screen passes), judged with the screen off."""
    from tilesmith.gate import Policy, judge, static

    text = maker((graph / "wrapper.py").read_text())
    assert static.screen(text) == []
    monkeypatch.setattr(static, "screen", lambda t: [])
    cand = tmp_path / "candidate.py"
    cand.write_text(text)
    return judge(graph, cand, Policy(**{"time_budget_s": 4.0, **policy}))


@pytest.mark.parametrize("mode", ["launch", "graph"])
@pytest.mark.parametrize("maker", [redteam.stale_after_n_on_the_runner, redteam.degrades_every_kth_call],
                         ids=["stale-after-n", "degrades-every-3rd"])
def test_gpu_gate_checks_outputs_inside_the_timed_stream(cuda_graph, tmp_path, monkeypatch, mode, maker):
    """Launch mode: the cheat's Python runs at every timed call, turns stale or degrades past its first calls, and
    the checked calls inside the timed stream see it. Graph mode: every timed call is a replay of the CUDA graph
    captured at a call that was still honest, so the cheat's Python (its counter) never runs again and it is the
    original's kernels: not faster, and never accepted."""
    v = _judged_screen_off(cuda_graph, maker, tmp_path, monkeypatch, mode=mode)
    assert v.sandbox == "namespaces"
    expected = ["wrong-values-in-timing"] if mode == "launch" else ["not-faster"]
    assert not v.accepted and v.codes == expected and v.stage == "timing", v.reasons


def test_gpu_gate_still_accepts_a_real_win_with_checked_timed_calls(cuda_graph, tmp_path):
    from tilesmith.gate import Policy, judge

    slow = h.slowed_graph_copy(cuda_graph, tmp_path / "slow", reps=40)
    cand = tmp_path / "candidate.py"
    cand.write_text((cuda_graph / "wrapper.py").read_text())
    v = judge(slow, cand, Policy(time_budget_s=8.0))
    assert v.accepted, v.reasons
    assert v.first.timing.checked_calls >= 2 and v.confirmation.timing.checked_calls >= 2
    for t in (v.first.timing, v.confirmation.timing):  # an honest candidate's windows, as the parent saw them
        print(f"window shortfall: candidate {t.window_short_us:.1f} us, original apart {t.window_short_original_us:.1f} "
              f"us, sample {t.candidate_ms * t.calls_per_sample * 1e3:.0f} us")
        assert t.window_short_us != 0.0 and t.window_short_original_us != 0.0  # both measured


@pytest.mark.parametrize("maker,code", [(redteam.hogs_the_cores_from_a_raw_thread, "process-state"),
                                        (redteam.hogs_the_cores_from_a_forked_process, "background-work")],
                         ids=["raw-thread", "forked-process"])
def test_gpu_gate_rejects_work_left_running_between_calls(cuda_graph, tmp_path, monkeypatch, maker, code):
    """A hog that runs whenever the candidate does not: caught by the thread count in the fingerprint, or,
    in a process of its own, by the CPU time of the candidate worker's tree while the original is timed."""
    v = _judged_screen_off(cuda_graph, maker, tmp_path, monkeypatch)
    assert not v.accepted and v.codes == [code], v.reasons


@pytest.mark.parametrize("maker,code", [(redteam.reports_a_shorter_time, "process-state"),
                                        (redteam.clock_code_swap, "process-state"),
                                        (redteam.ops_dict_entry, "process-state"),
                                        (redteam.defers_its_work_to_lazy_outputs, "output-type"),
                                        (redteam.restores_its_patch_before_the_check, "process-state"),
                                        (redteam.moves_the_clocks_start_in_its_frame, "not-faster"),
                                        (redteam.blinds_the_type_check, "output-type")],
                         ids=["json-dumps", "clock-code", "op-table", "lazy-outputs", "self-restoring", "frame-locals",
                              "blinded-check"])
def test_gpu_gate_rejects_forged_numbers_on_cuda(cuda_graph, tmp_path, monkeypatch, maker, code):
    """The worker guard, the plain-tensor rule and the parent's own measure of each window (gate/worker/guard.py,
    worker.op_time, the parent's own clock in gate/windows.py) on a CUDA worker: each cheat is on the original's own code, so any
    acceptance is a forged speedup."""
    v = _judged_screen_off(cuda_graph, maker, tmp_path, monkeypatch)
    assert not v.accepted and v.codes == [code], v.reasons
