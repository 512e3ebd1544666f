"""What each serving engine reports about its own decoding, in one table: where a streamed chunk says how many
tokens it carries, where the server's clock and its speculative counters are, what to add to the request to get
them, and how to tell the server apart. Every field name below was read in that project's own source or docs.

A field is a dotted path into a chunk's JSON (`choices.0.token_ids`); `a|b` tries a, then b (servers renamed
fields between releases). A "total" is a running count: a server that repeats it on every chunk (llama-server
with timings_per_token) gives per-step deltas, one that sends it once at the end gives the run's figure.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

GENERIC = "openai"
AUTO = "auto"


@dataclass(frozen=True)
class ServerFields:
    name: str
    label: str
    request: dict = field(default_factory=dict)  # added to every request body
    probe: tuple[str, str] | None = None  # (GET path from the server root, a key its JSON answer has)
    version: str | None = None  # where the probe's answer names the server's version
    token_ids: str | None = None  # the chunk's own token ids
    tokens_total: str | None = None  # running count of generated tokens
    step_clock: str | None = None  # a value that changes once per decode step and not between a step's chunks
    step_ms_total: str | None = None  # the server's generation time so far, ms
    prompt_ms: str | None = None  # the server's prefill time, ms
    ms_per_token: str | None = None  # the server's own decode time per token (first token excluded)
    drafted_total: str | None = None  # draft tokens verified so far
    accepted_total: str | None = None  # of those, accepted
    spec_steps: str | None = None  # verify steps
    per_step_accepted: str | None = None  # accepted drafts of each verify step, in order
    per_step_drafted: str | None = None  # drafts of each verify step, in order
    accepted_histogram: str | None = None  # index j: verify steps that accepted exactly j drafts
    prometheus: dict = field(default_factory=dict)  # figure -> counter on GET /metrics (deltas around a run)
    note: str = ""  # what a user should know about this server's stream


SERVERS: dict[str, ServerFields] = {s.name: s for s in (
    # llama.cpp's llama-server (the tree in llama-cpp-python 0.3.36, llama.cpp@0c1e57098), tools/server/:
    # - server-schema.cpp:20 and server-task.h:75: `timings_per_token` asks for `timings` on every chunk;
    #   server-context.cpp:2062-2064 copies the slot's stats into each partial response when it is set.
    # - server-common.cpp:84-104 (server_slot_stats::to_json): prompt_n/prompt_ms, predicted_n (tokens so far),
    #   predicted_ms, predicted_per_token_ms, and draft_n / draft_n_accepted once anything was drafted.
    # - server-common.h:402-441: predicted_ms is t_gen_last - t_prompt_last; predicted_per_token_ms divides it by
    #   predicted_n - 1 (the first token comes with the prompt).
    # - server-context.cpp:3955-3995: a verify step calls update_gen_last() once, adds its accepted count, then
    #   sends each of its tokens as its own partial response: a step's chunks share predicted_ms and draft_n.
    # - server-task.cpp:1111-1160: the chat stream's chunk carries `timings` on its last delta; no chunk is sent
    #   for a token whose text is held back (a partial stop string), so predicted_n is what counts tokens.
    # - server.cpp:254 GET /props answers with `build_info` (server-context.cpp:4614).
    ServerFields(
        name="llama-server", label="llama.cpp llama-server",
        request={"timings_per_token": True},
        probe=("/props", "build_info"), version="build_info",
        tokens_total="timings.predicted_n", step_clock="timings.predicted_ms",
        step_ms_total="timings.predicted_ms", prompt_ms="timings.prompt_ms",
        ms_per_token="timings.predicted_per_token_ms",
        drafted_total="timings.draft_n", accepted_total="timings.draft_n_accepted",
        note="one chunk per token; a verify step's tokens are told apart by the server's step clock",
    ),
    # vLLM:
    # - vllm/entrypoints/openai protocol, `return_token_ids`: "In streaming mode ... token_ids contains the delta
    #   tokens for each chunk"; `stream_options.continuous_usage_stats` puts usage on every chunk.
    # - docs/features/speculative_decoding/acceptance_metrics.md (vLLM >= 0.29, server flag
    #   --per-request-spec-decode-metrics summary|detailed), lines 42-59: `metrics.speculative_decoding` with
    #   num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram; lines 84-89: `detailed`
    #   adds per_step_accepted / per_step_drafted; lines 95-99: in a stream it rides the final usage chunk
    #   (stream_options.include_usage); lines 101-111: they reconcile with the Prometheus counters below.
    # - vllm/v1/spec_decode/metrics.py (SpecDecodingProm): counters vllm:spec_decode_num_drafts,
    #   _num_draft_tokens, _num_accepted_tokens, _num_accepted_tokens_per_pos{position=...}; the text format adds
    #   `_total` to a counter's name.
    # - GET /version answers {"version": ...}.
    ServerFields(
        name="vllm", label="vLLM",
        request={"return_token_ids": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        probe=("/version", "version"), version="version",
        token_ids="choices.0.token_ids", tokens_total="usage.completion_tokens",
        drafted_total="metrics.speculative_decoding.num_draft_tokens",
        accepted_total="metrics.speculative_decoding.num_accepted_draft_tokens",
        spec_steps="metrics.speculative_decoding.num_spec_steps",
        per_step_accepted="metrics.speculative_decoding.per_step_accepted",
        per_step_drafted="metrics.speculative_decoding.per_step_drafted",
        accepted_histogram="metrics.speculative_decoding.acceptance_histogram",
        prometheus={"drafts": "vllm:spec_decode_num_drafts_total",
                    "drafted": "vllm:spec_decode_num_draft_tokens_total",
                    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
                    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total"},
        note="one chunk per engine step (a verify step's tokens arrive together); per-request acceptance needs "
             "--per-request-spec-decode-metrics on the server",
    ),
    # SGLang:
    # - python/sglang/srt/managers (fill_spec_decoding_meta; earlier tokenizer_manager.py
    #   _calculate_spec_decoding_metrics): meta_info spec_verify_ct, spec_num_correct_drafts /
    #   spec_num_proposed_drafts (earlier spec_accepted_drafts / spec_proposed_drafts, and before that
    #   spec_accept_token_num / spec_draft_token_num), spec_correct_drafts_histogram (alias spec_accept_histogram).
    # - python/sglang/srt/entrypoints/openai/serving_chat.py refuses `return_meta_info` with stream=true
    #   ("return_meta_info is not supported with streaming"): on /v1 streams these fields never come, so
    #   acceptance is inferred there.
    # - GET /get_server_info answers with the server's arguments and `version`.
    ServerFields(
        name="sglang", label="SGLang",
        probe=("/get_server_info", "version"), version="version",
        tokens_total="meta_info.completion_tokens",
        drafted_total="meta_info.spec_num_proposed_drafts|meta_info.spec_proposed_drafts|meta_info.spec_draft_token_num",
        accepted_total="meta_info.spec_num_correct_drafts|meta_info.spec_accepted_drafts|meta_info.spec_accept_token_num",
        spec_steps="meta_info.spec_verify_ct",
        accepted_histogram="meta_info.spec_correct_drafts_histogram|meta_info.spec_accept_histogram",
        note="one chunk per engine step; its /v1 streams carry no speculative counters (meta_info is refused "
             "with stream=true), so multi-token chunks are shown as inferred",
    ),
    ServerFields(name=GENERIC, label="OpenAI-compatible (generic)",
                 note="only the standard fields: tokens per chunk from logprobs or re-tokenized text"),
)}

SERVER_CHOICES = (AUTO, *SERVERS)


@functools.cache
def _compiled(path: str) -> tuple[tuple[tuple[str, int | None], ...], ...]:
    """A path split once: its alternatives, each a tuple of (key, the key as a list index or None)."""
    return tuple(tuple((k, int(k) if k.isdigit() else None) for k in alt.split(".")) for alt in path.split("|"))


def lookup(obj, path: str | None):
    """The value at a dotted path (`a|b`: the first that is there), or None. Runs on every streamed chunk, so
    a path is split once (_compiled) and each step is one type check."""
    if not path:
        return None
    for keys in _compiled(path):
        cur = obj
        for key, index in keys:
            if type(cur) is dict:
                cur = cur.get(key)
            elif type(cur) is list and index is not None and index < len(cur):
                cur = cur[index]
            else:
                cur = None
            if cur is None:
                break
        if cur is not None:
            return cur
    return None


def server(name: str) -> ServerFields:
    if name not in SERVERS:
        raise ValueError(f"server {name!r} is not one of {', '.join(SERVER_CHOICES)}")
    return SERVERS[name]
