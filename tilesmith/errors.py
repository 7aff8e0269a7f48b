"""The one error type users see: what went wrong, a machine-readable code, and what to do."""

from __future__ import annotations


class TilesmithError(Exception):
    """An error meant for the user: `message` says what and why, `hint` what to do about it."""

    def __init__(self, message: str, *, code: str = "error", hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint

    def to_dict(self) -> dict:
        return {"error": self.message, "code": self.code, "hint": self.hint}
