"""Secrets: which environment variables look secret (none reaches a worker or the agent's shell), and the
redaction of their values from anything sent to a model or written to disk. Standard library only."""

from __future__ import annotations

import os
import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT", re.I)
_MIN_SECRET_CHARS = 8  # shorter values ("1", "true") would redact ordinary text


def is_secret(name: str) -> bool:
    """Whether an environment variable's name looks secret (KEY, TOKEN, SECRET, PASSWORD, ...)."""
    return SECRET_NAME.search(name) is not None


def secret_values(environ=None) -> list[str]:
    """Values of this process's environment variables whose names look secret, longest first."""
    env = os.environ if environ is None else environ
    vals = {v for k, v in env.items() if is_secret(k) and len(v.strip()) >= _MIN_SECRET_CHARS}
    return sorted(vals, key=len, reverse=True)


def redact(text):
    """`text` with every known secret value replaced by [REDACTED]; non-strings pass through."""
    if not isinstance(text, str) or not text:
        return text
    for v in secret_values():
        if v in text:
            text = text.replace(v, "[REDACTED]")
    return text


def redact_obj(obj):
    """Redact every string inside a JSON-like object (dicts, lists, strings)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj
