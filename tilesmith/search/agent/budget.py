"""The agent's exact model-call budget: one locked counter shared by the main agent, every subagent
and the summarizer. N permits N invocations and blocks the next; provider retries inside one
invocation are not invocations (they happen inside the chat model's own request), so they are free."""

from __future__ import annotations

import threading
from typing import Any, Callable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import ModelError
from langchain_core.messages import AIMessage

BLOCKED_PREFIX = "[budget]"


class BudgetExhausted(ModelError):
    """Raised for a blocked summarization call; not retryable, so no retry wrapper re-attempts it."""

    is_retryable = False


class ModelCallBudget:
    """limit=None: unlimited. Thread-safe: parallel `task` subagents share it."""

    def __init__(self, limit: int | None, stop=None):
        self.limit = limit
        self.stop = stop  # callable -> bool: time is up or the user interrupted; no permit then
        self.used = 0
        self.blocked = 0
        self.by_agent: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, who: str) -> bool:
        with self._lock:
            if (self.limit is not None and self.used >= self.limit) or (self.stop is not None and self.stop()):
                self.blocked += 1
                return False
            self.used += 1
            self.by_agent[who] = self.by_agent.get(who, 0) + 1
            return True

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)


def _agent_name() -> str:
    from langgraph.config import get_config

    try:
        md = get_config().get("metadata", {})
    except RuntimeError:
        md = {}
    return str(md.get("lc_agent_name") or "main")


class BudgetMiddleware(AgentMiddleware):
    """Charge one permit before each model call; without one, answer with a plain message (no tool
    calls), which ends that (sub)agent's loop cleanly. The same instance goes into every stack."""

    def __init__(self, budget: ModelCallBudget):
        super().__init__()
        self.budget = budget

    def _blocked(self) -> AIMessage:
        if self.budget.stop is not None and self.budget.stop():
            return AIMessage(content=f"{BLOCKED_PREFIX} the time for this graph is up; stopping.")
        return AIMessage(content=f"{BLOCKED_PREFIX} the model-call budget of {self.budget.limit} is spent; stopping.")

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        if not self.budget.try_acquire(_agent_name()):
            return self._blocked()
        return handler(redacted(request))

    async def awrap_model_call(self, request: ModelRequest, handler) -> Any:
        if not self.budget.try_acquire(_agent_name()):
            return self._blocked()
        return await handler(redacted(request))


def redacted(request: ModelRequest) -> ModelRequest:
    """The request with known secret values removed from every message (tilesmith.launch.secrets.redact): the
    last line of defence, in every agent's stack, before anything reaches the model."""
    from tilesmith.launch.secrets import redact_obj, secret_values

    if not secret_values():
        return request
    msgs = [m.model_copy(update={"content": redact_obj(m.content)}) for m in request.messages]
    sys_msg = getattr(request, "system_message", None)
    if sys_msg is not None:
        return request.override(messages=msgs, system_message=sys_msg.model_copy(
            update={"content": redact_obj(sys_msg.content)}))
    return request.override(messages=msgs)


class SummaryBudgetCallback(BaseCallbackHandler):
    """Summarization calls the model directly, bypassing wrap_model_call: charge those here."""

    raise_error = True

    def __init__(self, budget: ModelCallBudget) -> None:
        self.budget = budget

    def on_chat_model_start(self, serialized, messages, *, metadata=None, **kw):
        # (The summarizer's input is the agents' message history: tool results were redacted at their
        # source, the shell and the host tools, before they entered it.)
        if (metadata or {}).get("lc_source") == "summarization" and not self.budget.try_acquire("summarization"):
            raise BudgetExhausted(f"the model-call budget of {self.budget.limit} is spent (summary call)")
