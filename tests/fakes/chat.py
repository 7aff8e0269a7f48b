"""A scripted chat model for the agent tests: a langchain BaseChatModel whose replies are decided by a
route function from the messages it is sent (deterministic even when subagents run in parallel)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any, Callable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

_ids = itertools.count(1)


def tc(name: str, **args: Any) -> dict:
    """One tool call with a unique id."""
    return {"name": name, "args": args, "id": f"call_{next(_ids)}", "type": "tool_call"}


def ai(content: str = "", *calls: dict) -> AIMessage:
    return AIMessage(content=content, tool_calls=list(calls))


def text(m: BaseMessage) -> str:
    c = m.content
    return c if isinstance(c, str) else "".join(b.get("text", "") for b in c if isinstance(b, dict))


class ScriptedChatModel(BaseChatModel):
    """reply(messages, n) -> AIMessage; n counts this model's invocations from 1. Every call is logged
    (agent-visible tools, the system prompt, the last message)."""

    reply: Any
    calls: list = []
    _lock: Any = None

    def model_post_init(self, __context: Any) -> None:
        self._lock = threading.Lock()
        self.calls = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kw: Any):
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return self.bind(tool_names=[convert_to_openai_tool(t)["function"]["name"] for t in tools], **kw)

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        with self._lock:
            n = len(self.calls) + 1
            self.calls.append({"n": n, "tools": kwargs.get("tool_names"), "messages": list(messages)})
        msg = self.reply(messages, n).model_copy()
        msg.usage_metadata = {"input_tokens": 10 * len(messages), "output_tokens": 5, "total_tokens": 10 * len(messages) + 5}
        return ChatResult(generations=[ChatGeneration(message=msg)])


def first_human(messages: list[BaseMessage]) -> str:
    return next((text(m) for m in messages if m.type == "human"), "")


def last(messages: list[BaseMessage]) -> BaseMessage:
    return messages[-1]


def is_subagent(messages: list[BaseMessage], marker: str = "SUBTASK") -> bool:
    """Subagents see only the task description as their first human message."""
    return first_human(messages).startswith(marker)


def steps(script: list[Callable[[list[BaseMessage]], AIMessage] | AIMessage]):
    """A route that plays the main agent's script in order and answers subagents with `sub_reply`."""
    it = iter(script)

    def reply(messages, n):
        step = next(it)
        return step(messages) if callable(step) else step
    return reply
