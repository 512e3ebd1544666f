"""An endpoint as the user named it, checked at the boundary, and what a run against it reported (EndpointInfo)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit, urlunsplit

from engine.endpoint.servers import AUTO, SERVER_CHOICES

DEFAULT_STALL_S = 30.0  # no byte for this long mid-stream: the run ends, failed, its tokens so far kept
DEFAULT_CONNECT_S = 10.0


def check_url(url: str) -> str:
    """The base URL of an OpenAI-compatible API (`http://host:port/v1`; a bare host gets /v1), or ValueError."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint {url!r} is not an http(s) URL; give one like http://127.0.0.1:8080/v1")
    if parts.username or parts.password:  # the URL would carry a secret into every log line and CSV
        raise ValueError("the endpoint URL carries credentials; give the API key in the key field or with "
                         "--api-key-env instead")
    if parts.query or parts.fragment:
        raise ValueError(f"endpoint {url!r} has a query or fragment; give the API's base URL only")
    try:
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        raise ValueError(f"endpoint {url!r} has an invalid port") from None
    path = parts.path.rstrip("/") or "/v1"
    # one spelling per address, so `HTTP://Host:8080/v1/` is the launch list's `http://host:8080/v1`
    return urlunsplit((parts.scheme, parts.netloc.lower(), path, "", ""))


def server_root(base_url: str) -> str:
    """The server's root (where llama-server's /props, vLLM's /version and /metrics live)."""
    parts = urlsplit(base_url)
    path = parts.path[: -len("/v1")] if parts.path.endswith("/v1") else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str = ""  # "" -> the first model the server lists at GET /models
    server: str = AUTO  # a key of servers.SERVERS, or auto (probed once per URL)
    api_key: str | None = field(default=None, repr=False, compare=False)  # never printed, never exported
    stall_s: float = DEFAULT_STALL_S
    connect_s: float = DEFAULT_CONNECT_S

    def __post_init__(self):
        object.__setattr__(self, "url", check_url(self.url))
        if self.server not in SERVER_CHOICES:
            raise ValueError(f"server {self.server!r} is not one of {', '.join(SERVER_CHOICES)}")
        if not self.stall_s > 0:
            raise ValueError(f"stall timeout {self.stall_s!r} s must be positive")

    @property
    def root(self) -> str:
        return server_root(self.url)


@dataclass
class EndpointInfo:
    """What a run against an endpoint learned besides its Rounds: the server, where its token counts came from,
    and the server's own figures. Flattened into the run's settings (CSV columns), the key never among them."""
    endpoint: str
    server: str = ""
    server_version: str | None = None
    endpoint_model: str = ""
    api: str = "chat"
    tokens_from: str | None = None
    stop_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    server_ms_per_token: float | None = None
    server_prompt_ms: float | None = None
    server_drafted: int | None = None
    server_accepted: int | None = None
    server_spec_steps: int | None = None
    server_accepted_per_pos: list[int] | None = None  # Prometheus deltas around the run (vLLM)
    kinds_from: str = "tokens only"  # "the server, per step" | "the server's per-step arrays" | "inferred"
    chunks: int = 0
    client_ms: float = 0.0  # this process's time parsing and assembling the stream (wall clock)
    client_cpu_ms: float = 0.0  # the same span in the consuming thread's CPU time: what preemption does not inflate
    read_cpu_ms: float = 0.0  # the reader thread's CPU time: the HTTP reads (http.client) before any parsing
    failed: str | None = None  # why the run ended early (its rounds so far are kept)
    note: str | None = None  # what else a user should know (a server that sent past max_new_tokens)

    @property
    def server_acceptance(self) -> float | None:
        if self.server_drafted:
            return (self.server_accepted or 0) / self.server_drafted
        return None

    @property
    def client_ms_per_chunk(self) -> float | None:
        return self.client_ms / self.chunks if self.chunks else None

    @property
    def client_cpu_ms_per_chunk(self) -> float | None:
        return self.client_cpu_ms / self.chunks if self.chunks else None

    @property
    def read_cpu_ms_per_chunk(self) -> float | None:
        return self.read_cpu_ms / self.chunks if self.chunks else None

    @property
    def client_total_cpu_ms_per_chunk(self) -> float | None:
        """All of the client's CPU time per chunk: reading the HTTP stream and parsing it."""
        return (self.read_cpu_ms + self.client_cpu_ms) / self.chunks if self.chunks else None

    def as_settings(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v is not None and not isinstance(v, list)}
        if self.server_accepted_per_pos:
            d["server_accepted_per_pos"] = " ".join(map(str, self.server_accepted_per_pos))
        d["backend"] = "endpoint"
        return d
