"""benchmarks/models.py plumbing on CPU (the suite itself runs on the GPU machine: `make bench-gpu`):
the plan a run would execute, and the user's program it captures, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "models.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_model_suite_dry_run_plans_every_compile_mode_and_each_tilesmith_path_per_model():
    p = _run("run", "--dry-run", "--models", "tiny,gpt2-train", "--device", "cuda",
             "--tilesmith-on", "default,reduce-overhead", "--max-minutes", "0.5", "--jobs", "1,gpt2-train:2")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["models"] == ["tiny", "gpt2-train"] and plan["max_minutes"] == 0.5
    assert plan["jobs_by_model"] == {"tiny": 1, "gpt2-train": 2}
    assert plan["paths"] == ["eager", "compile default", "compile reduce-overhead", "compile max-autotune-no-cudagraphs",
                             "compile max-autotune", "tilesmith on default", "tilesmith on reduce-overhead"]
    bad = _run("run", "--dry-run", "--models", "nosuchmodel")
    assert bad.returncode != 0 and "unknown model or mode: nosuchmodel" in bad.stderr
    bad = _run("run", "--dry-run", "--models", "tiny", "--jobs", "tiny:0")
    assert bad.returncode != 0 and "--jobs: '0' for tiny is not a whole number of graphs" in bad.stderr


def test_model_suite_runs_the_users_program_for_a_model_without_libraries_on_cpu():
    p = _run("model", "--name", "tiny", "--mode", "eager", "--steps", "2", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("tiny (eager): output (16, 32), checksum ")


def test_gate_estimate_of_the_step_is_scaled_only_when_every_graph_has_a_baseline():
    from benchmarks import models

    rows = [{"path": "compile default", "median_ms": 8.0}, {"path": "tilesmith on default", "median_ms": 6.0}]
    done = {"status": "done", "baseline_ms": 2.0, "best_ms": 1.0, "speedup": 2.0}
    # The H200's GPT-2 training step: one backward optimized, three graphs never started (no baseline).
    partial = models.headline({"rows": rows, "tilesmith": {"default": {"tracks": [
        done] + [{"status": "pending", "baseline_ms": None, "best_ms": None, "speedup": None}] * 3}}})
    t = partial["tilesmith_paths"]["default"]
    assert t["estimate_scaled"] is False and t["gate_estimate_ms"] == 7.0  # 8 - 1 ms saved, not 8 - 4
    assert t["track_statuses"] == {"done": 1, "pending": 3} and abs(t["measured_vs_estimate"] - 7 / 6) < 1e-9
    # Every graph timed alone (2 + 2 ms of an 8 ms step): each saved ms is scaled by 8 / 4.
    whole = models.headline({"rows": rows, "tilesmith": {"default": {"tracks": [
        done, {"status": "exhausted", "baseline_ms": 2.0, "best_ms": None, "speedup": None}]}}})
    t = whole["tilesmith_paths"]["default"]
    assert t["estimate_scaled"] is True and t["gate_estimate_ms"] == 6.0


def test_a_tilesmith_path_with_nothing_installed_counts_as_its_own_modes_step_not_as_a_win():
    """GPT-2 under reduce-overhead on the H200 (session 14): nothing accepted, and the tilesmith path measured
    1.036x of the mode by noise alone. Such a path runs the mode's own code: its row is the mode's step."""
    from benchmarks import models

    rows = [{"path": "compile default", "median_ms": 1.2}, {"path": "compile reduce-overhead", "median_ms": 0.2055},
            {"path": "tilesmith on reduce-overhead", "median_ms": 0.1985}]
    res = {"rows": rows, "tilesmith": {"reduce-overhead": {"tracks": [
        {"status": "exhausted", "baseline_ms": 1.27, "best_ms": None, "speedup": None}]}}}
    h = models.headline(res)
    t = h["tilesmith_paths"]["reduce-overhead"]
    assert t["nothing_installed"] is True and t["measured_step_ms"] == 0.1985
    assert t["step_ms"] == 0.2055 and t["vs_best_mode"] == 1.0 and h["tilesmith_best_vs_best_mode"] == 1.0
    assert t["counted_as_own_mode"] is True and t["vs_own_mode"] == 1.0
    # One graph accepted: the measured step counts.
    res["tilesmith"]["reduce-overhead"]["tracks"][0].update(status="done", best_ms=1.0, speedup=1.27)
    t = models.headline(res)["tilesmith_paths"]["reduce-overhead"]
    assert t["nothing_installed"] is False and t["step_ms"] == 0.1985 and t["vs_best_mode"] > 1.03


def test_each_worker_answers_profile_with_host_and_wall_time_and_no_gpu_figures_on_cpu(tmp_path):
    from benchmarks import flow

    def cmd(path: str, out_file: str) -> list[str]:  # as models.py's run_model starts a worker
        return [sys.executable, str(SCRIPT), "worker", "--name", "tiny", "--path", path, "--device", "cpu",
                "--out", out_file]

    samples, errors, extras = flow.measure_in_processes(cmd, ["eager"], str(tmp_path), 0.0, 2, min_rounds=2,
                                                        profile_calls=5, min_sample_ms=5.0)
    assert len(samples["eager"]) == 2 and errors == {"eager": 0.0}
    prof = extras["eager"].pop("profile")
    sampling = extras["eager"].pop("sampling")  # a sample of >= 5 ms of steps, a quarter as many untimed first
    assert sampling["calls"] >= 2 and sampling["warmup"] == sampling["calls"] // 4
    assert extras["eager"] == {}  # the worker's own extras are unchanged beside it
    assert "error" not in prof, prof
    assert prof["host_ms"] > 0 and prof["wall_ms"] > 0
    assert prof["gpu_busy_ms"] is None and prof["kernels_per_step"] is None and prof["top"] is None


def test_a_path_still_compiling_at_the_ready_deadline_is_left_out_and_the_others_are_timed(tmp_path):
    """On the H200 max-autotune's compile of ResNet-18 outlasted the device call, and the other paths'
    numbers were lost with it: a path not ready by the deadline is now left out, its worker ended."""
    from benchmarks import flow

    def cmd(path: str, out_file: str) -> list[str]:
        if path == "compiling forever":
            return [sys.executable, "-c", "import time; time.sleep(600)"]
        return [sys.executable, str(SCRIPT), "worker", "--name", "tiny", "--path", path, "--device", "cpu",
                "--out", out_file]

    samples, errors, extras = flow.measure_in_processes(cmd, ["eager", "compiling forever"], str(tmp_path), 0.0, 2,
                                                        min_rounds=2, ready_s=1.0)
    assert list(samples) == ["eager"] and len(samples["eager"]) == 2 and errors == {"eager": 0.0}
    assert extras["compiling forever"]["left_out"] is True
    assert "not ready 1 s after the workers started" in extras["compiling forever"]["error"]


def test_a_path_that_fails_in_the_programs_loop_is_reported_and_the_others_are_timed(tmp_path):
    """Issue 38's loops: reduce-overhead crashed in a plain training loop with a compiled optimizer step; the suite
    reports such a mode as failed and times the others (before, one failing path ended the model's timing)."""
    from benchmarks import flow

    def cmd(path: str, out_file: str) -> list[str]:
        if path == "crashes":
            return [sys.executable, "-c", "raise SystemExit('accessing tensor output of CUDAGraphs that has been overwritten')"]
        return [sys.executable, str(SCRIPT), "worker", "--name", "tiny", "--path", path, "--device", "cpu",
                "--out", out_file]

    samples, errors, extras = flow.measure_in_processes(cmd, ["eager", "crashes"], str(tmp_path), 0.0, 2, min_rounds=2)
    assert list(samples) == ["eager"] and len(samples["eager"]) == 2
    assert extras["crashes"]["left_out"] is True and "failed in the program's loop (exit 1" in extras["crashes"]["error"]


def test_gpu_busy_time_is_the_union_of_device_events_without_annotation_spans():
    from types import SimpleNamespace as NS

    from torch.profiler import DeviceType

    from benchmarks import flow, models

    def ev(name, start, end, device=DeviceType.CUDA, annotation=False):
        return NS(name=name, device_type=device, is_user_annotation=annotation, time_range=NS(start=start, end=end))

    # 2 steps: two kernels overlapping on two streams (0-30 us once), a copy, a gap, a kernel; the
    # annotation spanning the gap and the host's launch are not device work.
    events = [ev("gemm", 0, 20), ev("relu", 10, 30), ev("Memcpy HtoD (Pageable -> Device)", 30, 40),
              ev("gemm", 100, 140), ev("## Call CompiledFxGraph ##", 0, 140, annotation=True),
              ev("cudaLaunchKernel", 0, 200, device=DeviceType.CPU)]
    s = flow.device_summary(events, 2)
    assert s["gpu_busy_ms"] == pytest.approx((40 + 40) / 2 / 1e3) and s["kernels_per_step"] == 1.5
    assert s["top"] == [["gemm", pytest.approx(0.03)], ["relu", pytest.approx(0.01)]]
    rows = models.profile_table({"gpu": {"wall_ms": 0.045, "host_ms": 0.01, **s},
                                 "host": {"wall_ms": 0.5, "host_ms": 0.5, **s},
                                 "cpu": {"wall_ms": 0.5, "host_ms": 0.5, "gpu_busy_ms": None, "kernels_per_step": None}})
    assert [r["bound"] for r in rows.values()] == ["GPU", "host/gaps", None]


def test_summary_of_several_runs_takes_each_models_latest_measured_result_and_one_geometric_mean(tmp_path):
    """One device call fits two models: the suite's geometric mean comes from several runs' models.json."""
    from benchmarks import models

    def result(model: str, own: float, ts: float) -> dict:
        res = {"model": model, "errors": [], "rows": [{"path": "compile reduce-overhead", "median_ms": own},
                                                      {"path": "tilesmith on reduce-overhead", "median_ms": ts}],
               "tilesmith": {"reduce-overhead": {"tracks": [{"status": "done", "baseline_ms": own, "best_ms": ts,
                                                             "speedup": own / ts}]}}}
        res.update(models.headline(res))
        return res

    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    a.write_text(json.dumps({"date": "d1", "torch": "t", "results": [result("moe", 0.15, 0.12), result("gpt2", 0.2, 0.25)]}))
    b.write_text(json.dumps({"date": "d2", "torch": "t", "results": [
        result("gpt2", 0.2, 0.16), {"model": "moe", "errors": ["timing: cut off"], "tilesmith": {}}]}))
    bad.write_text("{}")
    p = _run("summary", str(a), str(b), "--out", str(tmp_path / "suite.json"))
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "suite.json").read_text())
    by = {r["model"]: r for r in doc["results"]}
    assert by["gpt2"]["from"].startswith(str(b)) and by["moe"]["from"].startswith(str(a))  # the cut-off run hides nothing
    assert abs(doc["summary"]["geomean_vs_best_mode"] - (1.25 * 1.25) ** 0.5) < 1e-9
    assert doc["summary"]["models_measured"] == 2 and "geometric mean" in p.stdout
    p = _run("summary", str(bad))
    assert p.returncode != 0 and "not a models.json" in p.stderr


