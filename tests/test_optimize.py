"""The optimize driver and the tuner on CPU with real captures, the real gate and real workers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tilesmith import optimize as opt
from tilesmith import paths
from tilesmith import runs
from tilesmith import workspace as wsmod
from tilesmith.errors import TilesmithError
from tilesmith.install import install
from tilesmith.search import kernels as K
from tilesmith.search import Candidate, from_generator
from tilesmith_cli.app import app

runner = CliRunner()
# Seconds of timing per gate pass: a decided case stops early; 4 s left a genuine ~1.5x win undecided now
# that the original and the candidate are timed in two processes (more noise between them), and on CI's
# loaded 2-core machine 10 s once left the confirmation of a ~1.3x win short.
FAST_GATE = dict(gate_time_budget_s=20.0)
# A genuine win is offered up to this many times where the test is about something other than the gate's
# power (measured by benchmarks/gate_calibration.py): one miss on a shared machine must not fail CI.
TRIES = 3


def _serial(text: str) -> str:
    """The captured wrapper with every OpenMP region cut to the usable cores (a genuine win here)."""
    header, src = text.split(wsmod_header_end(), 1)
    for k in K.find_kernels(src):
        labels = dict(K.cpp_variants(k))
        if labels:
            src = K.replace_kernel(src, k, labels["num_threads=1"])
    return header + wsmod_header_end() + src


def wsmod_header_end() -> str:
    from tilesmith.source import HEADER_END

    return HEADER_END + "\n"


def _scripted(texts_and_labels):
    """An optimizer that proposes fixed sources in order and records the verdicts it is sent. A label
    ending in '+' is a genuine win: proposed again (up to TRIES times) until it is accepted."""
    seen = []

    def propose(track, settings):
        for text, label in texts_and_labels:
            for _ in range(TRIES if label.endswith("+") else 1):
                verdict = yield Candidate(text(track), label)
                seen.append(verdict)
                if verdict["accepted"]:
                    break

    return from_generator(propose), seen


def _why(seen) -> str:
    return "; ".join(f"{v['accepted']} {v['stage']} {[r['code'] + ': ' + r['message'] for r in v['reasons']]}"
                     for v in seen)


def _nothing_to_try(track, settings):
    yield from ()


def test_loops_need_confirmed_wins_and_a_rejected_candidate_keeps_the_same_loop_going(oversub_ws):
    scripted, seen = _scripted([(lambda t: t.best_text, "the original again"),
                               (lambda t: _serial(t.best_text), "serial OpenMP regions+"),
                               (lambda t: t.best_text, "the accepted source once more")])
    r = opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner", loops=2, **FAST_GATE), optimizer=scripted)
    (t,) = r.tracks
    misses = len(seen) - 3  # the genuine win's rejected tries
    assert [v["accepted"] for v in seen] == [False] + [False] * misses + [True, False], _why(seen)
    assert seen[0]["stage"] == "timing" and seen[0]["reasons"][0]["code"] == "not-faster"
    # loop 2 is timed against the best so far: the accepted source again is not an improvement
    track = runs.track_dir(r.run_id, t.key)
    assert seen[0]["timing_baseline_sha256"] is None
    assert seen[-1]["timing_baseline_sha256"] == runs.sha256_file(track / "best.py")
    assert seen[-1]["stage"] == "timing" and seen[-1]["reasons"][0]["code"] == "not-faster", _why(seen)
    # then nothing was left to try: one confirmed loop, and the run says why it stopped
    assert t.loops_done == 1 and t.status == "done" and t.candidates == len(seen)
    assert sum(t.rejected_by_stage.values()) == len(seen) - 1 and t.rejected_by_stage["timing"] >= 2
    assert t.speedup > 1.02 and t.speedup_low > 1.02
    assert sorted(p.name for p in (track / "attempts").iterdir()) == [f"attempt_0{i}.py" for i in range(len(seen))]
    assert len(list((track / "profiles").glob("verdict_*.json"))) == len(seen)
    base = json.loads((track / "profiles" / "baseline.json").read_text())
    assert base["kernels"] and base["phases_s"]["batch_graphs"] == 1 and base["phases_s"]["batch_wall_s"] > 0
    best = json.loads((track / "best.json").read_text())
    assert best["verdict"]["accepted"] and best["sha256"] == runs.sha256_file(track / "best.py")
    run = runs.load_run(r.run_id)
    assert run.status == "complete" and run.graphs[t.key]["loops_done"] == 1

    # installed with these settings, the same settings are an exact hit: no optimizer runs again
    assert [g.status for g in install(r.run_id).graphs] == ["installed"]
    def never(track, settings, submit, *, loops_done=0):
        pytest.fail("an exact hit must not optimize")

    again = opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner", loops=2, **FAST_GATE), optimizer=never)
    assert again.tracks[0].status == "cached"
    cache = json.loads((runs.track_dir(again.run_id, t.key) / "cache.json").read_text())
    assert cache["from_run"] == r.run_id


def test_max_minutes_stops_cleanly_and_resume_carries_on(oversub_ws):
    scripted, seen = _scripted([(lambda t: _serial(t.best_text), "serial+")])
    r = opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner", max_minutes=1e-6, **FAST_GATE), optimizer=scripted)
    assert r.status == "interrupted" and r.tracks[0].status == "pending" and not seen
    # the budget was spent before the graph's baseline profile (a worker process each): none was made,
    # and the track says why it never started
    assert not (runs.track_dir(r.run_id, r.tracks[0].key) / "profiles" / "baseline.json").exists()
    assert "--max-minutes" in r.tracks[0].reason and f"--resume {r.run_id}" in r.tracks[0].reason
    resumed = opt.optimize(resume=r.run_id, optimizer=scripted)
    assert resumed.run_id == r.run_id and resumed.status == "complete"
    assert resumed.tracks[0].loops_done == 1, _why(seen)
    assert (runs.track_dir(r.run_id, r.tracks[0].key) / "profiles" / "baseline.json").exists()
    # the last loop's accepted verdict ends the track (not sent back); `seen` holds only the misses
    assert resumed.tracks[0].candidates == len(seen) + 1 and not any(v["accepted"] for v in seen)
    assert runs.load_run(r.run_id).status == "complete"


def test_graphs_option_selects_by_key_prefix_and_refuses_ineligible_or_unknown(training_ws):
    ws = wsmod.load(training_ws)
    chosen = ws.graphs[0].key
    scripted, seen = _scripted([])
    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", graphs=[chosen[:10]]), optimizer=scripted)
    assert [t.key for t in r.tracks] == [chosen] and r.tracks[0].status == "exhausted"
    with pytest.raises(TilesmithError, match="matches 0 graphs"):
        opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", graphs=["ffffffffff"]))


def test_every_graph_gets_its_baseline_profile_and_the_biggest_goes_first(training_ws):
    from tilesmith.search import from_generator

    order = []

    def note_order(track, settings):
        order.append(track.key)
        yield from ()

    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner"), optimizer=from_generator(note_order))
    assert sorted(order) == sorted(t.key for t in r.tracks) and len(order) >= 2
    share = {}
    seen = {g.key: g.seen for g in wsmod.load(training_ws).graphs}
    for t in r.tracks:  # forwards and backwards, profiled in one worker process
        p = json.loads((runs.track_dir(r.run_id, t.key) / "profiles" / "baseline.json").read_text())
        assert p["kernels"] and p["key"] == t.key
        share[t.key] = p["wall_ms"] * seen[t.key]
    assert order == sorted(share, key=lambda k: -share[k])


def _accepting(calls: list):
    """An optimizer whose every candidate is accepted (the gate stubbed: `_submit` below), recording each
    call as (graph key, loops done when it was called, the loops it was asked for)."""
    def run(track, settings, submit, *, loops_done=0):
        calls.append((track.key, loops_done, settings.loops))
        while loops_done < settings.loops:
            loops_done += bool(submit(Candidate(track.best_text, "same code"))["accepted"])
        return "done", ""

    return run


def _accept_all(monkeypatch):
    def submit(r, g, t, track, cand):
        t.loops_done += 1
        t.candidates += 1
        return {"accepted": True}

    monkeypatch.setattr(opt, "_submit", submit)


def test_under_a_time_limit_every_graph_gets_its_first_win_before_any_graph_its_second(training_ws, monkeypatch):
    """On the H200 a training step's backward spent a 4-minute budget on its second loop and the step's three
    other graphs never started: with --max-minutes, a first pass takes one loop per graph, biggest first, and
    a second pass the loops left."""
    _accept_all(monkeypatch)
    calls: list = []
    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", loops=2, max_minutes=30), optimizer=_accepting(calls))
    keys = [k for k, _, _ in calls[:4]]
    assert len(calls) == 8 and len(set(keys)) == 4, calls
    assert [(done, asked) for _, done, asked in calls] == [(0, 1)] * 4 + [(1, 2)] * 4
    assert [k for k, _, _ in calls[4:]] == keys  # the second pass in the same order, biggest first
    assert r.status == "complete" and all(t.status == "done" and t.loops_done == 2 for t in r.tracks)
    # Without a time limit every graph gets all its loops in turn (nothing can be left out).
    calls.clear()
    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", loops=2), optimizer=_accepting(calls))
    assert [(done, asked) for _, done, asked in calls] == [(0, 2)] * 4 and r.status == "complete"


def test_a_graph_that_found_nothing_in_the_first_pass_is_not_tried_again(training_ws, monkeypatch):
    _accept_all(monkeypatch)
    calls: list = []
    accepting = _accepting(calls)

    def first_finds_nothing(track, settings, submit, *, loops_done=0):
        if not calls:  # the biggest graph: nothing to try
            calls.append((track.key, loops_done, settings.loops))
            return "exhausted", "the optimizer has nothing more to try"
        return accepting(track, settings, submit, loops_done=loops_done)

    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", loops=2, max_minutes=30),
                     optimizer=first_finds_nothing)
    assert len(calls) == 7 and calls[0][0] not in [k for k, _, _ in calls[1:]], calls
    assert sorted(t.status for t in r.tracks) == ["done", "done", "done", "exhausted"]


def test_a_cuda_graph_compiled_graph_is_credited_against_the_gates_replay_of_the_original_not_the_profile():
    def verdict(mode, base, cand):
        timing = {"speedup": base / cand, "speedup_low": base / cand * 0.9, "speedup_high": base / cand * 1.1,
                  "mode": mode, "samples": 20, "baseline_ms": base, "candidate_ms": cand}
        return {"accepted": True, "first": {"timing": timing}, "confirmation": {"timing": timing}}

    # reduce-overhead: the profile timed plain launches (0.9 ms); the gate timed Inductor's replay (0.2 ms)
    t = opt.TrackResult(key="k", kind="inference", baseline_ms=0.9)
    opt._credit(t, verdict("graph", 0.2, 0.16), loop=1)
    assert t.baseline_ms == 0.2 and abs(t.speedup - 1.25) < 1e-9 and abs(t.best_ms - 0.16) < 1e-9
    opt._credit(t, verdict("graph", 0.16, 0.08), loop=2)  # loop 2 is timed against the best: chained
    assert t.baseline_ms == 0.2 and abs(t.speedup - 2.5) < 1e-9 and abs(t.best_ms - 0.08) < 1e-9
    # plain launches: the profile is what production runs, and stays the baseline
    t = opt.TrackResult(key="k", kind="inference", baseline_ms=0.9)
    opt._credit(t, verdict("launch", 0.8, 0.4), loop=1)
    assert t.baseline_ms == 0.9 and abs(t.best_ms - 0.45) < 1e-9


def test_attempts_keep_the_five_most_recent_sources_in_order():
    for i in range(7):
        runs.push_attempt("r1", "k" * 64, f"source {i}\n")
    d = runs.track_dir("r1", "k" * 64) / "attempts"
    assert [p.read_text() for p in sorted(d.iterdir())] == [f"source {i}\n" for i in range(2, 7)]


def test_cpp_variants_rewrite_only_the_openmp_thread_count_of_real_captured_kernels(training_ws):
    ws = wsmod.load(training_ws)
    src = (ws.graph_dir(ws.graphs[0].key) / "wrapper.py").read_text()
    ks = K.find_kernels(src)
    assert ks and all(k.kind == "cpp" and k.name.startswith("cpp_fused") for k in ks)
    k = next(k for k in ks if k.params["parallel_regions"])
    for label, code in K.cpp_variants(k, cpu_count=8):
        n = label.split("=")[1]
        assert code.replace(f"#pragma omp parallel num_threads({n})", "#pragma omp parallel") == k.code
        new = K.replace_kernel(src, k, code)
        compile(new, "wrapper", "exec")
        assert [x.code for x in K.find_kernels(new) if x.name == k.name] == [code]
    assert [lab for lab, _ in K.cpp_variants(k, cpu_count=8)] == ["num_threads=1", "num_threads=2", "num_threads=4"]


TRITON_KERNEL = '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 512, 'r0_': 128},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr2': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32), 'constants': {}, 'configs': [{(0,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__softmax_0', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'num_load': 1, 'num_reduction': 2, 'backend_hash': 'ABC', 'are_deterministic_algorithms_enabled': False}
)
@triton.jit
def triton_per_fused__softmax_0(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 512
    r0_numel = 128
    R0_BLOCK: tl.constexpr = 128
    xoffset = tl.program_id(0) * XBLOCK
'''


def test_triton_variants_replace_the_heuristic_with_fixed_configs_the_kernel_allows():
    src = f"triton_per_fused__softmax_0 = async_compile.triton('triton_per_fused__softmax_0', '''{TRITON_KERNEL}''', device_str='cuda')\n"
    (k,) = K.find_kernels(src)
    assert k.kind == "triton" and k.params == {"heuristic": "persistent_reduction", "size_hints": {"x": 512, "r0_": 128},
                                               "blocks": ["XBLOCK"]}
    vs = K.triton_variants(k)
    assert vs and all(code.count("@triton_heuristics.fixed_config(") == 1 for _, code in vs)
    xblocks = {int(lab.split(",")[0].split("=")[1]) for lab, _ in vs}
    assert xblocks <= {1, 2, 4, 8, 16, 32, 64} and max(xblocks) * 128 <= 8192
    label, code = vs[0]
    assert "persistent_reduction(" not in code and "'kernel_name': 'triton_per_fused__softmax_0'" in code
    compile(K.replace_kernel(src, k, code), "wrapper", "exec")


def test_optimize_cli_without_a_workspace_is_a_clear_error(tmp_path):
    r = runner.invoke(app, ["optimize", "-w", str(tmp_path / "none")])
    assert r.exit_code == 1 and "no workspace" in r.stderr and "tilesmith capture" in r.stderr
    r = runner.invoke(app, ["optimize", "-w", str(tmp_path), "--optimizer", "magic"])
    assert r.exit_code == 1 and "unknown optimizer" in r.stderr


def test_agent_without_a_model_is_an_error_before_any_run_starts(training_ws, monkeypatch, tilesmith_home):
    monkeypatch.delenv("TILESMITH_MODEL", raising=False)
    r = runner.invoke(app, ["optimize", "-w", str(training_ws), "--optimizer", "agent"])
    assert r.exit_code == 1 and "needs a model" in r.stderr and "--optimizer tuner" in r.stderr
    assert not (tilesmith_home / "runs").exists()


def test_ctrl_c_keeps_the_confirmed_win_marks_the_run_interrupted_and_resume_finishes(oversub_ws):
    def propose(track, settings):
        for _ in range(TRIES):
            if (yield Candidate(_serial(track.best_text), "serial"))["accepted"]:
                break
        raise KeyboardInterrupt  # the user presses Ctrl-C while loop 2 is being searched

    with pytest.raises(KeyboardInterrupt):
        opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner", loops=2, **FAST_GATE),
                     optimizer=from_generator(propose))
    (rid,) = [p.name for p in paths.runs_dir().iterdir()]
    run = runs.load_run(rid)
    (t,) = run.graphs.values()
    assert run.status == "interrupted" and t["status"] == "interrupted" and t["loops_done"] == 1
    assert json.loads((runs.track_dir(rid, t["key"]) / "best.json").read_text())["verdict"]["accepted"]
    resumed = opt.optimize(resume=rid, optimizer=from_generator(_nothing_to_try))
    assert resumed.status == "complete" and resumed.tracks[0].loops_done == 1 and resumed.tracks[0].status == "done"



def test_a_ctrl_c_whose_keyboard_interrupt_is_swallowed_still_stops_the_run_and_marks_it_interrupted(oversub_ws):
    import signal

    def propose(track, settings):
        try:  # a real SIGINT, whose KeyboardInterrupt a library swallows (mpmath's bare except around `import gmpy`)
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        yield Candidate(_serial(track.best_text), "proposed after the Ctrl-C")

    # Python's own handler, as `tilesmith optimize` has it (a pytest-xdist worker runs with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner", **FAST_GATE),
                         optimizer=from_generator(propose))
    finally:
        signal.signal(signal.SIGINT, previous)
    (rid,) = [p.name for p in paths.runs_dir().iterdir()]
    run = runs.load_run(rid)
    (t,) = run.graphs.values()
    assert run.status == "interrupted" and t["status"] == "interrupted" and t["candidates"] == 0, (run.status, t)

def test_jobs_runs_graphs_concurrently_and_every_track_ends(training_ws):
    import threading

    # Each track's optimizer waits for a second one to be running: only tracks run two at a time pass
    # (one at a time, the first wait breaks the barrier and every track fails with the reason).
    meet = threading.Barrier(2, timeout=120)

    def paired(track, settings, submit, *, loops_done=0):
        meet.wait()
        return "exhausted", "met another track"

    r = opt.optimize(training_ws, opt.OptimizeSettings(optimizer="tuner", jobs=2), optimizer=paired)
    assert r.status == "complete" and len(r.tracks) == 4
    assert all(t.status == "exhausted" and t.reason == "met another track" and t.baseline_ms for t in r.tracks), r.tracks


def test_a_failed_baseline_profile_and_failed_screens_are_named_in_the_track(oversub_ws, monkeypatch):
    """A track whose profile and every screen failed used to end as 'exhausted: nothing more to try' with
    no baseline and no word why (the H200's forked CUDA workers): it fails, and the reasons are kept."""
    from tilesmith.profile import baseline as profile

    monkeypatch.setattr(profile, "profile_graphs", lambda dirs, **kw: [TilesmithError(
        "profiling abc failed: RuntimeError: CUDA driver initialization failed", code="profile-failed")] * len(dirs))

    def screens_fail(track, settings):
        assert track.profile is None
        track.record({"kernel": "(whole call)", "variant": "v", "median_ms": None, "samples": 0,
                      "error": "worker failed: boom"})
        track.record({"kernel": "(whole graph)", "variant": "skipped", "median_ms": None,  # not screened
                      "error": "Inductor generated the same wrapper as the current code"})
        yield from ()

    r = opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner"), optimizer=from_generator(screens_fail))
    t = r.tracks[0]
    assert t.status == "failed" and r.failed() == [t] and t.baseline_ms is None
    assert "CUDA driver initialization failed" in t.profile_error
    assert "all 1 screened variants failed to run, the first: worker failed: boom" in t.reason
    assert "the baseline profile failed: profiling abc failed" in t.reason
    saved = json.loads((runs.track_dir(r.run_id, t.key).parent / "run.json").read_text())["graphs"][t.key]
    assert saved["reason"] == t.reason and saved["profile_error"] == t.profile_error


def test_no_decision_starts_after_the_budget_ran_out_while_a_candidate_was_proposed():
    """A screen can take minutes on a GPU: a candidate proposed past --max-minutes is not judged."""
    from tilesmith.search import drive

    class Clock:
        late = False

        def expired(self):
            return self.late

    clock, judged = Clock(), []

    def propose():
        clock.late = True  # the proposal (screens) ran past the budget
        yield Candidate("text", "late")

    assert drive(propose(), clock, 1, lambda c: judged.append(c) or {"accepted": True}) == ("interrupted", "")
    assert judged == []


def test_an_optimizer_that_stops_at_the_time_limit_leaves_its_track_interrupted_not_exhausted():
    """The tuner returns when track.expired(): that is the budget's end, not "nothing more to try" (GPT-2
    under reduce-overhead on the H200, session 14, read as exhausted with a screened win never judged)."""
    from tilesmith.search import drive

    class Clock:
        late = False

        def expired(self):
            return self.late

    clock = Clock()

    def propose():
        verdict = yield Candidate("a", "first")
        assert verdict == {"accepted": False}
        clock.late = True  # the next screens ran past the budget: the generator gives up
        return

    assert drive(propose(), clock, 1, lambda c: {"accepted": False}) == ("interrupted", "")

    def runs_dry():
        yield Candidate("a", "only")

    assert drive(runs_dry(), Clock(), 1, lambda c: {"accepted": False}) == (
        "exhausted", "the optimizer has nothing more to try")


def test_submit_judges_nothing_once_the_budget_is_spent_whichever_optimizer_asks(oversub_ws):
    """The agent's warm start and gate node call submit themselves (not through drive): the budget check
    is in the one place every decision passes."""
    seen = []

    def late_submitter(track, settings, submit, *, loops_done=0):
        track._stop.set()  # the budget (or Ctrl-C) ends while the optimizer is still working
        seen.append(submit(Candidate(track.best_text, "late")))
        return "interrupted", ""

    r = opt.optimize(oversub_ws, opt.OptimizeSettings(optimizer="tuner"), optimizer=late_submitter)
    (v,) = seen
    assert v["accepted"] is False and v["stage"] == "budget" and "--resume" in v["reasons"][0]["message"]
    t = r.tracks[0]
    assert t.candidates == 0 and not list((runs.track_dir(r.run_id, t.key) / "profiles").glob("verdict_*.json"))


@pytest.mark.parametrize("broken", ["wrapper.py", "graph.json"])
def test_optimize_cli_exits_1_and_names_a_graph_that_failed_for_another_reason_than_no_faster_candidate(
        oversub_ws, tmp_path, broken):
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(oversub_ws, ws)
    (gdir,) = (ws / "graphs").iterdir()
    f = gdir / broken
    f.write_text(f.read_text() + "\nthis is not (" if broken == "wrapper.py" else "{not json")
    r = runner.invoke(app, ["optimize", "-w", str(ws)], env={"COLUMNS": "40"})  # piped: the key stays whole anyway
    assert r.exit_code == 1, r.output
    assert f"│ {gdir.name[:12]} │" in r.stdout and "│ failed " in r.stdout and "next: tilesmith report" in r.stdout
    assert "1 graph(s) failed, not for want of a faster candidate" in r.stderr
    why = "SyntaxError" if broken == "wrapper.py" else "graph.json is corrupt"
    assert f"  {gdir.name[:12]}: " in r.stderr and why in r.stderr.split("failed, not for want")[1], r.stderr
    r = runner.invoke(app, ["optimize", "-w", str(ws), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["tracks"][0]["status"] == "failed"


def test_optimize_cli_stopped_by_max_minutes_says_interrupted_and_how_to_resume(oversub_ws):
    r = runner.invoke(app, ["optimize", "-w", str(oversub_ws), "--max-minutes", "0.000001"])
    (rid,) = [p.name for p in paths.runs_dir().iterdir()]
    assert r.exit_code == 0, r.output
    assert f"run {rid} (interrupted)" in r.stdout and "│ pending " in r.stdout
    assert "interrupted: the time limit (--max-minutes)" in r.stderr
    assert f"`tilesmith optimize --resume {rid}` carries on" in r.stderr


@pytest.mark.slow
def test_optimize_cli_after_ctrl_c_exits_130_and_names_the_command_that_resumes_the_run(oversub_ws):
    import signal
    import subprocess
    import sys

    def as_a_shell_starts_it():
        # A shell starts a foreground command with SIGINT at its default and unblocked; a child inherits an ignored
        # or blocked one from the test process, whatever an earlier test in it left (twice in a full `make test`,
        # never alone, the command ran to its end through the Ctrl-C and exited 0).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    p = subprocess.Popen([sys.executable, "-m", "tilesmith_cli.app", "optimize", "-w", str(oversub_ws)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_a_shell_starts_it)
    seen = []  # until "run RID: 1 graph(s)": the run exists, its graph is being profiled (a warning may come first)
    while not (seen and seen[-1].startswith("run ")):
        seen.append(p.stderr.readline())
        assert seen[-1] and len(seen) < 50, "".join(seen)
    first = seen[-1]
    rid = first.split()[1].rstrip(":")
    with open(f"/proc/{p.pid}/status") as f:  # what the command does with SIGINT, for the message below
        state = "".join(line for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    mine = "".join(line for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn")))
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, f"{first}{err}\nthe command's signal state:\n{state}the test process's:\n{mine}"
    assert f"interrupted: what was confirmed is saved; `tilesmith optimize --resume {rid}` carries on" in err, err
    assert runs.load_run(rid).status == "interrupted"
