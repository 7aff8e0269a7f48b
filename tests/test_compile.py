"""tilesmith.compile on CPU with real models, each in a fresh process (Dynamo state and Inductor
config stay out of the test process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gate_helpers as h
from tilesmith import runs

SCRIPT = Path(__file__).parent / "fixtures" / "compile_api.py"


def drive(what: str, device: str = "cpu") -> dict:
    p = subprocess.run([sys.executable, str(SCRIPT), what, device], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _timing_only(run_id: str) -> bool:
    """Whether the run's one graph ended with every candidate rejected at timing alone (gate_helpers.timing_only)."""
    (track,) = runs.load_run(run_id).graphs.values()
    verdicts = sorted((runs.track_dir(run_id, track["key"]) / "profiles").glob("verdict_*.json"))
    return track["status"] != "done" and bool(verdicts) and all(h.timing_only(json.loads(v.read_text()))
                                                                 for v in verdicts)


@pytest.mark.slow
def test_compile_optimizes_on_the_first_call_swaps_the_win_in_and_a_second_compile_is_an_exact_hit():
    # The win is the tuner's thread count on an oversubscribed OpenMP kernel: 1.5x [1.28, 1.77] on the quiet 2-core
    # box, but beside another test process the gate may reject it at timing (CI, 2026-12-07: not shown beyond the
    # noise twice in a row; then "clearly not faster", the candidate's worker slow for the whole pass). A user would
    # compile again; so does the test, up to three times. Whatever the gate decided is then checked for what follows
    # from it: the test never passes or fails on how fast it ran.
    for _ in range(3):
        first = drive("inference")
        if first["swapped"] or not _timing_only(first["run_id"]):
            break
    assert first["max_error"] < 1e-5
    run = runs.load_run(first["run_id"])
    (track,) = run.graphs.values()
    if not first["swapped"]:
        # no win shown: nothing swapped in, the run says so, and Inductor's code answered every call
        assert _timing_only(first["run_id"]) and track["loops_done"] == 0, track
        assert track["status"] == "exhausted", track
        return
    assert first["run_id"] and len(first["swapped"]) == 1
    assert track["status"] == "done" and track["loops_done"] == 1 and track["speedup_low"] > 1.02
    second = drive("inference")  # a new process, the same model: the installed artifact, no optimizer
    (again,) = runs.load_run(second["run_id"]).graphs.values()
    assert again["status"] == "cached" and again["candidates"] == 0
    assert second["swapped"] == first["swapped"] and second["max_error"] < 1e-5
    assert (runs.track_dir(second["run_id"], second["swapped"][0]) / "cache.json").exists()


@pytest.mark.slow
def test_compile_of_a_training_step_optimizes_forward_and_backward_and_gradients_stay_right():
    r = drive("training")
    assert r["max_error"] < 1e-5
    # A fresh compile makes the backward at the first backward pass, so it is optimized at the start of
    # the second call (two runs); on an AOTAutograd cache hit both graphs load at the first call (one run).
    assert len(r["runs"]) in (1, 2)
    kinds = sorted(g["kind"] for rid in r["runs"] for g in runs.load_run(rid).graphs.values())
    assert kinds == ["backward", "forward"]


@pytest.mark.slow
def test_background_mode_keeps_calling_inductors_code_and_swaps_the_win_in_when_confirmed():
    r = drive("background")
    assert r["max_error"] < 1e-5 and r["calls_while_optimizing"] > 1
    # The win swapped in exactly when the gate confirmed it. It is one only on an oversubscribed CPU: with two
    # test suites beside the program's own loop on the 2 cores, the gate once found it no faster (nothing swapped,
    # rightly). What was decided is read from the run, not assumed.
    (track,) = runs.load_run(r["run_id"]).graphs.values()
    if track["loops_done"]:
        assert len(r["swapped"]) == 1
    else:
        assert r["swapped"] == [] and track["status"] == "exhausted", track


def test_example_inputs_without_a_tensor_are_refused_up_front():
    import torch

    import tilesmith

    with pytest.raises(tilesmith.TilesmithError, match="at least one tensor"):
        tilesmith.compile(torch.nn.Linear(2, 2), example_inputs=[torch.zeros(2)])
    with pytest.raises(tilesmith.TilesmithError, match="at least one tensor"):
        tilesmith.compile(torch.nn.Linear(2, 2), example_inputs=(3,))
