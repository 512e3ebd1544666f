"""Chunks -> Round events, the ones engine.stats defines, so every panel and export reads an endpoint's run the
way it reads ours.

A Round is one decode step of the server as it reached this machine: the tokens one chunk carries (vLLM, SGLang:
a chunk per engine step), or the chunks that share a step clock (llama-server sends each token of a verify step
as its own chunk, microseconds apart). Its end is the arrival of its last chunk, its start the previous round's
end, so a step of n tokens is one gap, not n. Token kinds come from the server's counters where it reports them
per step (llama-server's draft_n / draft_n_accepted); elsewhere a step of n > 1 tokens is shown as n - 1
accepted drafts and the target's token, each marked inferred.

What a server reports is bounded by what the run can hold: a round has no more tokens than its chunks had bytes,
and the run no more than max_new_tokens (`budget`); a chunk that brings tokens past the budget sets `over`, and
the client stops reading there. So one small chunk that claims 200,000 tokens costs what its bytes allow.
"""
from __future__ import annotations

from collections import Counter

from engine.endpoint.chunks import Chunk
from engine.stats import Round, Token

# where a run's tokens-per-chunk came from, best first (EndpointInfo.tokens_from)
TOKENS_FROM = {
    "count": "the server's token count",
    "ids": "the server's token ids",
    "logprobs": "the server's logprobs (one entry per token)",
    "retokenized": "re-tokenized with the app's tokenizer",
    "chunks": "one token per chunk (the server gave no count and no tokenizer was known)",
}
UNKNOWN_ID = -1  # a token whose id the server did not send
# re-tokenizing encodes the whole text so far on every chunk (a piece's tokens depend on what came before): past
# this many characters a run counts one token per chunk instead, so a server's flood of text costs linear time
RETOKENIZE_CHARS = 64 << 10


