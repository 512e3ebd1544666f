"""The drafters behind speculative decoding: prompt lookup (n-gram) and a second model (a smaller one, or the
target itself in a cheaper weight format). Layer skipping lives in engine/speculative/layerskip.py.

Protocol (speculative.stream drives it; a test can implement it too):
  begin(target, prompt_ids, sampling, extra)  once per run, before the target's prefill; validates against
                                              the target; extra = cache slots the run may use past the prompt
  commit(n_accepted, emitted)                 after every round (round 0 included): `emitted` are the new
                                              tokens of the sequence, the first n_accepted of them this
                                              drafter's own drafts; the drafter rolls back or catches up
  context() -> key | None                     before a round: what the next proposal rests on (None: nothing
                                              to propose, the round is a plain step); the schedule keeps
                                              acceptance statistics per key (engine/speculative/schedule.py)
  propose(k, sampling, gen) -> Draft          up to k tokens following the sequence committed so far
  prior(key) -> float                         the acceptance expected for a key before any evidence
  draft_cost                                  a draft token's cost over a plain step's where known without
                                              measuring (0 for a lookup), else None
  remember_cost(ratio)                        the ratio the schedule measured, for the drafter's next run

Drafts live on the device and proposing reads nothing back from it, so a round's one device-to-host read
is the outcome of the acceptance step.
"""
from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import NamedTuple

import torch

from engine.sampling import SamplingParams, sample, shown_probs


GRAPHED_CATCH_UP = 8


class Draft(NamedTuple):
    ids: torch.Tensor  # [k] long, on the target's device; k may be 0
    probs: torch.Tensor | None  # [k, V] the distributions the ids were drawn from; None: one-hot on the ids
    p: torch.Tensor | None  # [k] the drafter's probability of each id, for display (softmax when greedy)


class Drafter:
    name = "drafter"
    draft_cost: float | None = None

    def begin(self, target, prompt_ids: list[int], sampling: SamplingParams, extra: int) -> None:
        pass

    def context(self) -> Hashable | None:
        return 0

    def prior(self, key: Hashable) -> float:
        return 0.5

    def propose(self, k: int, sampling: SamplingParams, gen) -> Draft:
        raise NotImplementedError

    def commit(self, n_accepted: int, emitted: list[int]) -> None:
        pass

    def remember_cost(self, ratio: float) -> None:
        pass

    def describe(self) -> dict:
        return {"drafter": self.name}


