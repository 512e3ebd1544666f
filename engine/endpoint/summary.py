"""An endpoint run's Stats and the figures only an endpoint has: the gap per chunk beside the gap per token, and
the server's own numbers next to what this client measured."""
from __future__ import annotations

from engine.endpoint.config import EndpointInfo
from engine.stats import Round, Stats, finite, percentile


def endpoint_stats(rounds: list[Round], info: EndpointInfo, settings: dict | None = None,
                   prompt_len: int | None = None) -> Stats:
    """Stats over the run's rounds; the prompt length is the server's (usage), else the caller's count."""
    n_prompt = info.prompt_tokens if info.prompt_tokens is not None else (prompt_len or 0)
    return Stats(rounds, n_prompt, {**(settings or {}), **info.as_settings()})


def extra_summary(stats: Stats, info: EndpointInfo) -> dict:
    """Per-chunk gaps (a round is one step's delivery: n tokens in it are one gap, not n), tokens per chunk, the
    server's per-token time and acceptance, and this client's own cost per chunk (the CPU time of its
    HTTP reads and its parsing: the wall clock would also count other processes' turns on the core)."""
    gaps = [r.total_ms for r in stats.rounds[1:]]
    per_round = [len(r.emitted) for r in stats.rounds]
    return dict(
        chunk_itl_mean_ms=sum(gaps) / len(gaps) if gaps else float("nan"),
        chunk_itl_p50_ms=percentile(gaps, 50),
        chunk_itl_p99_ms=percentile(gaps, 99),
        tokens_per_chunk=sum(per_round) / len(per_round) if per_round else float("nan"),
        server_ms_per_token=info.server_ms_per_token,
        server_acceptance=info.server_acceptance,
        client_ms_per_chunk=info.client_ms_per_chunk,
        client_cpu_ms_per_chunk=info.client_total_cpu_ms_per_chunk,
        tokens_from=info.tokens_from,
        kinds_from=info.kinds_from,
        stop_reason=info.stop_reason,
        server=" ".join(x for x in (info.server, info.server_version) if x),
    )


def format_extra(x: dict) -> str:
    """One line for the CLI and the page."""
    def ms(v):
        return f"{v:.2f} ms" if finite(v) is not None else "n/a"

    parts = [f"{x['server'] or 'server'}",
             f"ITL per chunk p50 {ms(x['chunk_itl_p50_ms'])} p99 {ms(x['chunk_itl_p99_ms'])}",
             f"{x['tokens_per_chunk']:.2f} tokens/chunk" if finite(x["tokens_per_chunk"]) is not None else None,
             f"server {ms(x['server_ms_per_token'])}/token" if x["server_ms_per_token"] is not None else None,
             f"server acceptance {100 * x['server_acceptance']:.1f}%" if x["server_acceptance"] is not None else None,
             f"client {ms(x['client_cpu_ms_per_chunk'])} CPU/chunk (HTTP reads + parsing)"
             if x["client_cpu_ms_per_chunk"] is not None else None,
             f"tokens from {x['tokens_from']}" if x["tokens_from"] else None,
             f"kinds: {x['kinds_from']}",
             f"stop: {x['stop_reason']}" if x["stop_reason"] else None]
    return " | ".join(p for p in parts if p)
