"""The drafters behind speculative decoding: a second model (a smaller one, or the target itself in a cheaper
weight format: selfdraft.py) here; prompt lookup in engine/speculative/lookup.py, layer skipping in layerskip.py.

Protocol (speculative.stream drives it; a test can implement it too):
  begin(target, prompt_ids, sampling, extra)  once per run, before the target's prefill; validates against
                                              the target; extra = cache slots the run may use past the prompt
  commit(n_accepted, emitted)                 after every round (round 0 included, the last as the run ends):
                                              `emitted` are the new tokens, the first n_accepted of them this
                                              drafter's own drafts; the drafter rolls back or notes them
  context() -> key | None                     before a round: what the next proposal rests on (None: nothing
                                              to propose, the round is a plain step); the schedule keeps
                                              acceptance statistics per key (engine/speculative/schedule.py)
  prepare()                                   before a proposal: catch up with the tokens the drafter has not
                                              seen (a model feeds what plain rounds emitted); timed apart, as
                                              the round's overhead, so a draft token's measured cost is the
                                              drafting alone
  propose(k, sampling, noise) -> Draft        up to k tokens following the sequence committed so far; a drafter
                                              that samples draws draft i with noise.take (the loop has set
                                              the cursor to the first draft's output position), so its draws
                                              share the target's keyed noise (loop.py says why)
  prior(key) -> float                         the acceptance expected for a key before any evidence
  draft_cost                                  a draft token's cost over a plain step's where known without
                                              measuring (0 for a lookup, a recent measurement), else None
  remember_cost(ratio)                        the ratio the schedule measured, for the drafter's next runs
  reprobe, remember_reprobe(rounds)           likewise the plain rounds the schedule waits before measuring a
                                              drafter too costly to pay again (None: start at REPROBE)
  sits_out                                    set by begin: why drafting cannot pay in this run, by the
                                              drafter's own model (None: the schedule judges each round); the
                                              adaptive schedule then makes every round a plain step, no probes

Drafts live on the device and proposing reads nothing back from it, so a round's one device-to-host read
is the outcome of the acceptance step.
"""
from __future__ import annotations

import json
import time
from collections.abc import Hashable
from pathlib import Path
from typing import NamedTuple

import torch

from engine.sampling import SamplingParams, on_host, sample, shown_at


GRAPHED_CATCH_UP = 8
COST_TTL_S = 120.0  # a measured draft cost is trusted this long by later runs; the machine's load moves it


class Draft(NamedTuple):
    ids: torch.Tensor  # [k] long, on the target's device; k may be 0
    probs: torch.Tensor | None  # [k, V] the distributions the ids were drawn from (shown as p_draft); None: one-hot
    p: torch.Tensor | None  # [k] the drafter's probability of each id, for display (softmax when greedy)


class Drafter:
    name = "drafter"
    draft_cost: float | None = None
    chosen: str | None = None  # why a self-drafter is this one (engine/speculative/selfdraft.py)
    sits_out: str | None = None  # why no round of this run can pay (the adaptive schedule drafts none)
    reprobe: int | None = None  # the wait before re-measuring a costly drafter its last run reached (ModelDrafter)

    def begin(self, target, prompt_ids: list[int], sampling: SamplingParams, extra: int) -> None:
        pass

    def prefilled(self) -> torch.Tensor | None:
        """The target's prefill logits [V] where begin() already filled the target's cache with the prompt (a
        calibrated layer-skip drafter's short prompt), handed out once; None: the loop runs the prefill."""
        return None

    def context(self) -> Hashable | None:
        return 0

    def prior(self, key: Hashable) -> float:
        return 0.5

    def prepare(self) -> None:
        pass

    def propose(self, k: int, sampling: SamplingParams, noise) -> Draft:
        raise NotImplementedError

    def commit(self, n_accepted: int, emitted: list[int]) -> None:
        pass

    def remember_cost(self, ratio: float) -> None:
        pass

    def remember_reprobe(self, rounds: int) -> None:
        pass

    def describe(self) -> dict:
        return {"drafter": self.name}


