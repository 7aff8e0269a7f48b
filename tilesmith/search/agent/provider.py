"""Which chat model the agent talks to, checked before any work starts.

TILESMITH_MODEL / --model names the model. Providers, first match wins:
- a model registered in-process with `register_model` (tests, custom providers);
- OPENAI_BASE_URL: any OpenAI-compatible gateway (key: OPENAI_API_KEY, optional for local
  gateways); we wait, bounded by TILESMITH_MODEL_WAIT_S (default 60 s), until the model is listed
  on <base>/models, since a gateway may still be loading it;
- "openrouter:<vendor/model>", or a "vendor/model" id with OPENROUTER_API_KEY set: OpenRouter;
- otherwise OpenAI ("openai:" prefix optional) with OPENAI_API_KEY.

Web search: TILESMITH_WEB_SEARCH=auto|on|off (default auto) binds OpenAI's built-in `web_search` tool
(the provider runs the searches) to the main agent; it needs the Responses API (/responses), so the
model then talks to that instead of chat completions. auto: on for api.openai.com, off for gateways
and OpenRouter (not every one serves /responses or the tool); on: also for them. Never for a model
registered in-process.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

from tilesmith import settings as tilesmith_settings
from tilesmith.errors import TilesmithError

OPENAI_URL = "https://api.openai.com/v1"
OPENROUTER_URL = "https://openrouter.ai/api/v1"

WEB_SEARCH_TOOL = {"type": "web_search"}  # OpenAI's built-in tool (Responses API)

_REGISTERED: dict[str, Callable[[], object]] = {}


def register_model(name: str, factory: Callable[[], object] | None) -> None:
    """Make `name` resolve to factory() (a langchain BaseChatModel); None removes it."""
    if factory is None:
        _REGISTERED.pop(name, None)
    else:
        _REGISTERED[name] = factory


@dataclass
class Provider:
    model: str  # the id sent to the provider
    kind: str  # registered | gateway | openrouter | openai
    base_url: str | None
    key_env: str | None  # the variable the key comes from (never the key itself)
    listed: bool  # seen on /models
    web_search: bool = False  # bind the provider's web_search tool (Responses API)


def check_provider(settings=None, *, wait_s: float | None = None) -> Provider:
    """Resolve and check the model before any work starts; raise TilesmithError when it cannot work."""
    name = (getattr(settings, "model", None) or tilesmith_settings.current().model or "").strip()
    if not name:
        raise TilesmithError("the agent needs a model and none is configured", code="no-model",
                             hint="pass --model NAME or set TILESMITH_MODEL (or use --optimizer tuner)")
    mode = _web_search_mode()
    if name in _REGISTERED:
        return Provider(name, "registered", None, None, True)
    base = os.environ.get("OPENAI_BASE_URL", "").strip().rstrip("/")
    if name.startswith("openrouter:") or ("/" in name and os.environ.get("OPENROUTER_API_KEY") and not base
                                          and not name.startswith("openai:")):
        p = Provider(name.removeprefix("openrouter:"), "openrouter", OPENROUTER_URL, "OPENROUTER_API_KEY", False)
        _need_key(p)
    elif base:
        p = Provider(name.removeprefix("openai:"), "gateway", base, "OPENAI_API_KEY", False)
    else:
        p = Provider(name.removeprefix("openai:"), "openai", OPENAI_URL, "OPENAI_API_KEY", False)
        _need_key(p)
    p.web_search = web_search_on(p, mode)
    # The driver checks before a run starts and each track checks again: a model listed in the last
    # minute (same endpoint, same key) is not asked for again.
    memo = (p.model, p.base_url, os.environ.get(p.key_env or ""))
    if time.monotonic() - _LISTED.get(memo, -1e9) < 60.0:
        p.listed = True
        return p
    if wait_s is None:
        wait_s = float(tilesmith_settings.current().model_wait_s) if p.kind == "gateway" else 0.0
    p.listed = _wait_listed(p, wait_s)
    _LISTED[memo] = time.monotonic()
    return p


_LISTED: dict[tuple, float] = {}  # (model, base url, key) -> when it was last seen on /models


def web_search_on(p: Provider, mode: str) -> bool:
    """Whether the agent gets the provider's web_search tool (see the module's docstring)."""
    if p.kind == "registered" or mode == "off":
        return False
    return mode == "on" or urlparse(p.base_url or "").hostname == "api.openai.com"


def _web_search_mode() -> str:
    return tilesmith_settings.current().web_search_mode


def _need_key(p: Provider) -> None:
    if not os.environ.get(p.key_env or ""):
        raise TilesmithError(f"{p.key_env} is not set: the {p.kind} provider needs it for model '{p.model}'",
                             code="no-api-key", hint=f"export {p.key_env}=... (or point OPENAI_BASE_URL at a gateway)")


def _models(p: Provider, timeout_s: float = 10.0) -> list[str]:
    req = urllib.request.Request(p.base_url + "/models")
    key = os.environ.get(p.key_env or "")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        data = json.loads(r.read() or b"{}")
    return [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]


def _wait_listed(p: Provider, wait_s: float) -> bool:
    """Poll /models until the model is listed; a gateway may still be starting or loading it."""
    deadline = time.monotonic() + wait_s
    last = "no answer"
    while True:
        try:
            ids = _models(p)
            if p.model in ids:
                return True
            last = f"it lists {len(ids)} other model(s)" + (f", e.g. {', '.join(ids[:5])}" if ids else "")
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise TilesmithError(f"{p.base_url} refused the key from {p.key_env} (HTTP {e.code})",
                                     code="provider-auth", hint=f"check {p.key_env}") from None
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        if time.monotonic() >= deadline:
            break
        time.sleep(min(2.0, max(0.05, deadline - time.monotonic())))
    raise TilesmithError(f"model '{p.model}' is not available at {p.base_url} ({last})", code="unknown-model",
                         hint=f"check the model id; for a gateway still loading, raise TILESMITH_MODEL_WAIT_S "
                              f"(waited {wait_s:.0f} s)")


REASONING_EFFORTS = ("minimal", "low", "medium", "high")


def chat_model(p: Provider, *, max_retries: int = 4, timeout_s: float = 600.0, reasoning_effort: str | None = None):
    """The chat model for a checked provider. Retries (with the SDK's exponential backoff) happen
    inside one invocation, so the budget never counts them. With web search, the Responses API (the
    only one that runs OpenAI's built-in tools). reasoning_effort: sent as `reasoning_effort` (chat
    completions) or `reasoning.effort` (Responses API) to reasoning models; None sends nothing."""
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise TilesmithError(f"unknown reasoning effort {reasoning_effort!r}", code="usage",
                             hint="use " + ", ".join(REASONING_EFFORTS))
    if p.kind == "registered":
        return _REGISTERED[p.model]()
    from langchain_openai import ChatOpenAI

    headers = {"X-Title": "tilesmith"} if p.kind == "openrouter" else None
    return ChatOpenAI(model=p.model, base_url=p.base_url, api_key=os.environ.get(p.key_env or "") or "unused",
                      use_responses_api=p.web_search, stream_usage=True, max_retries=max_retries, timeout=timeout_s,
                      default_headers=headers, reasoning_effort=reasoning_effort)