class NgramDrafter(Drafter):
    """Prompt lookup: the longest suffix (max_n down to min_n tokens) seen before proposes what followed it.

    `index` maps each n-gram that already has a follower to its latest start, updated as tokens arrive, so
    a lookup costs max_n dict probes at any length. The copy may run past the end of the sequence; it then
    continues from its own proposal, which extends a repeating pattern (a loop, a list) periodically.
    The context is the match's length, followed back past max_n up to MATCH_CAP tokens and bucketed (1, 2-3,
    4+): a one-token match in prose is a guess, a long match inside a quoted passage is a copy, and the
    schedule learns each bucket's acceptance separately, so only matches long enough to pay for a verify
    pass draft. With
    no match the round is a plain decode step. A one-hot proposal keeps speculative sampling exact
    (acceptance probability p_target(x))."""

    name = "ngram"
    draft_cost = 0.0  # dict probes: nothing next to a forward pass
    MATCH_CAP = 4
    BUCKETS = {1: 1, 2: 2, 3: 2, 4: 4}  # match length (capped) -> context
    PRIORS = {1: 0.15, 2: 0.35, 4: 0.6}  # by context, before any evidence

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.device = torch.device("cpu")
        self.match: tuple[int, int] | None = None  # (where the copy starts, match length) of the last lookup

    def begin(self, target, prompt_ids, sampling=None, extra=0) -> None:
        self.device = target.device if target is not None else torch.device("cpu")
        self.tokens, self.index, self.match = [], {}, None
        self.extend(prompt_ids)

    def extend(self, ids) -> None:
        for tok in ids:
            p = len(self.tokens)  # position of tok: every n-gram ending at p-1 now has a follower
            for n in range(self.min_n, min(self.max_n, p) + 1):
                self.index[tuple(self.tokens[p - n:p])] = p - n
            self.tokens.append(int(tok))
        self.match = None

    def find(self) -> tuple[int, int] | None:
        """(position the copy starts at, match length) of the longest suffix seen before, or None."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            start = self.index.get(tuple(toks[-n:]))
            if start is not None:
                length = n
                while (length < self.MATCH_CAP and start - (length - n) > 0
                       and toks[start - (length - n) - 1] == toks[len(toks) - length - 1]):
                    length += 1
                return start + n, length
        return None

    def context(self) -> int | None:
        self.match = self.find()
        return None if self.match is None else self.BUCKETS[min(self.match[1], self.MATCH_CAP)]

    def prior(self, key) -> float:
        return self.PRIORS[key]

    def lookup(self, k: int) -> list[int]:
        match = self.match or self.find()
        if match is None:
            return []
        toks, src, out = self.tokens, match[0], []
        for j in range(k):
            out.append(toks[src + j] if src + j < len(toks) else out[src + j - len(toks)])
        return out

    def propose(self, k, sampling=None, gen=None) -> Draft:
        return Draft(torch.tensor(self.lookup(k), dtype=torch.long, device=self.device), None, None)

    def commit(self, n_accepted, emitted) -> None:
        self.extend(emitted)

    def describe(self) -> dict:
        return {"drafter": self.name, "max_n": self.max_n, "min_n": self.min_n}


class ModelDrafter(Drafter):
    """A second model with the same vocabulary, on its own Engine and KV cache: a smaller model, or the target
    itself in a cheaper weight format (quantized self-drafting, see self_drafter).

    Its cache holds the committed sequence except `pending` (normally just the last emitted token). A
    proposal feeds pending (one decode step, or a chunk after a round that accepted every draft, or after
    plain rounds the schedule chose: those tokens were never fed) and then k-1 more decode steps, graph
    replays when the draft engine has graphs. commit() keeps the accepted drafts' entries by rolling back
    to the end of them. The cost of a draft over a target step, once measured, is kept for the next run
    against the same target and kernels, so a drafter found too slow is not probed again."""

    name = "draft_model"

    def __init__(self, draft_engine):
        self.engine = draft_engine
        self.pending: list[int] = []
        self.cached = 0  # sequence tokens whose K/V is in the draft cache
        self.written = 0  # drafts written into the cache by the last proposal
        self.checked = None  # the target engine the tokenizers were compared against
        self.costs: dict[tuple, float] = {}  # cost_key -> measured draft-token ms over a plain step's
        self.cost_key: tuple = ()

    @property
    def draft_cost(self) -> float | None:
        return self.costs.get(self.cost_key)

    def remember_cost(self, ratio: float) -> None:
        self.costs[self.cost_key] = ratio

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
        self.cost_key = (id(target), target.kernel_status, target.graph_status, e.kernel_status, e.graph_status,
                         e.config.n_layers)
        e.check_prompt(prompt_ids, extra, f" + {extra} generated and draft slots (draft model)")
        e.prefill(list(prompt_ids))
        self.cached, self.pending, self.written = len(prompt_ids), [], 0

    def propose(self, k, sampling, gen) -> Draft:
        e = self.engine
        feed = torch.tensor(self.pending, dtype=torch.long, device=e.device)
        # graphs are captured per token count: catch up in blocks of at most GRAPHED_CATCH_UP so the plain rounds
        # before a proposal (any number of them) never capture a graph per count
        step = GRAPHED_CATCH_UP if e.graph is not None else len(feed)
        for i in range(0, len(feed), step):
            part = feed[i:i + step]
            logits = e.decode(part) if len(part) == 1 else e.chunk(part[None])[:, -1]  # [1, V]
        self.cached, self.pending = self.cached + len(feed), []
        ids, rows, ps = [], [], []
        for i in range(k):
            if i:
                logits = e.decode(ids[-1])
            tok, row = sample(logits, sampling, gen)  # [1], [1, V] (None when greedy)
            if row is not None:
                rows.append(row)  # kept: a graph's logits buffer is overwritten by the next step
            ps.append(shown_probs(logits, row, sampling).gather(1, tok[:, None])[:, 0])
            ids.append(tok)
        self.written = k - 1
        return Draft(torch.cat(ids), torch.cat(rows) if rows else None, torch.cat(ps))

    def commit(self, n_accepted, emitted) -> None:
        keep = min(n_accepted, self.written)
        self.cached += keep
        self.engine.rollback(self.cached)
        self.pending += list(emitted[keep:])
        self.written = 0

    def describe(self) -> dict:
        path = self.engine.model.path
        return {"drafter": self.name, "draft_model": str(path) if path else "in-memory",
                "draft_layers": self.engine.config.n_layers, "draft_weights": self.engine.model.weight_format}


def self_drafter(target, weights: str = "q4") -> ModelDrafter:
    """Quantized self-drafting: the target's own checkpoint in a cheaper weight format drafts for it, on its own
    engine and cache. Same tokenizer, near-target acceptance, a second copy of the weights at a fraction of the
    bytes (for the default model q4 is its own GGUF blocks: lossless, so acceptance is ~1)."""
    from engine.engine import Engine
    from engine.checkpoint import load_model

    m = target.model
    if m.path is None:
        raise ValueError("self-drafting loads the target's checkpoint again; this target has no folder")
    if weights == m.weight_format:
        raise ValueError(f"the target already runs {weights} weights; self-drafting needs a cheaper format")
    draft = load_model(m.path, device=target.device, dtype=m.dtype, weights=weights, fused=m.ops.name == "fused",
                       progress=lambda msg: None)
    return ModelDrafter(Engine(draft, target.max_seq_len))


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