class ModelDrafter(Drafter):
    """A second model with the same vocabulary on its own Engine: a smaller model, or the target itself in a
    cheaper weight format (quantized self-drafting, see self_drafter).

    The target's own checkpoint in another format (same config, dtype and folder) drafts over the target's KV
    cache, as a layer-skip view does (KVCache.layers): no cache, prefill or catch-up of its own; a proposal
    starts at the target's length and writes past it, where the verify pass writes the target's own entries.
    Another model keeps its own cache, holding the committed sequence except `pending` (normally just the last
    emitted token; after a round that accepted every draft, that draft and the bonus; after plain rounds the
    schedule chose, what they emitted). prepare() feeds all of pending but the last two tokens (the catch-up),
    and a proposal of k tokens is k forwards: the rest of pending (one token, or a chunk of two costing about a
    step), then k-1 decode steps, graph replays when the draft engine has graphs.
    commit() keeps the accepted drafts' entries by rolling back to the end of them. The cost of a draft over a
    target step, once measured, is kept for later runs against the same target and kernels for COST_TTL_S
    seconds: a drafter found too slow skips the probe for a while, and is measured again once the machine's
    load may have changed. The schedule's wait before measuring it again (REPROBE rounds, doubled by each probe
    that found it still too slow) is kept alike, so runs in a row do not each pay a probe (and a draft model's
    catch-up of every token since its last draft) at the first interval."""

    name = "draft_model"

    def __init__(self, draft_engine):
        self.engine = draft_engine
        self.target = None  # the target whose cache the draft engine runs on, while it does
        self.pending: list[int] = []
        self.cached = 0  # sequence tokens whose K/V is in the draft cache
        self.written = 0  # drafts written into the cache by the last proposal
        self.checked = None  # the target engine the tokenizers were compared against
        self.costs: dict[tuple, tuple[float, float]] = {}  # cost_key -> (draft ms over a plain step's, when)
        self.reprobes: dict[tuple, int] = {}  # cost_key -> the schedule's last wait before a re-measurement
        self.cost_key: tuple = ()

    @property
    def draft_cost(self) -> float | None:
        ratio, when = self.costs.get(self.cost_key, (None, 0.0))
        return ratio if time.monotonic() - when < COST_TTL_S else None

    def remember_cost(self, ratio: float) -> None:
        self.costs[self.cost_key] = (ratio, time.monotonic())

    @property
    def reprobe(self) -> int | None:
        """The wait the last run reached, while its cost measurement is trusted (draft_cost); else None."""
        return self.reprobes.get(self.cost_key) if self.draft_cost is not None else None

    def remember_reprobe(self, rounds: int) -> None:
        self.reprobes[self.cost_key] = rounds

    def begin(self, target, prompt_ids, sampling, extra) -> None:
        e = self.engine
        if e is target:
            raise ValueError("the draft engine is the target engine; give the drafter its own Engine(model), "
                             "since the two caches hold different sequences")
        if e.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft model vocab_size={e.config.vocab_size} differs from the target's "
                             f"vocab_size={target.config.vocab_size}; a draft model must share the tokenizer")
        if e.device != target.device:
            raise ValueError(f"draft model is on {e.device}, the target on {target.device}; load both on one device")
        if self.checked is not target:  # reading two tokenizer.json files costs tens of ms: once per target
            check_tokenizers(e.model.path, target.model.path)
            self.checked = target
        if self.on_cache_of(target):
            self.start(target, len(prompt_ids))  # no prefill: the target's own fills the cache the draft reads
            return
        e.check_prompt(prompt_ids, extra, f" + {extra} generated and draft slots (draft model)")
        e.prefill(list(prompt_ids))
        self.start(target, len(prompt_ids))

    def on_cache_of(self, target) -> bool:
        """Whether the draft runs on the target's KV cache: it does where it is the target's own checkpoint (its
        K/V then mean what the draft's would), switched over here the first time (a captured graph recaptured)."""
        e = self.engine
        if e.cache.source is target.cache:
            self.target = target
            return True
        same = (e.config == target.config and e.model.dtype == target.model.dtype and e.model.path is not None
                and e.model.path == target.model.path)
        self.target = target if same else None
        if same:
            e.cache = target.cache.layers(range(e.config.n_layers), e.config)
            if e.graph is not None:
                e.use_graphs(True)
        return same

    def start(self, target, n_prompt: int) -> None:
        """A run's bookkeeping, once the draft cache holds the prompt's n_prompt tokens."""
        e = self.engine
        self.cost_key = (id(target), target.kernel_status, target.graph_status, e.kernel_status, e.graph_status,
                         e.config.n_layers)
        self.cached, self.pending, self.written = n_prompt, [], 0

    def prepare(self) -> None:
        e = self.engine
        if self.target is not None:  # on the target's cache: nothing to catch up, it starts where that ends
            e.rollback(self.target.length)
            self.cached, self.pending = self.target.length, self.pending[-1:]
            return
        feed = torch.tensor(self.pending[:-2], dtype=torch.long, device=e.device)
        # graphs are captured per token count: catch up in blocks of at most GRAPHED_CATCH_UP so the plain rounds
        # before a proposal (any number of them) never capture a graph per count
        step = GRAPHED_CATCH_UP if e.graph is not None else max(1, len(feed))
        for i in range(0, len(feed), step):
            part = feed[i:i + step]
            e.decode(part) if len(part) == 1 else e.chunk(part[None])
        self.cached, self.pending = self.cached + len(feed), self.pending[-2:]

    def propose(self, k, sampling, noise) -> Draft:
        e = self.engine
        assert 1 <= len(self.pending) <= 2, "prepare() leaves the last one or two pending tokens"
        feed = torch.tensor(self.pending, dtype=torch.long, device=e.device)
        logits = e.decode(feed) if len(feed) == 1 else e.chunk(feed[None])[:, -1]  # [1, V]
        self.cached, self.pending = self.cached + len(feed), []
        ids, rows, ps = [], [], []
        for i in range(k):
            if i:
                logits = e.decode(ids[-1])
            if sampling.greedy and on_host(logits):  # Engine.pick's: the head's own pick where it made one
                best, shown = e.pick(logits[0], sampling, None)
                tok, p = torch.tensor([best]), torch.tensor([shown])
            else:
                tok, row = sample(logits, sampling, noise, e.model.ops.softmax)  # [1], [1, V] (None when greedy)
                if row is not None:
                    rows.append(row)  # kept: a graph's logits buffer is overwritten by the next step
                p = shown_at(logits, tok.new_zeros(1), tok, row, sampling, e.model.ops.logsumexp)
            ps.append(p)
            ids.append(tok)
        self.written = k - 1
        return Draft(torch.cat(ids), torch.cat(rows) if rows else None, torch.cat(ps))

    def commit(self, n_accepted, emitted) -> None:
        if self.target is not None:
            self.pending, self.written = (self.pending + list(emitted))[-1:], 0
            return
        keep = min(n_accepted, self.written)
        self.cached += keep
        self.engine.rollback(self.cached)
        self.pending += list(emitted[keep:])
        self.written = 0

    def describe(self) -> dict:
        path = self.engine.model.path
        return {"drafter": self.name, "draft_model": str(path) if path else "in-memory",
                "draft_layers": self.engine.config.n_layers, "draft_weights": self.engine.model.weight_format}


def check_tokenizers(draft_path, target_path) -> None:
    """Same vocabulary size is not enough: ids must mean the same strings. Compared when both have folders."""
    if draft_path is None or target_path is None or Path(draft_path).resolve() == Path(target_path).resolve():
        return
    files = [Path(p) / "tokenizer.json" for p in (draft_path, target_path)]
    if not all(f.is_file() for f in files):
        return
    vocabs = [_vocab(f) for f in files]
    if vocabs[0] != vocabs[1]:
        diff = sorted(set(vocabs[0].items()) ^ set(vocabs[1].items()))
        raise ValueError(f"the draft model's tokenizer ({files[0]}) differs from the target's ({files[1]}): "
                         f"{len(diff)} (token, id) pairs differ, e.g. {diff[0]}; pick a draft model from the "
                         "same family")


def _vocab(file: Path) -> dict[str, int]:
    d = json.loads(file.read_text(encoding="utf-8"))
    vocab = dict(d.get("model", {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in d.get("added_tokens", [])})
    return vocab
