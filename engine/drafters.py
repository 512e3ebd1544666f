"""The three drafters behind speculative decoding: prompt lookup (n-gram), a second model, and the
target's own first layers (layer skip).

Protocol (speculative.stream drives it; a test can implement it too):
  begin(target, prompt_ids, sampling, extra)  once per run, before the target's prefill; validates against
                                              the target; extra = cache slots the run may use past the prompt
  commit(n_accepted, emitted)                 after every round (round 0 included): `emitted` are the new
                                              tokens of the sequence, the first n_accepted of them this
                                              drafter's own drafts; the drafter rolls back or catches up
  propose(k, sampling, gen) -> Draft          up to k tokens following the sequence committed so far

Drafts live on the device and proposing reads nothing back from it, so a round's one device-to-host read
is the outcome of the acceptance step.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from engine.sampling import SamplingParams, sample, shown_probs


class Draft(NamedTuple):
    ids: torch.Tensor  # [k] long, on the target's device; k may be 0
    probs: torch.Tensor | None  # [k, V] the distributions the ids were drawn from; None: one-hot on the ids
    p: torch.Tensor | None  # [k] the drafter's probability of each id, for display (softmax when greedy)


class Drafter:
    name = "drafter"

    def begin(self, target, prompt_ids: list[int], sampling: SamplingParams, extra: int) -> None:
        pass

    def propose(self, k: int, sampling: SamplingParams, gen) -> Draft:
        raise NotImplementedError

    def commit(self, n_accepted: int, emitted: list[int]) -> None:
        pass

    def describe(self) -> dict:
        return {"drafter": self.name}


class NgramDrafter(Drafter):
    """Prompt lookup: the longest suffix (max_n down to min_n tokens) seen before proposes what followed it.

    `index` maps each n-gram that already has a follower to its latest start, updated as tokens arrive, so
    a lookup costs max_n dict probes at any length. The copy may run past the end of the sequence; it then
    continues from its own proposal, which extends a repeating pattern (a loop, a list) periodically.
    With no match the drafter proposes nothing and the round is a plain decode step: on a CPU a verify
    pass costs more than a step, so guessing without evidence would only slow the round down. A one-hot
    proposal keeps speculative sampling exact (acceptance probability p_target(x))."""

    name = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.device = torch.device("cpu")

    def begin(self, target, prompt_ids, sampling=None, extra=0) -> None:
        self.device = target.device if target is not None else torch.device("cpu")
        self.tokens, self.index = [], {}
        self.extend(prompt_ids)

    def extend(self, ids) -> None:
        for tok in ids:
            p = len(self.tokens)  # position of tok: every n-gram ending at p-1 now has a follower
            for n in range(self.min_n, min(self.max_n, p) + 1):
                self.index[tuple(self.tokens[p - n:p])] = p - n
            self.tokens.append(int(tok))

    def lookup(self, k: int) -> list[int]:
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            start = self.index.get(tuple(toks[-n:]))
            if start is not None:
                src, out = start + n, []
                for j in range(k):
                    out.append(toks[src + j] if src + j < len(toks) else out[src + j - len(toks)])
                return out
        return []

    def propose(self, k, sampling=None, gen=None) -> Draft:
        return Draft(torch.tensor(self.lookup(k), dtype=torch.long, device=self.device), None, None)

    def commit(self, n_accepted, emitted) -> None:
        self.extend(emitted)

    def describe(self) -> dict:
        return {"drafter": self.name, "max_n": self.max_n, "min_n": self.min_n}


class ModelDrafter(Drafter):
    """A second, smaller model with the same vocabulary, on its own Engine and KV cache.

    Its cache holds the committed sequence except `pending` (normally just the last emitted token). A
    proposal feeds pending (one decode step, or a chunk after a round that accepted every draft: the last
    draft was never fed) and then k-1 more decode steps, graph replays when the draft engine has graphs.
    commit() keeps the accepted drafts' entries by rolling back to the end of them."""

    name = "draft_model"

    def __init__(self, draft_engine):
        self.engine = draft_engine
        self.pending: list[int] = []
        self.cached = 0  # sequence tokens whose K/V is in the draft cache
        self.written = 0  # drafts written into the cache by the last proposal
        self.checked = None  # the target engine the tokenizers were compared against

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
        e.check_prompt(prompt_ids, extra, f" + {extra} generated and draft slots (draft model)")
        e.prefill(list(prompt_ids))
        self.cached, self.pending, self.written = len(prompt_ids), [], 0

    def propose(self, k, sampling, gen) -> Draft:
        e = self.engine
        feed = torch.tensor(self.pending, dtype=torch.long, device=e.device)
        logits = e.decode(feed) if len(feed) == 1 else e.chunk(feed[None])[:, -1]  # [1, V]
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
                "draft_layers": self.engine.config.n_layers}


class LayerSkipDrafter(ModelDrafter):
    """Self-speculation: the target's first n_layers, then its final norm and LM head.

    The drafter runs a Transformer whose modules *are* the target's (no weight copy) over its own
    n_layers-deep KV cache, on its own Engine, so it drafts with the same decode path and graphs."""

    name = "layer_skip"

    def __init__(self, engine, n_layers: int):
        total = engine.config.n_layers
        if not (isinstance(n_layers, int) and 1 <= n_layers < total):
            raise ValueError(f"n_layers={n_layers} must be in 1..{total - 1} (the target has {total} layers)")
        from engine.engine import Engine

        self.target, self.n_layers = engine, n_layers
        super().__init__(Engine(truncated(engine.model, n_layers), engine.max_seq_len))

    def begin(self, target, prompt_ids, sampling, extra) -> None:
        if target is not self.target:
            raise ValueError("this LayerSkipDrafter was built on another engine; build one on the target")
        # follow the target's kernel and graph choices; graphs captured with other kernels are re-captured
        changed = self.engine.model.ops is not target.model.ops
        self.engine.model.use_ops(target.model.ops)
        if target.graph is not None and (changed or self.engine.graph is None):
            self.engine.use_graphs(True)
        elif target.graph is None and self.engine.graph is not None:
            self.engine.use_graphs(False)
        super().begin(target, prompt_ids, sampling, extra)

    def describe(self) -> dict:
        return {"drafter": self.name, "draft_layers": self.n_layers, "target_layers": self.target.config.n_layers}


def truncated(model: nn.Module, n_layers: int) -> nn.Module:
    """A Transformer over model's first n_layers, its final norm and head; every module shared, not copied.

    Built on the meta device (no allocation), then each module is replaced by the target's own."""
    from engine.model import Transformer

    with torch.device("meta"):
        view = Transformer(dataclasses.replace(model.config, n_layers=n_layers))
    view.embed, view.norm, view.lm_head = model.embed, model.norm, model.lm_head
    view.layers = nn.ModuleList(model.layers[:n_layers])
    view.ops, view.cos, view.sin, view.version = model.ops, model.cos, model.sin, model.version
    view.path, view.eos_ids = model.path, model.eos_ids
    assert all(p.device == model.device for p in view.parameters())
    return view


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