def test_flows_run_in_one_call_are_timed_by_a_later_run_that_reuses_them(tmp_path):
    """The GPU machine's 10-minute calls: the flows in one (--no-timing, per-model modes), every path of the
    suite timed in a later one over those flows (--reuse), which runs no flow again and says where each came from."""
    prep, timed = tmp_path / "prep", tmp_path / "timed"
    p = _run("run", "--models", "tiny", "--device", "cpu", "--tilesmith-on", "none,tiny:default", "--max-minutes",
             "1,tiny:0.15", "--no-timing", "--out-dir", str(prep))
    assert p.returncode == 0, p.stderr[-3000:]
    flow_ = json.loads((prep / "models.json").read_text())["results"][0]
    assert list(flow_["tilesmith"]) == ["default"] and "rows" not in flow_ and flow_["errors"] == []
    assert (prep / "tiny" / "default" / "home" / "runs" / flow_["tilesmith"]["default"]["run_id"]).is_dir()
    assert "tilesmith on default: run " in p.stdout
    p = _run("run", "--models", "tiny", "--device", "cpu", "--tilesmith-on", "default", "--modes", "default",
             "--reuse", str(prep), "--seconds", "0.2", "--min-rounds", "2", "--profile-calls", "0", "--out-dir", str(timed))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((timed / "models.json").read_text())["results"][0]
    t = r["tilesmith"]["default"]
    assert t["run_id"] == flow_["tilesmith"]["default"]["run_id"] and t["reused_from"].startswith(str(prep))
    assert t["same_code"] is True  # the flows' code and the timing's are the same files
    assert not (timed / "tiny" / "default").exists()  # no flow ran here
    assert [x["path"] for x in r["rows"]] == ["eager", "compile default", "tilesmith on default"]
    ready = [r["sampling"][n]["ready_after_s"] for n in ("eager", "compile default", "tilesmith on default")]
    assert ready == sorted(ready) and ready[0] > 0  # read in order: each at most its own compile's end
    bad = _run("run", "--models", "tiny", "--device", "cpu", "--reuse", str(tmp_path / "nothing"), "--out-dir",
               str(tmp_path / "x"))
    assert bad.returncode != 0 and "no models.json from `models.py run` there" in bad.stderr
