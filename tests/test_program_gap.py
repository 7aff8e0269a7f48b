"""The program's host time between a graph's calls: measured at capture (capture/gaps.py), spent by the gate
before each timed call of every role (gate/timed.py program_gap_ns, gate/worker/sample.py op_time)."""

from __future__ import annotations

import os
import textwrap
from types import SimpleNamespace

import pytest
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
    clean = {"kernels": 0, "device_us": 0.0, "syncs": 0, "next_graph_same": True}
    st = {"device": "cuda:0", "calls": 40, "gaps": [30_000 + i for i in range(20)], "interleaved": 0,
          "outside": [dict(clean) for _ in gaps.PROFILE_AFTER], "outside_error": "", "threads": {1},
          "in_flight": 0, "overlapped": 0}
    st.update(kw)
    return st


def test_the_gap_is_usable_only_alone_measured_and_with_no_gpu_work_or_wait_of_the_programs_own():
    ok = gaps.summarize(_stats())
    assert ok["usable"] is True and 30.0 <= ok["host_us"] <= 30.02 and "why" not in ok
    assert program_gap_ns({"program_gap": ok}, "cuda:0", Policy()) == int(ok["host_us"] * 1e3)
    assert program_gap_ns({"program_gap": ok}, "cuda:0", Policy(program_gap=False)) == 0
    clean = _stats()["outside"][0]
    busy = gaps.summarize(_stats(outside=[clean, dict(clean, kernels=3, device_us=12.5), clean]))
    assert busy["usable"] is False and "GPU work of its own" in busy["why"]  # one profiled gap of three is enough
    assert program_gap_ns({"program_gap": busy}, "cuda:0", Policy()) == 0
    # A program that waits for the GPU between calls (a synchronize, .item()): the gap holds that wait, which a
    # candidate saving only host time would be credited with, while the program's step stays as long.
    waits = gaps.summarize(_stats(outside=[clean, clean, dict(clean, syncs=1)]))
    assert waits["usable"] is False and "waits for the GPU" in waits["why"]
    assert "1 of 3 gaps were profiled" in gaps.summarize(_stats(outside=[clean]))["why"]
    assert "runtime" in gaps.summarize(_stats(outside_error="the profiled gap does not show the CUDA runtime's calls"))["why"]
    assert "other graphs" in gaps.summarize(_stats(interleaved=2))["why"]
    assert "called it" in gaps.summarize(_stats(gaps=[1000] * 3, calls=9))["why"]
    assert "several threads" in gaps.summarize(_stats(threads={1, 2}))["why"]
    assert "several threads" in gaps.summarize(_stats(overlapped=1))["why"]
    assert "compiled 4 times" in gaps.summarize(_stats(), compiled=4)["why"]
    # A graph.json edited by hand cannot ask for more than the gate's cap, nor for a negative gap.
    forged = dict(ok, host_us=1e9)
    assert program_gap_ns({"program_gap": forged}, "cuda:0", Policy()) == 50_000_000
    assert program_gap_ns({"program_gap": dict(ok, host_us=-5)}, "cuda:0", Policy()) == 0
    assert program_gap_ns({"program_gap": dict(ok, host_us="x")}, "cuda:0", Policy()) == 0
    assert program_gap_ns({}, "cuda:0", Policy()) == 0


class _Clock:
    """A fake perf_counter_ns that the fake graph and program advance: the gap measured exactly."""

    def __init__(self):
        self.t = 0

    def __call__(self) -> int:
        return self.t


