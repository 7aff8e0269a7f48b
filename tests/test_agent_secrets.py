"""Secrets never leave, end to end: the real agent, a scripted model behind the local OpenAI-compatible
stub, and a shell probe of the parent's environment through /proc. The optimizing process is started
with the provider key in its environment, as a user's shell starts it; the OS sandbox is switched off
(TILESMITH_SANDBOX=off), so the probe does read the key and only the redaction stands between it and
the model, the traces and the files on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("deepagents")

from tests import gate_helpers as h  # noqa: E402
from tests.fakes.openai_stub import StubOpenAI  # noqa: E402

KEY = "sk-agent-secret-" + "5" * 24
PROBE = "cat /proc/$PPID/environ | tr '\\0' '\\n' | grep -c API_KEY; cat /proc/$PPID/environ; echo; env | grep -c KEY"


def route(body: dict) -> dict:
    msgs = body["messages"]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    step = sum(1 for m in msgs[users[-1]:] if m["role"] == "assistant")
    if step == 0:
        return {"tool_calls": [("execute", {"command": PROBE})]}
    return {"content": "Looked around; nothing to change."}


def test_the_key_read_from_proc_reaches_no_model_request_and_no_file(inference_ws, tmp_path):
    home = tmp_path / "home"
    stub = StubOpenAI(route, model="stub-model")
    code = ("import sys; from tilesmith.optimize import OptimizeSettings, optimize; "
            "r = optimize(sys.argv[1], OptimizeSettings(optimizer='agent', model='stub-model', max_model_calls=2, "
            "gate_time_budget_s=1.0, warm_start=False)); print(r.run_id)")  # the tuner's warm start has its own test
    env = {**os.environ, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": stub.base_url, "TILESMITH_HOME": str(home),
           "TILESMITH_SANDBOX": "off", "TILESMITH_MODEL_WAIT_S": "30", "OMP_NUM_THREADS": "1"}
    try:
        p = subprocess.run([sys.executable, "-c", code, str(inference_ws)], capture_output=True, text=True,
                           timeout=600, env=env)
    finally:
        stub.close()
    assert p.returncode == 0, p.stderr[-3000:]
    posts = [json.dumps(r["body"]) for r in stub.requests if r["method"] == "POST"]
    assert len(posts) == 2
    tool_results = [m for m in json.loads(posts[1])["messages"] if m["role"] == "tool"]
    # The probe ran and read the key (the parent's environment lists it), and the model got [REDACTED].
    assert tool_results and "[REDACTED]" in tool_results[0]["content"], tool_results
    assert all(KEY not in b for b in posts)
    files = [f for f in home.rglob("*") if f.is_file()]
    assert any(f.name.startswith("turn_") for f in files)  # the trace was written, and holds no key
    leaked = [str(f) for f in files if KEY.encode() in f.read_bytes()]
    assert leaked == [] and KEY not in p.stdout + p.stderr
    assert h.graph_of(inference_ws).exists()
