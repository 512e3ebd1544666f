"""The one exception an endpoint run raises, and the scrubbing every message goes through first."""
from __future__ import annotations

REDACTED = "<api key>"


class EndpointError(RuntimeError):
    """A run against an endpoint failed: the message says what happened and what to do.

    `partial` is True when tokens had already arrived (the run so far is kept and marked failed)."""

    def __init__(self, message: str, partial: bool = False, status: int | None = None):
        super().__init__(message)
        self.partial = partial
        self.status = status


def redact(text: str, secret: str | None) -> str:
    """text with the API key (and its Bearer form) replaced: a server may echo headers or keys in its errors."""
    if secret:
        text = text.replace(secret, REDACTED)
    return text
