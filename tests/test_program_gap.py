"""The program's host time between a graph's calls: measured at capture (capture/gaps.py), spent by the gate
before each timed call of every role (gate/timed.py program_gap_ns, gate/worker.py op_time)."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import torch

from tests.conftest import run_capture_subprocess
from tilesmith import workspace as wsmod
from tilesmith.capture import gaps
from tilesmith.gate.timed import program_gap_ns
from tilesmith.gate.verdict import Policy

LOOP = """
    import time, torch
    def f(x, w):
        return torch.relu(x @ w).sum(dim=0)
    g = torch.compile(f)
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    for _ in range({calls}):
        g(x, w)
        t = time.perf_counter()
        while time.perf_counter() - t < {pause_s}:  # the program's own host work between steps
            pass
"""

BROKEN = """
    import torch
    def f(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return torch.tanh(y) + 1
    g = torch.compile(f)
    x = torch.randn(64)
    for _ in range(20):
        g(x)
"""


def _capture(tmp_path, body: str) -> list[dict]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    ws = tmp_path / "ws"
    p = run_capture_subprocess(script, ws)
    assert p.returncode == 0, p.stderr
    w = wsmod.load(ws)
    return [wsmod.load_graph_json(w.graph_dir(g.key)) for g in w.graphs]


def test_capture_measures_the_host_time_between_a_graphs_calls_and_keeps_cpu_graphs_out(tmp_path, inductor_cache):
    (meta,) = _capture(tmp_path, LOOP.format(calls=24, pause_s=0.004))
    gap = meta["program_gap"]
    assert gap["calls"] == 24 and gap["gaps"] == 24 - gaps.SKIP and gap["interleaved"] == 0
    # The script's own 4 ms of busy host work between calls is in the gap (a lower bound: the loop waits it out).
    assert gap["q1_us"] >= 4000 and gap["host_us"] >= gap["q1_us"]
    # A CPU graph's calls are synchronous: the gap would only dilute the gate's ratio, so the gate never spends it.
    assert gap["usable"] is False and "CPU graph" in gap["why"]
    assert program_gap_ns(meta, "cpu", Policy()) == 0


def test_two_graphs_of_one_step_are_not_given_each_others_gaps(tmp_path, inductor_cache):
    metas = _capture(tmp_path, BROKEN)
    assert len(metas) == 2
    for meta in metas:
        gap = meta["program_gap"]
        assert gap["interleaved"] >= 8 and gap["gaps"] == 0 and gap["usable"] is False, gap


def _stats(**kw) -> dict:
    st = {"device": "cuda:0", "calls": 40, "gaps": [30_000 + i for i in range(20)], "interleaved": 0,
          "outside": {"kernels": 0, "device_us": 0.0, "next_graph_same": True}, "outside_error": ""}
    st.update(kw)
    return st


def test_the_gap_is_usable_only_alone_measured_and_with_no_gpu_work_of_the_programs_own():
    ok = gaps.summarize(_stats())
    assert ok["usable"] is True and 30.0 <= ok["host_us"] <= 30.02 and "why" not in ok
    assert program_gap_ns({"program_gap": ok}, "cuda:0", Policy()) == int(ok["host_us"] * 1e3)
    assert program_gap_ns({"program_gap": ok}, "cuda:0", Policy(program_gap=False)) == 0
    busy = gaps.summarize(_stats(outside={"kernels": 3, "device_us": 12.5, "next_graph_same": True}))
    assert busy["usable"] is False and "GPU work of its own" in busy["why"]
    assert program_gap_ns({"program_gap": busy}, "cuda:0", Policy()) == 0
    assert "not profiled" in gaps.summarize(_stats(outside=None))["why"]
    assert "could not" in gaps.summarize(_stats(outside=None, outside_error="could not profile a gap: x"))["why"]
    assert "other graphs" in gaps.summarize(_stats(interleaved=2))["why"]
    assert "called it" in gaps.summarize(_stats(gaps=[1000] * 3, calls=9))["why"]
    # A graph.json edited by hand cannot ask for more than the gate's cap, nor for a negative gap.
    forged = dict(ok, host_us=1e9)
    assert program_gap_ns({"program_gap": forged}, "cuda:0", Policy()) == 50_000_000
    assert program_gap_ns({"program_gap": dict(ok, host_us=-5)}, "cuda:0", Policy()) == 0
    assert program_gap_ns({"program_gap": dict(ok, host_us="x")}, "cuda:0", Policy()) == 0
    assert program_gap_ns({}, "cuda:0", Policy()) == 0


def test_the_watch_never_breaks_a_call_and_passes_its_result_and_errors_through():
    w = gaps.GapWatch()
    f = w.wrap("k", "cpu", lambda args: [a * 2 for a in args])
    for _ in range(gaps.SKIP + 12):
        assert f([1, 2]) == [2, 4]

    def boom(args):
        raise ValueError("the graph's own error")

    b = w.wrap("b", "cpu", boom)
    try:
        b([])
    except ValueError as e:
        assert "own error" in str(e)
    r = w.result("k")
    assert r["calls"] == gaps.SKIP + 12 and r["gaps"] == 12 and r["interleaved"] == 0
    assert w.result("b")["calls"] == 1 and w.result("missing") is None


def test_the_worker_spends_the_gap_before_every_timed_call_of_every_role(tmp_path):
    from tilesmith.gate import worker

    st = worker.State()
    st.data = SimpleNamespace(meta={"inputs": [{"kind": "tensor"}]})
    st.fns = {r: (lambda args: (args[0] + 1,)) for r in ("candidate", "baseline")}
    sets = tmp_path / "sets.pt"
    torch.save({"inputs": [[torch.ones(4)], [torch.zeros(4)]]}, sets)
    gap, reps = 3_000_000, 4
    for role in ("candidate", "baseline"):
        worker.op_time_setup(st, {"sets_file": str(sets), "roles": [role], "mode": "launch", "buffers": 2,
                                  "gap_ns": gap})
        assert st.gap_ns == gap
        ns = worker.op_time(st, {"role": role, "reps": reps, "start": 0})["ns"]
        assert ns >= reps * gap  # a busy wait of at least `gap` before each call, inside the timed window
    worker.op_time_setup(st, {"sets_file": str(sets), "roles": ["baseline"], "mode": "launch", "buffers": 2,
                              "gap_ns": 10**12})
    assert st.gap_ns == worker.MAX_GAP_NS  # capped in the worker too
    worker.op_time_setup(st, {"sets_file": str(sets), "roles": ["baseline"], "mode": "launch", "buffers": 2})
    assert st.gap_ns == 0
