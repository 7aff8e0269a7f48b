"""The agent optimizer end to end: a scripted chat model drives the real Deep Agent stack (files,
shell, evaluate, subagents) through the real optimize driver and the real gate on captured wrappers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("deepagents")

from tests import agent_helpers as H  # noqa: E402
from tests import gate_helpers  # noqa: E402
from tests.conftest import captured_workspace  # noqa: E402
from tests.agent_helpers import Script  # noqa: E402,F401 (tests/gpu imports it from here)
from tests.fakes.chat import ScriptedChatModel, ai, tc, text  # noqa: E402
from tilesmith import runs, store  # noqa: E402
from tilesmith.optimize import OptimizeSettings, optimize  # noqa: E402
from tilesmith.search.agent.provider import register_model  # noqa: E402


@pytest.fixture(scope="module")
def slow_ws(two_matmuls_ws):
    return two_matmuls_ws


@pytest.fixture(scope="module")
def vectorized_text(tmp_path_factory, inductor_cache) -> str:
    ws = captured_workspace(tmp_path_factory, "ws-two-matmuls-vectorized", H.FIXTURE, "--vectorized")
    (g,) = sorted((ws / "graphs").iterdir())
    return (g / "wrapper.py").read_text()


def _graph(ws: Path) -> Path:
    (g,) = sorted((ws / "graphs").iterdir())
    return g


def attempt_of(messages) -> str:
    """The attempt the host named in its latest message to the main agent."""
    human = [text(m) for m in messages if m.type == "human"]
    return re.findall(r"Current attempt: (/attempts/turn_\d{3}_a\.py)", human[-1])[-1]


def last_tool_output(messages) -> str:
    return text(messages[-1]) if messages[-1].type == "tool" else ""




def _run(ws, name, script, **settings):
    model = ScriptedChatModel(reply=script)
    register_model(name, lambda: model)
    try:
        s = OptimizeSettings(optimizer="agent", model=name, **{"gate_time_budget_s": 1.0, "warm_start": False, **settings})
        result = optimize(ws, s)
    finally:
        register_model(name, None)
    return result, model


def _tuner_sub(messages):
    """The kernel-tuner subagent: looks at the attempt with the shell, then reports."""
    n_ai = sum(1 for m in messages if m.type == "ai")
    if n_ai == 0:
        return ai("", tc("execute", command="grep -c 'pragma omp for' attempts/*.py | head -3"))
    return ai(f"SUBREPORT nothing to tune: {last_tool_output(messages)[:60]}")


def test_agent_track_edits_runs_shell_evaluates_delegates_and_its_rejected_cheat_is_not_judged_again(slow_ws, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    cheat_line = "_key = os.environ.get('OPENAI_API_KEY')"
    script = Script([
        ai("", tc("write_todos", todos=[{"content": "profile, edit, evaluate", "status": "in_progress"}])),
        ai("", tc("write_file", file_path="/profiles/verdict_999.json", content="{}")),  # read-only to it
        ai("", tc("read_file", file_path="/../../etc/passwd")),  # outside the track folder
        lambda ms: ai("", tc("read_file", file_path=attempt_of(ms), limit=20)),
        lambda ms: ai("", tc("edit_file", file_path=attempt_of(ms), old_string="async_compile.wait(globals())",
                             new_string="async_compile.wait(globals())\n" + cheat_line)),
        ai("", tc("execute", command="echo KEY=[$OPENAI_API_KEY] HOME=$HOME; python -c 'import torch; print(torch.__version__)'")),
        ai("", tc("evaluate")),
        ai("", tc("task", description="SUBTASK: tune the C++ kernel's thread count", subagent_type="kernel-tuner")),
        ai("I added a key lookup; submitting."),
        # turn 2: the host judged nothing (the attempt failed its last check); the agent stops
        ai("I cannot beat it."),
    ], sub=_tuner_sub)
    result, model = _run(slow_ws, "scripted-cheat", script, max_model_calls=13)
    (t,) = result.tracks
    # evaluate already rejected the attempt, so the host does not spend a gate run on it
    assert t.status == "exhausted" and t.loops_done == 0 and t.candidates == 0
    tdir = runs.track_dir(result.run_id, t.key)
    assert not (tdir / "best.py").exists()  # the original stays

    events = json.loads((tdir / "profiles" / "turn_001.json").read_text())
    tools = [e["tool"] for e in events["events"] if e["kind"] == "tool_call"]
    for name in ("write_todos", "read_file", "edit_file", "execute", "evaluate", "task"):
        assert name in tools
    assert events["model_calls"] == 11 and events["budget"]["this_turn"] == 11
    assert events["budget"]["by_agent"] == {"tilesmith-optimizer": 9, "kernel-tuner": 2}
    assert events["input_tokens"] > 0 and events["attempt_changed"] is True
    out = {}  # tool -> outputs joined (main and subagent)
    for e in events["events"]:
        if e["kind"] == "tool_call":
            out[e["tool"]] = out.get(e["tool"], "") + "\n" + e["output"]
    assert "KEY=[]" in out["execute"] and "sk-parent-secret" not in json.dumps(events)
    assert "static-environment" in out["evaluate"]
    assert "SUBREPORT" in out["task"]
    assert "permission denied" in out["write_file"] and not (tdir / "profiles" / "verdict_999.json").exists()
    assert "traversal" in out["read_file"].lower() and "root:" not in out["read_file"]
    assert not list((tdir / "profiles").glob("verdict_*.json")) and events["judged"] is None
    edited = (tdir / "attempts" / "turn_001_a.py").read_text()
    ledger = {r["file"]: r for r in json.loads((tdir / "profiles" / "ledger.json").read_text())}
    row = ledger["/attempts/turn_001_a.py"]
    assert cheat_line in edited and row["check"] == "failed: static-environment"
    assert row["check_sha"] == store.sha256_bytes(edited.encode())

    # turn 2 was told why nothing was judged and ended without an edit; the budget then ran out
    turn2 = json.loads((tdir / "profiles" / "turn_002.json").read_text())
    assert "failed its last check" in turn2["message"] and "failed: static-environment" in turn2["message"]
    assert turn2["attempt_changed"] is False
    # the outer LangGraph loop drove it: turn 1 left nothing to judge, turns 2 and 3 changed nothing,
    # and the 13th permit spent the budget
    loop = [json.loads(line) for line in (tdir / "profiles" / "loop.jsonl").read_text().splitlines()]
    assert [(e["node"], e.get("route")) for e in loop] == [
        ("decide", "start"), ("agent_turn", None), ("decide", "unchanged"),
        ("agent_turn", None), ("decide", "unchanged"), ("agent_turn", None), ("decide", "budget_spent")]
    assert [e["turn"] for e in loop if e["node"] == "agent_turn"] == [1, 2, 3]
    assert loop[1]["changed"] and loop[1]["judged"] is None and not loop[3]["changed"]
    # one conversation across turns: turn 2's first model call still holds turn 1's messages
    turn2_call = next(c for c in model.calls
                      if "failed its last check" in text([m for m in c["messages"] if m.type == "human"][-1]))
    assert any("I added a key lookup" in text(m) for m in turn2_call["messages"] if m.type == "ai")
    assert len(model.calls) == 13  # 11 + 1 in turn 2 + 1 in turn 3 (the 13th permit); nothing blocked yet
    assert model.calls[0]["tools"] and {"evaluate", "profile", "execute", "task", "write_todos"} <= set(model.calls[0]["tools"])
    system = text(model.calls[0]["messages"][0])
    assert "Agency MEDIUM" in system and "fp32_matmul_TFLOPs" in system and "cpp_fused" in system
    assert "inductor-wrapper-abi" in system and "2.0%" in system


def test_budget_of_n_model_calls_permits_exactly_n_across_parallel_subagents(slow_ws):
    def sub(messages):  # each subagent would like three calls
        n_ai = sum(1 for m in messages if m.type == "ai")
        return ai("SUBREPORT done") if n_ai >= 2 else ai("", tc("ls", path="/attempts"))

    script = Script([ai("", tc("task", description="SUBTASK a", subagent_type="kernel-tuner"),
                           tc("task", description="SUBTASK b", subagent_type="general-purpose"))], sub=sub)
    result, model = _run(slow_ws, "scripted-budget", script, max_model_calls=4)
    (t,) = result.tracks
    assert len(model.calls) == 4  # 4 permits, 4 real invocations; every later one was blocked
    assert t.status == "exhausted" and t.candidates == 0
    turn = json.loads((runs.track_dir(result.run_id, t.key) / "profiles" / "turn_001.json").read_text())
    assert turn["budget"]["used"] == 4 and turn["budget"]["blocked"] >= 2
    assert sum(turn["budget"]["by_agent"].values()) == 4 and set(turn["budget"]["by_agent"]) > {"tilesmith-optimizer"}
    assert "[budget]" in turn["final_answer"]


def test_two_loops_need_two_distinct_confirmed_improvements_and_the_run_installs_the_last(
        slow_ws, vectorized_text, monkeypatch):
    from tilesmith.install import install

    # One thread per pool in the gate's workers: on a busy 2-core machine, an OpenMP kernel and MKL
    # timed in the same process spin against each other and swamp the difference being measured.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    original = (_graph(slow_ws) / "wrapper.py").read_text()
    # Loop 1's win is the vectorized wrapper slowed by redundant passes; loop 2's, the matmuls as library calls, must
    # beat it clearly: against the plain vectorized wrapper it read 1.06-1.35x across six runs on the VM (session 19).
    win1 = gate_helpers.with_redundant_work(vectorized_text, 20)
    win2 = H.all_extern(original)

    def submit(name, source):
        return [ai("", tc("write_file", file_path=f"/scratch/{name}.py", content=source)),
                lambda ms: ai("", tc("execute", command=f"cp scratch/{name}.py .{attempt_of(ms)}")),
                ai(f"{name}: submitted")]

    # in loop 2 the agent also tries to slow down the timing baseline (/best.py) through the shell
    script = Script(submit("vectorized", win1)
                    + [ai("", tc("execute", command="cp profiles/original_wrapper.py best.py"))]
                    + submit("extern_mm", win2))
    # timing needs a few seconds per pass on a busy 2-core machine to show the second win's margin
    result, model = _run(slow_ws, "scripted-loops", script, loops=2, gate_time_budget_s=4.0)
    (t,) = result.tracks
    assert (t.status, t.loops_done, t.candidates) == ("done", 2, 2), t.reason
    tdir = runs.track_dir(result.run_id, t.key)
    v0, v1 = (json.loads((tdir / "profiles" / f"verdict_00{i}.json").read_text()) for i in (0, 1))
    assert v0["accepted"] and v1["accepted"] and v1["confirmation"]["timing"]["speedup_low"] > 1.02
    assert v0["candidate_sha256"] == store.sha256_bytes(win1.encode())
    assert v1["candidate_sha256"] == store.sha256_bytes(win2.encode())
    assert t.speedup > v0["confirmation"]["timing"]["speedup"]  # the second win is on top of the first
    turn2 = json.loads((tdir / "profiles" / "turn_002.json").read_text())
    assert "ACCEPTED" in turn2["message"] and "Loop 2 of 2" in turn2["message"]
    assert (tdir / "best.py").read_text() == win2
    # the host put the confirmed source back before judging loop 2, and logged it apart from the
    # tuner's screened variants (which the report counts)
    assert "best.py restored" in (tdir / "profiles" / "events.jsonl").read_text()
    assert not (tdir / "profiles" / "tuner_variants.jsonl").exists()

    installed = install(result.run_id)
    assert [(g.key, g.status) for g in installed.graphs] == [(t.key, "installed")]
    assert store.artifact_path(t.key).read_text() == win2


def test_interrupt_or_time_limit_ends_the_agent_turn_at_its_next_model_call(slow_ws):
    import threading

    from tilesmith.search import Track
    from tilesmith.search.agent.optimizer import run_track

    stop = threading.Event()

    def busy(ms):  # a model that would list files forever; the user presses Ctrl-C during call 3
        if len([m for m in ms if m.type == "ai"]) == 2:
            stop.set()
        return ai("", tc("ls", path="/attempts"))

    model = ScriptedChatModel(reply=Script([busy] * 50))
    register_model("scripted-busy", lambda: model)
    try:
        g = _graph(slow_ws)
        rid = runs.create_run({}, str(slow_ws), {}).run_id
        track = Track(rid, g.name, g, None, stop)
        produced = []  # what the agent's loop submitted to the host gate
        settings = OptimizeSettings(optimizer="agent", model="scripted-busy", warm_start=False).resolved()
        status, reason = run_track(track, settings,
                                   lambda cand: produced.append(cand) or {"accepted": False})
    finally:
        register_model("scripted-busy", None)
    assert produced == [] and len(model.calls) == 3
    assert status == "interrupted" and "time" in reason
    turn = json.loads((track.profiles / "turn_001.json").read_text())
    assert "time for this graph is up" in turn["final_answer"] and turn["budget"]["used"] == 3


def test_ctrl_c_during_an_agent_turn_ends_the_run_as_interrupted_and_keeps_the_verdicts(slow_ws):
    from tilesmith import paths

    def ctrl_c(ms):
        raise KeyboardInterrupt

    script = Script([lambda ms: ai("", tc("edit_file", file_path=attempt_of(ms), old_string="async_compile.wait(globals())",
                                          new_string="async_compile.wait(globals())\n_k = os.environ.get('HOME')")),
                     ai("submitted"), ctrl_c])  # turn 1 is judged (rejected); Ctrl-C during turn 2
    with pytest.raises(KeyboardInterrupt):
        _run(slow_ws, "scripted-ctrl-c", script)
    (rid,) = [p.name for p in paths.runs_dir().iterdir()]
    run = runs.load_run(rid)
    (t,) = run.graphs.values()
    assert run.status == "interrupted" and t["status"] == "interrupted" and t["candidates"] == 1
    profiles = runs.track_dir(rid, t["key"]) / "profiles"
    assert json.loads((profiles / "verdict_000.json").read_text())["stage"] == "static"
    nodes = [json.loads(line)["node"] for line in (profiles / "loop.jsonl").read_text().splitlines()]
    assert nodes == ["decide", "agent_turn", "gate", "decide"]  # turn 2 never finished


def test_summarization_calls_are_charged_to_the_same_budget():
    from tilesmith.search.agent.budget import BudgetExhausted, ModelCallBudget, SummaryBudgetCallback

    budget = ModelCallBudget(2)
    cb = SummaryBudgetCallback(budget)
    cb.on_chat_model_start({}, [[]], metadata={"lc_agent_name": "tilesmith-optimizer"})  # charged by the middleware
    assert budget.used == 0
    cb.on_chat_model_start({}, [[]], metadata={"lc_source": "summarization"})
    assert budget.try_acquire("tilesmith-optimizer") and budget.used == 2
    with pytest.raises(BudgetExhausted):
        cb.on_chat_model_start({}, [[]], metadata={"lc_source": "summarization"})
    assert budget.used == 2 and budget.blocked == 1 and budget.by_agent == {"summarization": 1, "tilesmith-optimizer": 1}


def test_the_outer_loop_is_a_langgraph_graph_of_turn_gate_and_decide():
    from tilesmith.search.agent.loop import ENDINGS, LoopState, decide, loop_graph

    compiled = loop_graph()
    g = compiled.get_graph()
    assert set(g.nodes) == {"__start__", "decide", "agent_turn", "gate", "__end__"}
    assert {(e.source, e.target, e.data, e.conditional) for e in g.edges} == {
        ("__start__", "decide", None, False), ("gate", "decide", None, False),
        ("agent_turn", "gate", "changed", True), ("agent_turn", "decide", "unchanged", True),
        ("decide", "agent_turn", "next_turn", True), ("decide", "__end__", "end", True)}
    assert compiled.builder.nodes["decide"].runnable.func is decide and LoopState.__annotations__["route"]
    assert {status for status, _ in ENDINGS.values()} == {"done", "interrupted", "exhausted"}