def test_the_watch_measures_from_a_calls_end_to_the_next_calls_start(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(gaps, "_perf_ns", clock)
    w = gaps.GapWatch()

    def graph(args):  # 5 ms inside the call
        clock.t += 5_000_000
        return args

    f = w.wrap("k", "cpu", graph)
    for _ in range(gaps.SKIP + 12):
        assert f([1]) == [1]
        clock.t += 1_000_000  # 1 ms of the program's own host time between calls
    r = w.result("k")
    assert r["calls"] == gaps.SKIP + 12 and r["gaps"] == 12 and r["host_us"] == r["q1_us"] == r["q3_us"] == 1000.0


def test_the_watch_never_breaks_a_call_and_passes_its_result_and_errors_through():
    w = gaps.GapWatch()
    f = w.wrap("k", "cpu", lambda args: [a * 2 for a in args])
    for _ in range(gaps.SKIP + 12):
        assert f([1, 2]) == [2, 4]

    def boom(args):
        raise ValueError("the graph's own error")

    b = w.wrap("b", "cpu", boom)
    with pytest.raises(ValueError, match="own error"):
        b([])
    r = w.result("k")
    assert r["calls"] == gaps.SKIP + 12 and r["gaps"] == 12 and r["interleaved"] == 0
    assert w.result("b")["calls"] == 1 and w.result("missing") is None


def test_calls_from_two_threads_leave_the_gap_unusable():
    import threading

    w = gaps.GapWatch()
    f = w.wrap("k", "cuda:0", lambda args: args)
    for _ in range(gaps.SKIP + 10):
        f([])
    t = threading.Thread(target=lambda: [f([]) for _ in range(3)])
    t.start()
    t.join()
    r = w.result("k")
    assert r["threads"] == 2 and r["usable"] is False and "several threads" in r["why"]


def test_the_worker_spends_the_gap_its_request_names_before_every_timed_call_of_every_role(tmp_path):
    from tilesmith.gate.worker import sample, setup
    from tilesmith.gate.worker.state import State

    st = State()
    st.data = SimpleNamespace(meta={"inputs": [{"kind": "tensor"}]})
    st.fns = {r: (lambda args: (args[0] + 1,)) for r in ("candidate", "baseline")}
    sets = tmp_path / "sets.pt"
    torch.save({"inputs": [[torch.ones(4)], [torch.zeros(4)]]}, sets)
    gap, reps = 3_000_000, 4
    for role in ("candidate", "baseline"):
        setup.op_time_setup(st, {"sets_file": str(sets), "roles": [role], "mode": "launch", "buffers": 2})
        ns = sample.op_time(st, {"role": role, "reps": reps, "start": 0, "gap_ns": gap})["ns"]
        assert ns >= reps * gap  # a busy wait of at least `gap` before each call, inside the timed window
    assert sample.clock.MAX_GAP_NS == 50_000_000  # the parent's cap (gate.timed.program_gap_ns) is the worker's


def test_the_warm_up_request_finishes_its_device_work_before_it_replies(tmp_path, monkeypatch):
    """Left queued, the warm-up's device work ran in the sample's request before its window, and the parent's span
    from the request to the window (gate/windows.py) held it: on the H200 a real win was
    rejected as work done off the clock (its windows opened 887 us after their requests)."""
    from tilesmith.gate.worker import sample, setup
    from tilesmith.gate.worker.state import State

    events = []
    monkeypatch.setattr(sample, "_device_sync", lambda: events.append("sync"))
    st = State()
    st.data = SimpleNamespace(meta={"inputs": [{"kind": "tensor"}]})
    st.fns = {"candidate": lambda args: (events.append("call"), (args[0] + 1,))[1]}
    sets = tmp_path / "sets.pt"
    torch.save({"inputs": [[torch.ones(4)], [torch.zeros(4)]]}, sets)
    setup.op_time_setup(st, {"sets_file": str(sets), "roles": ["candidate"], "mode": "launch", "buffers": 2})
    events.clear()
    assert sample.op_warm(st, {"role": "candidate", "reps": 6, "start": 0}) == {}
    assert events == ["call"] * 3 + ["sync"]  # half a sample's calls, then the device caught up


def test_a_sample_shorter_than_the_gap_it_had_to_spend_is_forged():
    """A candidate that skips its own wait (in-process tampering with the worker) cannot gain by it: the parent
    knows how much host time each sample had to spend, and measures the window itself."""
    from tilesmith.gate.timing import _sample

    class Worker:  # answers every time request at once: a window of well under a millisecond
        marks = None

        def request(self, msg, timeout_s, read=None):
            return {"ns": 1}

    s, bad, _ = _sample(Worker(), {"op": "time", "role": "candidate", "reps": 4, "gap_ns": 1_000_000}, 5.0)
    assert s is None and bad.code == "timing-forged" and "skipped" in bad.message
    s, bad, _ = _sample(Worker(), {"op": "time", "role": "candidate", "reps": 4}, 5.0)
    assert s.ns > 0 and bad is None


class _Event:
    def __init__(self, name: str, device: bool = False, ns: int = 0):
        from torch.autograd import DeviceType

        self._name, self._dev, self._ns = name, DeviceType.CUDA if device else DeviceType.CPU, ns

    def name(self):
        return self._name

    def device_type(self):
        return self._dev

    def duration_ns(self):
        return self._ns


def _fake_profiler(monkeypatch, windows: list[list]):
    """torch.profiler.profile as a stand-in whose n-th window shows windows[n]'s events (no CUDA here)."""
    made = []

    class Profile:
        def __init__(self, activities=None):
            self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: windows[len(made) - 1]))
            made.append(self)

        def start(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.profiler, "profile", Profile)
    return made


