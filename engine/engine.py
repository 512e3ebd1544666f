"""Engine: one model, one static KV cache, and the plain decoding loop that yields Round events.

`generate()` consumes the same `stream()` the UI consumes, so the figures a user sees and the figures a
benchmark prints come from one loop. A step's only host sync is reading the sampled id back.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator

import torch

from engine import ops
from engine.kv_cache import KVCache
from engine.model import Transformer
from engine.sampling import SamplingParams, greedy_rows, on_host, sample, shown_at, shown_one
from engine.stats import Round, Stats, Token
from engine.timing import Clock, now_ms

KV_BLOCK = 128  # eager calls read the cache up to the live length rounded up to this


def check_window(window: int | None, sinks: int) -> tuple[int | None, int]:
    if window is not None and not (isinstance(window, int) and window >= 1):
        raise ValueError(f"window={window!r} must be a positive number of positions, or None for full attention")
    if not (isinstance(sinks, int) and sinks >= 0):
        raise ValueError(f"sinks={sinks!r} must be a whole number of positions >= 0")
    return window, sinks if window else 0


class Engine:
    """window: None for full attention; an int W makes every decode step and verify pass attend to the
    first `sinks` positions and the last W only (StreamingLLM's attention sinks). The prompt's prefill stays
    full, and a context shorter than sinks + W is attended in full. Keys keep the rotary angle of their
    original position: the window sees its true distances, while the sinks sit ever further back, as far as
    the model was trained to look (its max_position_embeddings) but no further than full attention would
    put them; the quality cost is measured by bench/long.py, not assumed."""

    def __init__(self, model: Transformer, max_seq_len: int = 2048, batch_size: int = 1, window: int | None = None,
                 sinks: int = 4, cache: KVCache | None = None, kv_dtype: torch.dtype | None = None):
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len={max_seq_len} must be at least 2")
        self.window, self.sinks = check_window(window, sinks)
        self.model, self.config = model, model.config
        self.device, self.max_seq_len = model.device, max_seq_len
        model.ensure_rope(max_seq_len)
        # cache: one given (a layer-skip view's, over its target's layers: KVCache.layers), else its own
        # kv_dtype: the cache's element type (default: the model's kv_dtype, set by load_model's kv_cache, else the
        # activations'); the CPU kernels read fp32 or fp16 caches (csrc/cpu/attention.h)
        kv_dtype = kv_dtype or model.kv_dtype or model.dtype
        self.cache = cache or KVCache(model.config, batch_size, max_seq_len, kv_dtype, model.device)
        self.clock = Clock(model.device)
        self.graph = None  # graphs.DecodeGraphs: the step runs as graph replays when set (use_graphs)
        self.graph_status = "off: not enabled (call use_graphs(True))"
        self.bandwidth_gbs = float("nan")  # set by a caller that measured it (bench, app)
        self.weight_bytes = model.weight_bytes  # counted once: stats() is asked for many times a second live

    @property
    def kernel_status(self) -> str:
        return f"{self.model.ops.name}: {self.model.ops.reason}"

    @property
    def length(self) -> int:
        """Live positions in the cache (the cache owns it)."""
        return self.cache.length

    def use_fused(self, on: bool) -> str:
        """Switch kernels for the next run; a captured graph sees the model change and is captured again."""
        self.model.use_ops(ops.select(self.device, on, self.config.head_dim, self.model.dtype))
        return self.kernel_status

    def use_graphs(self, on: bool) -> str:
        """Choose the step's runner once: graph replays (captured now) or eager calls. Off with the reason
        on CPU, or when capture fails."""
        from engine import graphs

        self.graph = None
        if not on:
            self.graph_status = "off: switched off"
        else:
            self.graph, self.graph_status = graphs.capture(self)
        return self.graph_status

    # ---- the forward paths: the cache's length moves here and only here ---------------------------------
    def _kv_limit(self, upto: int) -> int:
        return min(self.max_seq_len, -(-upto // KV_BLOCK) * KV_BLOCK)

    def prefill(self, ids: list[int], all_logits: bool = False) -> torch.Tensor:
        """Fill the cache with the prompt; float32 logits [V] of its last token ([T, V] with all_logits)."""
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        self.cache.set_length(len(ids))
        return self.model(tokens, self.cache, "prefill", last_only=not all_logits, start=0)[0]

    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """token: [B] long -> logits [B, V]; a graph replay when graphs are on."""
        return self._forward(token[:, None])[:, -1]

    def chunk(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] on top of the cache -> logits [B, T, V] (the verify pass)."""
        return self._forward(tokens)

    def use_window(self, window: int | None, sinks: int = 4) -> str:
        """Switch the attention of the next run (see the class docstring); a captured graph holds the old one,
        so it is captured again."""
        self.window, self.sinks = check_window(window, sinks)
        if self.graph is not None:
            self.use_graphs(True)
        return self.attention_mode

    @property
    def attention_mode(self) -> str:
        return "full" if self.window is None else f"window {self.window} + {self.sinks} sinks"

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Checked on the host before anything launches: a captured step writes K/V with an index_put whose
        # positions only the device knows, and one past the cache is a device-side assert that kills the context.
        if self.cache.length + tokens.shape[1] > self.max_seq_len:
            raise ValueError(f"{tokens.shape[1]} more position(s) after {self.cache.length} exceed "
                             f"max_seq_len={self.max_seq_len}; roll back, or build the Engine with a larger "
                             "max_seq_len")
        self.cache.advance(tokens.shape[1])
        if self.graph is not None:
            return self.graph.run(tokens)
        T = tokens.shape[1]
        return self.model(tokens, self.cache, "cached", kv_limit=self._kv_limit(self.cache.length),
                          window=self.window or 0, sinks=self.sinks, start=self.cache.length - T)

    def rollback(self, n: int) -> None:
        """Keep the first n cache entries (entries past seq_len are never read, so this is a fill)."""
        self.cache.set_length(n)

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """Full-sequence logits [len(ids), V] float32 via the prefill path."""
        self.check_prompt(ids, 0)
        return self.prefill(ids, all_logits=True)

    # ---- requests ----------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids, n_after: int, what: str = "") -> None:
        """The prompt is non-empty, in the vocabulary, and fits the cache with n_after more slots."""
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [i for i in prompt_ids if not 0 <= int(i) < self.config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        if len(prompt_ids) + n_after > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens){what} = {len(prompt_ids) + n_after} exceeds "
                f"max_seq_len={self.max_seq_len}; shorten the prompt, lower max_new_tokens or raise max_seq_len"
            )

    def check_request(self, prompt_ids, max_new_tokens: int, extra: int = 0) -> None:
        """Bad input fails here, before any work, naming the value. extra: cache slots a drafter needs."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be an integer >= 1")
        what = f" + max_new_tokens ({max_new_tokens})" + (f" + {extra} draft slots" if extra else "")
        self.check_prompt(prompt_ids, max_new_tokens + extra, what)

    def begin(self, prompt_ids, max_new_tokens: int, sampling: SamplingParams, extra: int = 0) -> torch.Generator:
        self.check_request(prompt_ids, max_new_tokens, extra)
        self.clock.reset_peak()
        return sampling.generator(self.device, self.model.ops.exp_noise, self.model.ops.race)

    def greedy(self, logits: torch.Tensor) -> list[tuple[int, float, float]]:
        """Each row's (first argmax, max, logsumexp) of CPU logits [R, V] or [V] (sampling.greedy_rows): the head's
        own where these are the logits of the model's last pass."""
        return greedy_rows(logits, self.model.head_picks, self.model.ops.greedy)

    def pick(self, logits: torch.Tensor, sampling: SamplingParams, gen) -> tuple[int, float]:
        """Sample one token from logits [V]; returns (id, p_target) in one host sync."""
        if sampling.greedy and on_host(logits):
            tok_id, top, lse = self.greedy(logits)[0]
            return tok_id, math.exp(top - lse)
        tok, dist = sample(logits[None], sampling, gen, self.model.ops.softmax)
        if logits.device.type == "cpu":
            # nothing to sync with: the two numbers read directly, without the stack of doubles a device needs
            # (a default-model greedy step's pick 0.19-0.25 -> 0.12-0.19 ms, of a ~5 ms step)
            tok_id = int(tok[0])
            return tok_id, shown_one(logits, tok_id, dist, sampling, self.model.ops.logsumexp)
        shown = shown_at(logits[None], tok.new_zeros(1), tok, dist, sampling, self.model.ops.logsumexp)
        tok_id, p = torch.stack((tok[0].double(), shown[0].double())).tolist()
        return int(tok_id), p

    @torch.inference_mode()
    def stream(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = 0, stop_ids=None) -> Iterator[Round]:
        """Plain decoding: round 0 is the prefill (its token is the first output), then one round a step."""
        sampling = SamplingParams(temperature, top_p, top_k, seed)
        gen = self.begin(prompt_ids, max_new_tokens, sampling)
        stop = set(self.model.eos_ids if stop_ids is None else stop_ids)
        t0 = time.perf_counter()
        token = None
        for i in range(max_new_tokens):
            start = now_ms(t0)
            a = self.clock.mark()
            logits = self.prefill(list(prompt_ids)) if i == 0 else self.decode(token)[0]
            b = self.clock.mark()
            tok_id, p = self.pick(logits, sampling, gen)
            c = self.clock.mark()
            done = tok_id in stop or i == max_new_tokens - 1
            yield Round(i, [Token(tok_id, "target", p_target=p)], start, now_ms(t0),
                        target_ms=self.clock.ms(a, b), sample_ms=self.clock.ms(b, c), finished=done)
            if done:
                return
            token = torch.tensor([tok_id], device=self.device)

    def stats(self, rounds: list[Round], prompt_len: int, settings: dict | None = None) -> Stats:
        return Stats(rounds, prompt_len, settings or {}, peak_memory_mb=self.clock.peak_memory_mb(),
                     weight_bytes=self.weight_bytes, bandwidth_gbs=self.bandwidth_gbs)

    def generate(self, prompt_ids, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = 0, stop_ids=None) -> tuple[list[int], Stats]:
        settings = dict(mode="plain", max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        top_k=top_k, seed=seed)
        rounds = list(self.stream(prompt_ids, max_new_tokens, temperature, top_p, top_k, seed, stop_ids))
        stats = self.stats(rounds, len(prompt_ids), settings)
        return stats.ids, stats
