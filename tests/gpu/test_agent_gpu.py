"""The agent optimizer on CUDA (run on the GPU machine: `make gpu-test`, with the agent's wheels
carried in .whl/): a scripted chat model drives the real Deep Agent stack on a real captured Triton
wrapper. The shell sees the GPU and no API key; a genuinely faster rewrite (the same graph with
Inductor's fusion on) is accepted, confirmed and installed; a side-stream cheat is rejected."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepagents")

from tests.conftest import run_capture_subprocess  # noqa: E402
from tests.fakes.chat import ai, tc  # noqa: E402
from tests.test_agent_tracks import Script, _run, attempt_of  # noqa: E402
from tests.test_runtime import SLOW, keys  # noqa: E402
from tilesmith import runs, store  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def unfused(tmp_path_factory, inductor_cache):
    root = tmp_path_factory.mktemp("gpu-agent")
    slow, fast = root / "slow", root / "fast"
    assert run_capture_subprocess(SLOW, slow, "--slow", "--device", "cuda").returncode == 0
    assert run_capture_subprocess(SLOW, fast, "--device", "cuda").returncode == 0
    (fk,) = keys(fast)
    return slow, (fast / "graphs" / fk / "wrapper.py").read_text()


def _write_and_submit(name: str, source: str) -> list:
    return [ai("", tc("write_file", file_path=f"/scratch/{name}.py", content=source)),
            lambda ms: ai("", tc("execute", command=f"cp scratch/{name}.py .{attempt_of(ms)}")),
            ai("", tc("evaluate")),
            ai(f"{name}: submitted")]


def _events(tdir, turn: int = 1) -> dict:
    return json.loads((tdir / "profiles" / f"turn_{turn:03d}.json").read_text())


def test_gpu_agent_track_with_a_faster_rewrite_is_accepted_confirmed_and_installed(unfused, monkeypatch):
    from tilesmith.install import install

    slow_ws, fused = unfused
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    probe = ("echo KEY=[$OPENAI_API_KEY]; python -c \"import torch; "
             "print('CUDA', torch.cuda.is_available(), torch.cuda.get_device_name())\"")
    script = Script([ai("", tc("execute", command=probe)),
                     ai("", tc("profile"))] + _write_and_submit("fused", fused))
    result, _ = _run(slow_ws, "scripted-gpu-win", script, gate_time_budget_s=4.0)
    (t,) = result.tracks
    assert (t.status, t.loops_done, t.candidates) == ("done", 1, 1), t.reason
    tdir = runs.track_dir(result.run_id, t.key)
    v = json.loads((tdir / "profiles" / "verdict_000.json").read_text())
    assert v["accepted"] and v["confirmation"]["timing"]["speedup_low"] > 1.02
    assert v["candidate_sha256"] == store.sha256_bytes(fused.encode())
    shell = "\n".join(e["output"] for e in _events(tdir)["events"] if e["kind"] == "tool_call" and e["tool"] == "execute")
    assert "KEY=[]" in shell and "CUDA True" in shell and "sk-parent-secret" not in shell
    assert [(g.key, g.status) for g in install(result.run_id).graphs] == [(t.key, "installed")]
    assert store.artifact_path(t.key).read_text() == fused
    print(f"gpu agent: accepted {v['confirmation']['timing']['speedup']:.2f}x "
          f"(low {v['confirmation']['timing']['speedup_low']:.2f}x)")


def test_gpu_agent_side_stream_cheat_is_rejected_and_the_original_stays(unfused):
    slow_ws, _ = unfused
    cheat = "\n_side = torch.cuda.Stream()\n"
    script = Script([lambda ms: ai("", tc("edit_file", file_path=attempt_of(ms), old_string="async_compile.wait(globals())",
                                          new_string="async_compile.wait(globals())" + cheat)),
                     ai("side stream added"),  # no evaluate: the host's gate is the one that rejects it
                     ai("I cannot beat it.")])
    result, _ = _run(slow_ws, "scripted-gpu-cheat", script, max_model_calls=5)
    (t,) = result.tracks
    assert t.status == "exhausted" and t.loops_done == 0 and t.rejected_by_stage == {"static": 1}
    assert not (runs.track_dir(result.run_id, t.key) / "best.py").exists()


def test_gpu_inner_loop_check_screen_and_kernel_bench_on_a_real_triton_wrapper(unfused):
    """The fast tools on CUDA: check (load + correctness), screen (interleaved timing against the
    best) and the shell harness timing each Triton kernel on its real arguments, then the host judges."""
    from tilesmith.search.kernel_bench import bench

    slow_ws, fused = unfused
    (g,) = sorted((slow_ws / "graphs").iterdir())
    b = bench((g / "wrapper.py").read_text(), g, calls=5)
    assert b.device == "cuda" and b.kernels and all(r.launches > 0 and r.ns > 0 for r in b.kernels)
    assert any(r.kind == "triton" for r in b.kernels)
    script = Script([ai("", tc("write_file", file_path="/scratch/fused.py", content=fused)),
                     lambda ms: ai("", tc("execute", command=f"cp scratch/fused.py .{attempt_of(ms)}")),
                     lambda ms: ai("", tc("check", path=attempt_of(ms))),
                     lambda ms: ai("", tc("screen", paths=[attempt_of(ms)])),
                     lambda ms: ai("", tc("execute", command=f"python -m tilesmith.search.kernel_bench .{attempt_of(ms)}")),
                     ai("fused: checked and screened")])
    result, _ = _run(slow_ws, "scripted-gpu-inner", script, gate_time_budget_s=4.0)
    (t,) = result.tracks
    assert (t.status, t.loops_done, t.candidates) == ("done", 1, 1), t.reason
    out = {}
    for e in _events(runs.track_dir(result.run_id, t.key))["events"]:
        if e["kind"] == "tool_call":
            out.setdefault(e["tool"], []).append(e["output"])
    check = json.loads(out["check"][0])
    assert check["ok"] and check["stage"] == "correctness"
    assert "x vs best" in out["screen"][0]
    assert "triton" in out["execute"][-1] and "ms/call" in out["execute"][-1]
    print("gpu inner loop:", out["screen"][0].replace("\n", " | "))
