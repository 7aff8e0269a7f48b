"""benchmarks/models.py plumbing on CPU (the suite itself runs on the GPU machine: `make bench-gpu`):
the plan a run would execute, and the user's program it captures, in real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "models.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_model_suite_dry_run_plans_every_compile_mode_and_each_tilesmith_path_per_model():
    p = _run("run", "--dry-run", "--models", "tiny,gpt2-train", "--device", "cuda",
             "--tilesmith-on", "default,reduce-overhead", "--max-minutes", "0.5")
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["models"] == ["tiny", "gpt2-train"] and plan["max_minutes"] == 0.5
    assert plan["paths"] == ["eager", "compile default", "compile reduce-overhead", "compile max-autotune-no-cudagraphs",
                             "compile max-autotune", "tilesmith on default", "tilesmith on reduce-overhead"]
    bad = _run("run", "--dry-run", "--models", "nosuchmodel")
    assert bad.returncode != 0 and "unknown model or mode: nosuchmodel" in bad.stderr


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
