"""Profile a serving engine through its OpenAI-compatible endpoint: a streaming client that turns the server's
SSE chunks into the Round events engine.stats defines, so the page, the CLI, the exports and the benchmarks read
a remote engine's run the way they read ours. The servers' own fields live in one table (servers.SERVERS).

    ep = Endpoint("http://127.0.0.1:8080/v1", api_key=os.environ.get("KEY"))
    run = stream(ep, "Write a haiku", max_new_tokens=64)
    for rnd in run: ...                     # Round events as chunks arrive
    stats = endpoint_stats(rounds, run.info, settings)
"""
from engine.endpoint.client import EndpointStream, stream
from engine.endpoint.config import Endpoint, EndpointInfo, check_url
from engine.endpoint.errors import EndpointError, redact
from engine.endpoint.servers import AUTO, SERVER_CHOICES, SERVERS
from engine.endpoint.summary import endpoint_stats, extra_summary, format_extra

__all__ = ["AUTO", "SERVERS", "SERVER_CHOICES", "Endpoint", "EndpointError", "EndpointInfo", "EndpointStream",
           "check_url", "endpoint_stats", "extra_summary", "format_extra", "redact", "stream"]
