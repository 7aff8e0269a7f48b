"""The agent through a real OpenAI-compatible HTTP server on 127.0.0.1 (ChatOpenAI, the openai SDK,
chat completions with tool calls), and the provider checks that run before any work."""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("deepagents")

from tests.fakes.openai_stub import StubOpenAI  # noqa: E402
from tilesmith import runs  # noqa: E402
from tilesmith.errors import TilesmithError  # noqa: E402
from tilesmith.optimize import OptimizeSettings, optimize  # noqa: E402
from tilesmith.search.agent.provider import OPENAI_URL, Provider, check_provider, web_search_on  # noqa: E402

KEY = "sk-local-test"


@pytest.fixture(scope="module")
def slow_ws(two_matmuls_ws):
    return two_matmuls_ws


def _content(m) -> str:
    c = m.get("content")
    return c if isinstance(c, str) else "".join(b.get("text", "") for b in c or [] if isinstance(b, dict))


def route(body: dict) -> dict:
    """The 'model' behind the stub: decides each reply from the request's messages alone."""
    msgs = body["messages"]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    first_user, last_user = _content(msgs[users[0]]), _content(msgs[users[-1]])
    step = sum(1 for m in msgs[users[-1]:] if m["role"] == "assistant")
    if first_user.startswith("SUBTASK"):
        return {"content": "SUBREPORT checked"} if step else {"tool_calls": [("ls", {"path": "/attempts"})]}
    if "REJECTED" in last_user:
        return {"content": "I give up on this graph."}
    attempt = re.findall(r"Current attempt: (/attempts/turn_\d{3}_a\.py)", last_user)[-1]
    if step == 0:
        return {"tool_calls": [("edit_file", {"file_path": attempt, "old_string": "async_compile.wait(globals())",
                                              "new_string": "async_compile.wait(globals())\n_k = os.environ.get('HOME')"})]}
    if step == 1:
        return {"tool_calls": [("task", {"description": "SUBTASK look at the attempts", "subagent_type": "kernel-tuner"})]}
    return {"content": "Submitted an edit."}


def test_agent_track_through_a_local_openai_compatible_server(slow_ws, monkeypatch, tmp_path):
    skill = tmp_path / "my-skills" / "house-rules"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: house-rules\ndescription: Our team's kernel conventions.\n---\n# Rules\n")
    stub = StubOpenAI(route, model="stub-model", fail_first=1, unlisted_gets=2)
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("TILESMITH_MODEL_WAIT_S", "30")
        monkeypatch.delenv("TILESMITH_WEB_SEARCH", raising=False)  # auto: off for a gateway
        result = optimize(slow_ws, OptimizeSettings(optimizer="agent", model="stub-model", max_model_calls=5,
                                                    gate_time_budget_s=1.0, skills=[str(skill.parent)],
                                                    warm_start=False, reasoning_effort="high"))
    finally:
        stub.close()
    (t,) = result.tracks
    assert t.status == "exhausted" and t.candidates == 1 and t.rejected_by_stage == {"static": 1}, t.reason
    gets = [r for r in stub.requests if r["method"] == "GET"]
    posts = [r for r in stub.requests if r["method"] == "POST"]
    assert len(gets) == 3 and all(r["path"] == "/v1/models" for r in gets)  # waited until the model was listed
    assert all(r["path"] == "/v1/chat/completions" for r in posts)
    assert all(r["auth"] == f"Bearer {KEY}" for r in stub.requests)
    # turn 1 spends the whole budget (3 main + 2 subagent calls), so no turn 2; the 500 was retried
    # inside one invocation and did not count
    assert stub.chat_answers == 5 and len(posts) == 6
    assert posts[0]["body"]["model"] == "stub-model" and posts[0]["body"]["tools"]
    assert all(r["body"].get("reasoning_effort") == "high" for r in posts)  # --reasoning-effort reached the API
    system = _content(posts[0]["body"]["messages"][0])
    assert "house-rules" in system and "Our team's kernel conventions." in system  # --skills reached the agent
    assert "triton-performance" in system and "/skills/" in system
    tool_names = {f["function"]["name"] for f in posts[0]["body"]["tools"]}
    assert {"evaluate", "profile", "execute", "task", "write_todos", "edit_file"} <= tool_names
    assert "Web search: NOT available" in system  # a gateway: off unless TILESMITH_WEB_SEARCH=on
    tdir = runs.track_dir(result.run_id, t.key)
    turn1 = json.loads((tdir / "profiles" / "turn_001.json").read_text())
    assert turn1["budget"]["by_agent"] == {"tilesmith-optimizer": 3, "kernel-tuner": 2}
    assert turn1["input_tokens"] > 0 and turn1["model_calls"] == 5


def test_provider_failure_after_retries_stops_the_track_with_the_reason(slow_ws, monkeypatch):
    stub = StubOpenAI(route, model="stub-model", fail_first=10**6)
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        result = optimize(slow_ws, OptimizeSettings(optimizer="agent", model="stub-model", warm_start=False))
    finally:
        stub.close()
    (t,) = result.tracks
    assert t.status == "failed" and "failed after retries" in t.reason and "stub-model" in t.reason
    posts = [r for r in stub.requests if r["method"] == "POST"]
    assert len(posts) == 5  # one invocation: the first request and four retries with backoff


