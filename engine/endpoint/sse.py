"""Server-sent events from raw bytes, each stamped with the time its last byte arrived.

The caller feeds bytes as the socket hands them over, with the monotonic time of that read: an event's time is
when it became complete on this machine, not when a parser got round to it. Only `data:` fields matter here
(OpenAI-compatible streams put one JSON object in each); comments and other fields are skipped.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from engine.endpoint.errors import EndpointError

DONE = "[DONE]"
DEFAULT_MAX_EVENT_BYTES = 1 << 20  # a chunk of one step's tokens is a few hundred bytes; 1 MiB is a broken stream


@dataclass
class Event:
    data: str
    t: float  # perf_counter() of the read that completed it
    index: int  # 0-based among the stream's data events


class SSEParser:
    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES):
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._data: list[str] = []
        self._data_bytes = 0  # the event in progress's data so far
        self._count = 0
        self.done = False  # the server sent [DONE]

    def feed(self, data: bytes, t: float) -> list[Event]:
        return list(self.events(data, t))

    def events(self, data: bytes, t: float) -> Iterator[Event]:
        """The events this read completed, one at a time: a bad line raises after the good events before it
        (in the same read) were handed over."""
        self._buf += data
        if b"\n" in data:  # the buffer held no line end before this read: only then is there a line to take
            *lines, rest = self._buf.split(b"\n")
            self._buf = bytearray(rest)
            for line in lines:
                if event := self._line(line[:-1] if line.endswith(b"\r") else line, t):
                    yield event
        if len(self._buf) + self._data_bytes > self.max_event_bytes:
            raise self._too_big()

    def _too_big(self) -> EndpointError:
        return EndpointError(f"a chunk of the stream grew past {self.max_event_bytes} bytes without ending "
                             "(the limit is max_event_bytes); the server's stream is not one this client reads")

    def _line(self, line: bytes, t: float) -> Event | None:
        if not line:  # a blank line ends the event
            if not self._data:
                return None
            text, self._data, self._data_bytes = "\n".join(self._data), [], 0
            if text == DONE:
                self.done = True
                return None
            self._count += 1
            return Event(text, t, self._count - 1)
        if line.startswith(b":"):
            return None
        name, _, value = line.partition(b":")
        if name == b"data":
            try:
                self._data.append(value.removeprefix(b" ").decode("utf-8"))
                self._data_bytes += len(value)
                if self._data_bytes > self.max_event_bytes:
                    raise self._too_big()
            except UnicodeDecodeError as e:
                raise EndpointError(f"chunk {self._count} is not UTF-8 (byte {e.object[e.start]:#04x} at "
                                    f"{e.start})") from None
        return None

    def close(self, t: float) -> list[Event]:
        """End of the byte stream: an event the server did not end with a blank line still counts."""
        rest = [] if not self._buf else [self._line(bytes(self._buf).rstrip(b"\r"), t)]
        self._buf.clear()
        return [e for e in (*rest, self._line(b"", t)) if e is not None]
