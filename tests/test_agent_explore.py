"""The agent's fast inner loop and exploration, driven by a scripted model through the real Deep Agent
stack, the real optimize driver and the real gate: ideas assign attempt files, two subagents work on
their own files in parallel and check them, the main agent screens them and runs the kernel harness in
the shell, and the host judges the faster one; a failed check keeps a file from the gate; `finish`
ends the track; the tuner's warm start comes first."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

pytest.importorskip("deepagents")

from tests import agent_helpers as H  # noqa: E402
from tests.agent_helpers import Script  # noqa: E402
from tests.fakes.chat import ScriptedChatModel, ai, first_human, tc, text  # noqa: E402
from tilesmith import runs, store  # noqa: E402
from tilesmith.optimize import OptimizeSettings, optimize  # noqa: E402
from tilesmith.search.agent.provider import register_model  # noqa: E402


@pytest.fixture
def slow_ws(two_matmuls_ws):
    return two_matmuls_ws


def _original(ws) -> str:
    (g,) = sorted((ws / "graphs").iterdir())
    return (g / "wrapper.py").read_text()


def _files(messages) -> list[str]:
    """This turn's attempt files, as the host's latest message names them."""
    human = [text(m) for m in messages if m.type == "human"][-1]
    return re.findall(r"/attempts/turn_\d{3}_[a-h]\.py", human.split("This turn's attempt files:")[1].split("each a copy")[0])




def _run(ws, name, script, **settings):
    model = ScriptedChatModel(reply=script)
    register_model(name, lambda: model)
    try:
        s = OptimizeSettings(optimizer="agent", model=name, **{"gate_time_budget_s": 1.0, "warm_start": False, **settings})
        return optimize(ws, s), model
    finally:
        register_model(name, None)


def _implementer(sources: dict):
    """A subagent implementing its idea: the task names the file and the source to put there."""

    def sub(messages):
        task = first_human(messages)
        file, name = re.search(r"on (/attempts/\S+\.py) \((\w+)\)", task).groups()
        n_ai = sum(1 for m in messages if m.type == "ai")
        if n_ai == 0:
            return ai("", tc("write_file", file_path=f"/scratch/{name}.py", content=sources[name]))
        if n_ai == 1:
            return ai("", tc("execute", command=f"cp scratch/{name}.py .{file}"))
        if n_ai == 2:
            return ai("", tc("check", path=file))
        return ai(f"SUBREPORT {file}: {text(messages[-1])[:300]}")
    return sub


def test_two_subagents_on_their_own_attempts_and_the_faster_one_is_judged(slow_ws, monkeypatch):
    # One thread per pool in the workers: on a busy 2-core machine an OpenMP kernel and MKL timed in one
    # process spin against each other and swamp every difference (as in test_agent_tracks.py).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    original = _original(slow_ws)
    sources = {"extern": H.all_extern(original),  # two library matmuls: far faster than the scalar loops
               "same": original.replace("async_compile.wait(globals())",
                                        "async_compile.wait(globals())\n# loop order kept: no faster")}
    ideas = [{"idea": "two extern mm calls instead of the scalar loop kernel", "max_gain": 20.0,
              "why": "4 MFLOP at the measured fp32 matmul rate is microseconds; the loops take ~1 ms"},
             {"idea": "reorder the loops of the fused kernel", "max_gain": 1.5, "why": "better locality"},
             {"idea": "fewer threads for the small kernel", "max_gain": 1.05, "why": "OpenMP overhead"}]
    script = Script([
        ai("", tc("ideas", ideas=ideas)),
        lambda ms: ai("", tc("task", description=f"SUBTASK implement on {_files(ms)[0]} (extern)", subagent_type="implementer"),
                      tc("task", description=f"SUBTASK implement on {_files(ms)[1]} (same)", subagent_type="implementer")),
        lambda ms: ai("", tc("screen", paths=_files(ms)[:2])),
        lambda ms: ai("", tc("execute", command=f"python -m tilesmith.search.kernel_bench .{_files(ms)[0]} --calls 3")),
        ai("Two attempts ready: the extern mm one screened faster."),
    ], sub=_implementer(sources))
    # 8 s of timing, not 1: the gate stops as soon as a win is clear, but beside another test suite a 5.1x win read a
    # lower bound of 0.95x after 20 paired samples, and the track then had nothing accepted.
    result, model = _run(slow_ws, "scripted-explore", script, gate_time_budget_s=8.0)
    (t,) = result.tracks
    assert (t.status, t.loops_done, t.candidates) == ("done", 1, 1), t.reason
    tdir = runs.track_dir(result.run_id, t.key)
    a, b, c = (tdir / "attempts" / f"turn_001_{x}.py" for x in "abc")
    assert a.read_text() == sources["extern"] and b.read_text() == sources["same"] and c.read_text() == original

    # the host screened both changed files and judged the faster: the extern one
    loop = [json.loads(line) for line in (tdir / "profiles" / "loop.jsonl").read_text().splitlines()]
    (choose,) = [e for e in loop if e["node"] == "choose"]
    ms = choose["screened"]
    assert ms["/attempts/turn_001_a.py"] < ms["/attempts/turn_001_b.py"] and choose["chosen"] == "turn_001_a.py"
    verdict = json.loads((tdir / "profiles" / "verdict_000.json").read_text())
    assert verdict["accepted"] and verdict["candidate_sha256"] == store.sha256_bytes(sources["extern"].encode())
    assert (tdir / "best.py").read_text() == sources["extern"]

    # the ledger: idea, check, screened time and verdict per file
    ledger = {r["file"]: r for r in json.loads((tdir / "profiles" / "ledger.json").read_text())}
    ra, rb, rc = (ledger[f"/attempts/turn_001_{x}.py"] for x in "abc")
    assert ra["idea"].startswith("two extern mm") and ra["max_gain"] == 20.0 and rb["idea"].startswith("reorder")
    assert ra["check"] == rb["check"] == "ok" and rc["check"] == ""
    assert ra["screened_ms"] < rb["screened_ms"] and ra["verdict"].startswith("accepted")

    turn = json.loads((tdir / "profiles" / "turn_001.json").read_text())
    assert turn["budget"]["by_agent"] == {"tilesmith-optimizer": 5, "implementer": 8}  # 4 calls per subagent
    out = {}
    for e in turn["events"]:
        if e["kind"] == "tool_call":
            out.setdefault(e["tool"], []).append(e["output"])
    checks = [json.loads(o) for o in out["check"]]
    assert [c["ok"] for c in checks] == [True, True] and {c["file"] for c in checks} == {
        "/attempts/turn_001_a.py", "/attempts/turn_001_b.py"}
    assert all(c["stage"] == "correctness" and len(c["sets"]) >= 2 for c in checks)
    (scr,) = out["screen"]
    assert "best so far:" in scr and "turn_001_a.py:" in scr and "turn_001_b.py:" in scr and "x vs best" in scr
    bench = out["execute"][-1]
    assert "extern_kernels.mm" in bench and "ms/call" in bench and "cpp_fused" not in bench  # kernels of file a
    assert "Assigned:" in out["ideas"][0] and "/attempts/turn_001_a.py: two extern mm" in out["ideas"][0]
    first = text([m for m in model.calls[0]["messages"] if m.type == "human"][-1])
    assert "Ledger" in first and "call `ideas`" in first
    system = text(model.calls[0]["messages"][0])
    assert "Timing mode for this graph: plain launches" in system and "float32 (rtol 2e-05" in system
    assert "no TF32" in system and "static-native" in system


def test_a_failed_check_keeps_a_file_from_the_gate_and_finish_ends_the_track(slow_ws):
    wrong = H.all_extern(_original(slow_ws)).replace("; torch.relu_(", "; (")  # relu dropped: wrong values
    script = Script([
        lambda ms: ai("", tc("write_file", file_path="/scratch/wrong.py", content=wrong)),
        lambda ms: ai("", tc("execute", command=f"cp scratch/wrong.py .{_files(ms)[0]}")),
        lambda ms: ai("", tc("check", path=_files(ms)[0])),
        ai("The extern version is wrong; ending the turn."),
        # turn 2: the host judged nothing; the agent sees why and stops
        ai("", tc("finish", reason="both matmuls already need the scalar path on this machine")),
        ai("Done."),
    ])
    result, model = _run(slow_ws, "scripted-finish", script)
    (t,) = result.tracks
    assert t.status == "exhausted" and t.candidates == 0 and "nothing more worth trying" in t.reason
    assert "scalar path" in t.reason
    tdir = runs.track_dir(result.run_id, t.key)
    assert not list((tdir / "profiles").glob("verdict_*.json"))  # the gate never ran
    turn2 = json.loads((tdir / "profiles" / "turn_002.json").read_text())
    assert "failed its last check" in turn2["message"] and "failed: wrong-values" in turn2["message"]
    assert "turn_002_a.py" in turn2["message"]  # a new file, a copy of the best (the original), not the failed one
    assert (tdir / "attempts" / "turn_002_a.py").read_text() == _original(slow_ws)
    assert (tdir / "attempts" / "turn_001_a.py").read_text() == wrong  # never renamed or overwritten
    routes = [json.loads(x).get("route") for x in (tdir / "profiles" / "loop.jsonl").read_text().splitlines()]
    assert routes[-1] == "agent_finished" and "unchanged" in routes

    from typer.testing import CliRunner

    from tilesmith_cli.app import app

    report = CliRunner().invoke(app, ["report", result.run_id], env={"COLUMNS": "200"})
    assert report.exit_code == 0 and "agent budgets per graph: 150 model calls, 45 minutes" in report.output


def test_the_tuner_runs_first_and_its_log_reaches_the_agent(slow_ws):
    from tilesmith.search import Track
    from tilesmith.profile.baseline import profile_graph
    from tilesmith.search.agent.optimizer import run_track

    (g,) = sorted((slow_ws / "graphs").iterdir())
    track = Track(runs.create_run({}, str(slow_ws), {}).run_id, g.name, g, None, threading.Event())
    track.profile = profile_graph(g)
    judged = []  # what reached the judging function (the driver's gate is not what this test is about)
    model = ScriptedChatModel(reply=Script([ai("", tc("finish", reason="the tuner did what launch parameters can")),
                                            ai("Done.")]))
    register_model("scripted-warm", lambda: model)
    try:
        settings = OptimizeSettings(optimizer="agent", model="scripted-warm", gate_time_budget_s=1.0).resolved()
        status, reason = run_track(track, settings, lambda cand: judged.append(cand) or {
            "accepted": False, "stage": "timing", "reasons": [{"code": "not-faster", "message": "-"}]})
    finally:
        register_model("scripted-warm", None)
    assert settings.warm_start and status == "exhausted" and "launch parameters can" in reason
    log = [json.loads(x) for x in (track.profiles / "tuner_variants.jsonl").read_text().splitlines()]
    assert log and all(e["kernel"].startswith("cpp_fused") for e in log)
    first = text([m for m in model.calls[0]["messages"] if m.type == "human"][-1])
    assert f"Warm start: the built-in tuner screened {len(log)} launch-parameter variant(s)" in first
    assert f"the gate judged {len(judged)} candidate(s)" in first
    assert all(f"{c.label[:160]}: rejected at timing: not-faster" in first for c in judged)


def test_agent_budgets_are_finite_by_default_and_shown_in_help():
    from typer.testing import CliRunner

    from tilesmith.optimize import DEFAULT_GRAPH_MINUTES, DEFAULT_MODEL_CALLS
    from tilesmith.report import agent_budgets
    from tilesmith_cli.app import app

    s = OptimizeSettings(optimizer="agent", model="m").resolved()
    assert (s.max_model_calls, s.graph_minutes, s.warm_start) == (DEFAULT_MODEL_CALLS, DEFAULT_GRAPH_MINUTES, True)
    assert OptimizeSettings(optimizer="agent", model="m", max_model_calls=0).resolved().max_model_calls == 0
    assert OptimizeSettings(optimizer="tuner").resolved().max_model_calls is None
    line = agent_budgets({**s.__dict__})
    assert f"{DEFAULT_MODEL_CALLS} model calls" in line and f"{DEFAULT_GRAPH_MINUTES:g} minutes" in line
    out = " ".join(CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output.split())
    for shown in (f"default {DEFAULT_MODEL_CALLS}", f"default {DEFAULT_GRAPH_MINUTES:g}", "--reasoning-effort",
                  "--context-window", "--no-warm-start"):
        assert shown in out


def test_a_small_context_window_cuts_the_fx_program_with_a_marker_and_sets_the_summary_trigger():
    from tilesmith.search.agent.optimizer import context_window, fx_chars, shell_output_bytes
    from tilesmith.search.agent.tools import fx_excerpt

    model = ScriptedChatModel(reply=lambda ms, n: ai("x"))
    assert context_window(model, None) is None
    assert context_window(model, 8000) == 8000 and model.profile["max_input_tokens"] == 8000
    fx = "\n".join(f"%n{i} = call_function[target=torch.ops.aten.add.Tensor](args = (%a, %b))" for i in range(400))
    cut = fx_excerpt(fx, fx_chars(8000))
    assert len(cut) < len(fx) and f"{fx_chars(8000):,} of {len(fx):,} characters shown" in cut
    assert "/profiles/original_wrapper.py" in cut and fx_excerpt("short", 100) == "short"
    assert shell_output_bytes(30_000, None) == 30_000 and shell_output_bytes(30_000, 8000) == 3200


def test_shell_commands_that_run_python_wait_for_the_timing_lock_and_file_commands_do_not(tmp_path):
    from tilesmith.search.agent.shell import GroupKillShellBackend, shell_env

    lock = threading.Lock()
    sh = GroupKillShellBackend(root_dir=tmp_path, virtual_mode=True, inherit_env=False, env=shell_env(tmp_path),
                               timeout=60, timing_lock=lock)
    done = {}

    def run(name, cmd):
        done[name] = (sh.execute(cmd).output, time.monotonic())

    with lock:  # a measurement is under way
        threads = [threading.Thread(target=run, args=("py", "python -c 'print(42)'")),
                   threading.Thread(target=run, args=("ls", "echo listed"))]
        for th in threads:
            th.start()
        threads[1].join(30)
        time.sleep(0.5)
        released = time.monotonic()
        assert "ls" in done and "py" not in done  # the file command ran, the python one waits
    threads[0].join(60)
    assert done["py"][0].strip() == "42" and done["py"][1] >= released