class RoundBuilder:
    def __init__(self, tokenizer=None, budget: int | None = None):
        self.tokenizer = tokenizer  # engine.Tokenizer, for re-tokenizing when the server gives no count
        self.budget = budget  # max_new_tokens: tokens past it are not kept
        self.over = False  # a chunk brought tokens past the budget
        self.delivered = 0  # tokens by the server's measure, against the budget
        self.rounds: list[Round] = []
        self.sources: Counter = Counter()
        self.pending: list[Chunk] = []
        self.total = 0  # tokens in closed rounds, by the server's count where it gives one
        self.drafted = self.accepted = 0  # the server's totals at the last closed step
        self.step_ms = 0.0
        self.text = ""  # the run's text so far (re-tokenization)
        self.retokenized = 0
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.last: Chunk | None = None  # the last chunk seen (final figures)

    def add(self, c: Chunk) -> list[Round]:
        """Take a chunk; return the rounds it completed."""
        self.last = c
        self.finish_reason = c.finish_reason or self.finish_reason
        self.usage = c.usage or self.usage
        done = []
        seen = max([self.total] + [p.tokens_total for p in self.pending if p.tokens_total is not None])
        grows = c.tokens_total is not None and c.tokens_total > seen  # e.g. an EOS token that sent no text
        carries = c.says_tokens or grows
        # a new step clock ends the step in flight; so does a chunk of tokens from a server without one (a chunk
        # is a step there); a chunk with neither (a role delta, the finish_reason) ends nothing
        if self.pending and (c.step_clock is not None and c.step_clock != self.pending[-1].step_clock
                             or c.step_clock is None and carries):
            done += self._close()
        if carries:
            self.pending.append(c)
            if c.step_clock is None:  # no step clock: a chunk is a step
                done += self._close()
        return done

    def close(self) -> list[Round]:
        """The stream ended (or failed): the step in flight becomes a round."""
        return self._close() if self.pending else []

    def _count(self, group: list[Chunk]) -> tuple[int, str]:
        text = "".join(c.text for c in group)
        if (total := group[-1].tokens_total) is not None and total > self.total:
            return total - self.total, "count"
        if all(c.token_ids for c in group if c.says_tokens):
            return sum(len(c.token_ids or ()) for c in group), "ids"
        if all(c.token_texts for c in group if c.says_tokens):
            return sum(len(c.token_texts or ()) for c in group), "logprobs"
        if self.tokenizer is not None and text and len(self.text) + len(text) <= RETOKENIZE_CHARS:
            self.text += text
            n = len(self.tokenizer.encode(self.text))
            new, self.retokenized = max(1, n - self.retokenized), max(n, self.retokenized + 1)
            return new, "retokenized"
        return sum(1 for c in group if c.text), "chunks"

    def _close(self) -> list[Round]:
        group, self.pending = self.pending, []
        n, source = self._count(group)
        n = min(n, sum(c.nbytes for c in group) or 1)
        # the budget counts tokens as the server does: its own count, ids or logprobs, else one per chunk (the
        # app's tokenizer is not the server's, so its count may run past max_new_tokens on a run that did not)
        served = n if source != "retokenized" else sum(c.says_tokens for c in group)
        if self.budget is not None and served > self.budget - self.delivered:
            self.over = True
            n = served = self.budget - self.delivered if source != "retokenized" else 0
        self.delivered += served
        if n <= 0:
            return []
        self.sources[source] += n
        self.total += n
        last = group[-1]
        ids = [i for c in group for i in (c.token_ids or ())]
        texts = [t for c in group for t in (c.token_texts or ())]
        text = "".join(c.text for c in group)
        if len(texts) != n:
            texts = [text] + [""] * (n - 1)
        if len(ids) != n:
            ids = [UNKNOWN_ID] * n
        kinds, drafted, verified, inferred = self._kinds(last, n)
        index = len(self.rounds)
        tokens = [Token(i, k, draft_position=p if k in ("accepted", "resampled") else None, text=t, inferred=inferred)
                  for p, (i, k, t) in enumerate(zip(ids, kinds, texts, strict=True))]
        target_ms = 0.0
        if index == 0 and last.prompt_ms is not None:
            target_ms = last.prompt_ms
        elif last.step_ms_total is not None:
            target_ms = max(0.0, last.step_ms_total - self.step_ms)
        if last.step_ms_total is not None:
            self.step_ms = last.step_ms_total
        start = self.rounds[-1].t_end_ms if self.rounds else 0.0
        rnd = Round(index, tokens, start, last.t_ms, target_ms=min(target_ms, last.t_ms - start),
                    n_drafted=drafted, verified=verified)
        self.rounds.append(rnd)
        return [rnd]

    def _kinds(self, last: Chunk, n: int) -> tuple[list[str], int, int | None, bool]:
        """(kinds, drafts verified, accepted where the tokens stop short of them, inferred) of a step of n tokens."""
        if last.step_clock is not None:  # the server's counters are per step: nothing to infer
            # a step's drafts and acceptances, as far as they make sense: no counter runs backwards, no step
            # accepts more than it drafted
            d = max(0, (last.drafted_total or 0) - self.drafted)
            a = min(d, max(0, (last.accepted_total or 0) - self.accepted))
            self.drafted, self.accepted = max(self.drafted, last.drafted_total or 0), \
                max(self.accepted, last.accepted_total or 0)
            if d <= 0:
                return ["target"] * n, 0, None, False
            if n <= a:  # EOS or the budget ended the step inside its accepted drafts
                return ["accepted"] * n, d, a, False
            last_kind = "bonus" if a == d else "resampled"
            return ["accepted"] * a + [last_kind] + ["target"] * (n - a - 1), d, None, False
        if n == 1:
            return ["target"], 0, None, False
        return ["accepted"] * (n - 1) + ["target"], 0, None, True


def apply_per_step(rounds: list[Round], accepted: list[int], drafted: list[int]) -> bool:
    """Label the decode rounds with the server's per-step counts (vLLM `detailed`), where they line up one to
    one: as many steps as decode rounds, each round's tokens at most its accepted drafts + 1. Returns whether
    they did; if not (a server that leaves out steps it did not draft), the rounds stay inferred."""
    steps = rounds[1:]
    if not all(type(x) is int and x >= 0 for x in (*accepted, *drafted)):
        return False
    if len(steps) != len(accepted) or len(accepted) != len(drafted):
        return False
    if any(len(r.tokens) > a + 1 or a > d for r, a, d in zip(steps, accepted, drafted, strict=True)):
        return False
    for r, a, d in zip(steps, accepted, drafted, strict=True):
        n = len(r.tokens)
        last = "bonus" if a == d else "resampled"
        kinds = (["accepted"] * a + [last])[:n] if d else ["target"] * n
        for p, (t, k) in enumerate(zip(r.tokens, kinds, strict=True)):
            t.kind, t.inferred = k, False
            t.draft_position = p if k in ("accepted", "resampled") else None
        r.n_drafted, r.verified = d, (a if d and n <= a else None)
    return True