def test_provider_check_names_what_is_missing_before_any_work(monkeypatch):
    for var in ("TILESMITH_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENROUTER_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(TilesmithError) as e:
        check_provider(OptimizeSettings(optimizer="agent"))
    assert e.value.code == "no-model"
    with pytest.raises(TilesmithError) as e:
        check_provider(OptimizeSettings(model="gpt-5.1"))
    assert e.value.code == "no-api-key" and "OPENAI_API_KEY" in e.value.message
    with pytest.raises(TilesmithError) as e:
        check_provider(OptimizeSettings(model="openrouter:anthropic/claude-sonnet-4.5"))
    assert e.value.code == "no-api-key" and "OPENROUTER_API_KEY" in e.value.message

    stub = StubOpenAI(route, model="stub-model")
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        t0 = time.monotonic()
        with pytest.raises(TilesmithError) as e:
            check_provider(OptimizeSettings(model="no-such-model"), wait_s=1.0)
        assert e.value.code == "unknown-model" and "other-model" in e.value.message
        assert 1.0 <= time.monotonic() - t0 < 10
        p = check_provider(OptimizeSettings(model="stub-model"))
        assert (p.kind, p.model, p.base_url, p.listed) == ("gateway", "stub-model", stub.base_url, True)
        assert KEY not in repr(p)
    finally:
        stub.close()


def test_web_search_is_on_for_openai_off_for_gateways_unless_asked_and_a_bad_value_is_an_error(monkeypatch):
    openai = Provider("gpt-5.1", "openai", OPENAI_URL, "OPENAI_API_KEY", True)
    gateway = Provider("m", "gateway", "http://127.0.0.1:8000/v1", "OPENAI_API_KEY", True)
    openrouter = Provider("a/b", "openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", True)
    registered = Provider("scripted", "registered", None, None, True)
    assert [web_search_on(p, "auto") for p in (openai, gateway, openrouter, registered)] == [True, False, False, False]
    assert [web_search_on(p, "on") for p in (openai, gateway, openrouter, registered)] == [True, True, True, False]
    assert not any(web_search_on(p, "off") for p in (openai, gateway, openrouter, registered))
    monkeypatch.setenv("TILESMITH_WEB_SEARCH", "sometimes")
    with pytest.raises(TilesmithError) as e:
        check_provider(OptimizeSettings(model="gpt-5.1"))
    assert e.value.code == "usage" and "TILESMITH_WEB_SEARCH" in e.value.message


def _item_text(item: dict) -> str:
    c = item.get("content")
    return c if isinstance(c, str) else "".join(b.get("text", "") for b in c or [] if isinstance(b, dict))


def responses_route(body: dict) -> dict:
    """The 'model' behind /v1/responses: a web search, an edit and a final answer."""
    items = body["input"]
    users = [i for i, it in enumerate(items) if it.get("role") == "user"]
    step = sum(1 for it in items[users[-1]:] if it.get("type") == "function_call")
    if step == 0:
        return {"web_search": "TorchInductor cpp kernel vectorization", "content": "Searching, then editing.",
                "tool_calls": [("edit_file", {"file_path": re.findall(r"(/attempts/turn_\d{3}_a\.py)", _item_text(items[users[-1]]))[-1],
                                              "old_string": "async_compile.wait(globals())",
                                              "new_string": "async_compile.wait(globals())\n_k = os.environ.get('HOME')"})]}
    return {"content": "Submitted an edit."}


def test_web_search_binds_the_providers_tool_through_the_responses_api(slow_ws, monkeypatch):
    import threading

    from tilesmith.search import Track
    from tilesmith.search.agent.optimizer import run_track

    (g,) = sorted((slow_ws / "graphs").iterdir())
    track = Track(runs.create_run({}, str(slow_ws), {}).run_id, g.name, g, None, threading.Event())
    submitted = []  # the host gate's part is not what this test is about: record and reject
    stub = StubOpenAI(responses_route, model="stub-model")
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        monkeypatch.setenv("TILESMITH_WEB_SEARCH", "on")  # a gateway: only when asked
        status, reason = run_track(track, OptimizeSettings(optimizer="agent", model="stub-model", max_model_calls=2,
                                                            warm_start=False).resolved(),
                                   lambda cand: submitted.append(cand) or {"accepted": False, "stage": "static", "reasons": []})
    finally:
        stub.close()
    assert (status, reason) == ("exhausted", "the model-call budget is spent")
    assert len(submitted) == 1 and "_k = os.environ.get('HOME')" in submitted[0].text
    posts = [r for r in stub.requests if r["method"] == "POST"]
    assert len(posts) == 2 and all(r["path"] == "/v1/responses" and r["auth"] == f"Bearer {KEY}" for r in posts)
    assert all({"type": "web_search"} in r["body"]["tools"] for r in posts)
    system = _item_text(posts[0]["body"]["input"][0])
    assert posts[0]["body"]["input"][0]["role"] == "system" and "Web search: AVAILABLE" in system
    # the second call carries the search the provider ran, the edit and its result back
    kinds = [it.get("type") for it in posts[1]["body"]["input"]]
    assert "web_search_call" in kinds and "function_call" in kinds and "function_call_output" in kinds
    turn1 = json.loads((track.profiles / "turn_001.json").read_text())
    assert turn1["final_answer"] == "Submitted an edit." and turn1["model_calls"] == 2 and turn1["attempt_changed"]
    assert turn1["input_tokens"] > 0 and turn1["web_searches"] == 1
    assert turn1["events"][0]["web_searches"] == ["TorchInductor cpp kernel vectorization"]
