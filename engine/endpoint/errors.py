"""The one exception an endpoint run raises, and the scrubbing every string born from a server's bytes goes
through before it is stored anywhere (a message, a setting, a CSV cell)."""
from __future__ import annotations

REDACTED = "<api key>"
# A cut (a body shortened to its first N bytes, a read that ended mid-key) can leave the start of the key at the
# end of a string or its end at the start. Fragments this long or longer are removed too: shorter ones carry too
# few of the key's characters to matter, and removing them would eat ordinary text ("sk" at the end of a word).
MIN_FRAGMENT = 4


class EndpointError(RuntimeError):
    """A run against an endpoint failed, or its server sent something this client does not accept: the message
    says what happened and what to do, in this project's words, the key never in it.

    `partial` is True when tokens had already arrived (the run so far is kept and marked failed)."""

    def __init__(self, message: str, partial: bool = False, status: int | None = None):
        super().__init__(message)
        self.partial = partial
        self.status = status


def redact(text: str, secret: str | None) -> str:
    """text with the key replaced wherever it appears whole, and a prefix of it cut off at the end (or a suffix
    at the start) of MIN_FRAGMENT characters or more removed: a server may echo the Authorization header."""
    if not secret or not text:
        return text
    text = text.replace(secret, REDACTED)
    for n in range(min(len(secret) - 1, len(text)), MIN_FRAGMENT - 1, -1):
        if text.endswith(secret[:n]):
            text = text[:-n] + REDACTED
            break
    for n in range(min(len(secret) - 1, len(text)), MIN_FRAGMENT - 1, -1):
        if text.startswith(secret[-n:]):
            text = REDACTED + text[n:]
            break
    return text


def clip(text: str, n: int, secret: str | None) -> str:
    """The first n characters of text, redacted: the key is removed before the cut and what the cut left after."""
    return redact(redact(text, secret)[:n], secret)
