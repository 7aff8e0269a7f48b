"""One JSON trace per agent turn (profiles/turn_NNN.json): every model call (agent or subagent,
tokens, tool calls asked for, web searches the provider ran, timings) and every tool call (input,
output head, status, timings)."""

from __future__ import annotations

import threading
import time
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler


class TurnTrace(BaseCallbackHandler):
    """Pass in config={"callbacks": [trace]}; callbacks reach subagents run by `task`."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.t0 = time.monotonic()

    def _t(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def on_chat_model_start(self, serialized, messages, *, run_id, metadata=None, **kw):
        md, params = metadata or {}, kw.get("invocation_params") or {}
        with self._lock:
            self._open[str(run_id)] = {
                "kind": "model_call", "t_start_s": self._t(), "agent": md.get("lc_agent_name"),
                "source": md.get("lc_source"), "model": params.get("model") or params.get("model_name"),
                "input_messages": len(messages[0]) if messages else 0}

    def on_llm_end(self, response, *, run_id, **kw):
        with self._lock:
            rec = self._open.pop(str(run_id), None)
        if rec is None:
            return
        gen = response.generations[0][0]
        msg = getattr(gen, "message", None)
        rec.update({"t_end_s": self._t(), "text": str(getattr(msg, "text", "") or gen.text)[:4000],
                    "tool_calls": [{"name": c["name"], "args": _short(c["args"])} for c in getattr(msg, "tool_calls", None) or []],
                    "usage": dict(getattr(msg, "usage_metadata", None) or {})})
        content = getattr(msg, "content", None)
        searches = [(b.get("action") or {}).get("query") for b in content if isinstance(b, dict)
                    and b.get("type") == "web_search_call"] if isinstance(content, list) else []
        if searches:  # the provider's web search ran inside this call (Responses API output items)
            rec["web_searches"] = searches
        with self._lock:
            self.events.append(rec)

    def on_llm_error(self, error, *, run_id, **kw):
        with self._lock:
            rec = self._open.pop(str(run_id), {"kind": "model_call"})
            rec.update({"t_end_s": self._t(), "error": repr(error)[:2000]})
            self.events.append(rec)

    def on_tool_start(self, serialized, input_str, *, run_id, metadata=None, inputs=None, **kw):
        with self._lock:
            self._open[str(run_id)] = {"kind": "tool_call", "t_start_s": self._t(),
                                       "agent": (metadata or {}).get("lc_agent_name"),
                                       "tool": (serialized or {}).get("name"),
                                       "input": _short(inputs if inputs is not None else input_str)}

    def on_tool_end(self, output, *, run_id, **kw):
        with self._lock:
            rec = self._open.pop(str(run_id), None)
            if rec is not None:
                rec.update({"t_end_s": self._t(), "output": str(getattr(output, "content", output))[:4000],
                            "status": getattr(output, "status", None)})
                self.events.append(rec)

    def on_tool_error(self, error, *, run_id, **kw):
        with self._lock:
            rec = self._open.pop(str(run_id), {"kind": "tool_call"})
            rec.update({"t_end_s": self._t(), "error": repr(error)[:2000]})
            self.events.append(rec)

    def summary(self) -> dict:
        models = [e for e in self.events if e["kind"] == "model_call"]
        tools = [e for e in self.events if e["kind"] == "tool_call"]
        usage = [e.get("usage") or {} for e in models]
        by_tool: dict[str, int] = {}
        for e in tools:
            by_tool[str(e.get("tool"))] = by_tool.get(str(e.get("tool")), 0) + 1
        return {"model_calls": len(models), "tool_calls": len(tools), "tools": by_tool,
                "web_searches": sum(len(e.get("web_searches", ())) for e in models),
                "input_tokens": sum(u.get("input_tokens", 0) for u in usage),
                "output_tokens": sum(u.get("output_tokens", 0) for u in usage),
                "wall_s": self._t()}


def _short(obj: Any, limit: int = 2000) -> Any:
    """Tool inputs can hold whole files: keep the trace readable."""
    if isinstance(obj, str):
        return obj if len(obj) <= limit else obj[:limit] + f"... ({len(obj)} chars)"
    if isinstance(obj, dict):
        return {k: _short(v, limit) for k, v in obj.items()}
    return obj