def test_profiled_gaps_count_the_programs_waits_beyond_what_an_empty_window_shows(monkeypatch):
    """On the H200 a gap with nothing in it showed two waits (the closing sync, seen by the runtime and the
    driver): the count is taken against an empty window's, so a clean program is not mistaken for one that
    waits, and one that does (.item(), a synchronize) still is."""
    ours = [_Event("cudaDeviceSynchronize"), _Event("cuCtxSynchronize")]
    clean = ours + [_Event("cudaGetDevice")]
    item = ours + [_Event("cudaMemcpyAsync"), _Event("cudaStreamSynchronize")]

    def run(gap_windows):
        made = _fake_profiler(monkeypatch, [ours] + gap_windows)
        w = gaps.GapWatch()
        f = w.wrap("k", "cuda:0", lambda args: args)
        for _ in range(30):
            f([])
        assert len(made) == 1 + len(gaps.PROFILE_AFTER)  # the empty window once, then each profiled gap
        return w.result("k")

    ok = run([clean, clean, clean])
    assert ok["usable"] is True and [o["syncs"] for o in ok["profiled"]] == [0, 0, 0], ok
    waits = run([clean, item, clean])
    assert waits["usable"] is False and "waits for the GPU" in waits["why"]
    assert "cudaStreamSynchronize" in waits["profiled"][1]["waits"]
    work = run([clean, clean, ours + [_Event("triton_poi_add", device=True, ns=4000)]])
    assert work["usable"] is False and "GPU work of its own" in work["why"] and work["profiled"][2]["device_us"] == 4.0
    blind = _fake_profiler(monkeypatch, [[], [], [], []])  # a profile that shows no runtime calls at all
    w = gaps.GapWatch()
    f = w.wrap("k", "cuda:0", lambda args: args)
    for _ in range(30):
        f([])
    assert len(blind) == 4 and "does not show the CUDA runtime" in w.result("k")["why"]


def test_the_worker_marks_each_window_on_a_timestamped_socket_and_sees_the_socket_pointed_elsewhere(tmp_path, monkeypatch):
    """gate/worker/sample.py op_time sends a mark as the window opens and as it closes; the kernel's send times span the
    reported sample (marksock.pair). A call that points the socket's descriptor elsewhere (os.dup2), as a cheat
    sending its own closing mark would, makes the sample timing-forged."""
    from tilesmith.errors import TilesmithError
    from tilesmith.gate import marksock, proc
    from tilesmith.gate.worker import sample, setup
    from tilesmith.gate.worker.state import State

    ours, theirs = marksock.pair()
    if ours is None:
        pytest.skip("no timestamped datagram sockets here")
    st_ = os.fstat(theirs.fileno())
    monkeypatch.setattr(sample, "_MARK_FD", theirs.fileno())
    monkeypatch.setattr(sample, "_MARK_ID", (st_.st_dev, st_.st_ino))
    redirect = {"armed": False, "saved": None}

    def fn(args):
        if redirect["armed"] and redirect["saved"] is None:  # from here the real closing mark would go nowhere
            null = os.open(os.devnull, os.O_WRONLY)
            redirect["saved"] = os.dup(theirs.fileno())
            os.dup2(null, theirs.fileno())
            os.close(null)
        return (args[0] + 1,)

    st = State()
    st.data = SimpleNamespace(meta={"inputs": [{"kind": "tensor"}]})
    st.fns = {"candidate": fn}
    sets = tmp_path / "sets.pt"
    torch.save({"inputs": [[torch.ones(4)], [torch.zeros(4)]]}, sets)
    setup.op_time_setup(st, {"sets_file": str(sets), "roles": ["candidate"], "mode": "launch", "buffers": 2})
    w = SimpleNamespace(_marks_sock=ours)
    proc.Worker._drain_marks(w)  # nothing sent yet
    ns = sample.op_time(st, {"role": "candidate", "reps": 4, "start": 0})["ns"]
    marks = proc.Worker._drain_marks(w)
    assert len(marks) == 2 and min(marks) > 0 and marks[1] - marks[0] >= ns > 0
    redirect["armed"] = True
    with pytest.raises(TilesmithError) as e:
        sample.op_time(st, {"role": "candidate", "reps": 4, "start": 0})
    assert e.value.code == "timing-forged" and "pointed elsewhere" in str(e.value)
    os.dup2(redirect["saved"], theirs.fileno())  # put the socket back for the cleanup
    os.close(redirect["saved"])
    ours.close()
    theirs.close()
