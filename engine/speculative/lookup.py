"""Prompt lookup: drafts copied from earlier in the prompt and the output, for answers that quote their input.

A quote-and-edit answer (rename a variable, reorder steps, fix the spelling) copies long runs of its prompt
and breaks them where it edits. What decides a lookup drafter's worth there, as bench/spec.py measures it on
its text sets:

  which earlier occurrence to copy   the sequence's last tokens often occur several times (`return`, a list's
                                     `- `); the latest occurrence is not always the one the answer follows, the
                                     one whose match runs furthest back, or that lies where the copy had got to,
                                     is right more often
  how sure a match is                a draft after a one-token match is a guess (about 1 in 5 on our sets), one
                                     after an 8-token match is a copy (about 19 in 20), and a short match whose
                                     occurrences disagree on the next token is worse than one where they agree:
                                     the schedule is told which kind of match a proposal rests on, and drafts
                                     long only where the copy is sure

So every n-gram of min_n..max_n tokens maps to all its earlier starts. A lookup takes the occurrences of the
longest suffix that has any (the latest MAX_CANDIDATES), follows each one's match back up to MATCH_CAP tokens,
and copies from the longest match, then the one nearest the anchor at or after it (the source position the copy
had reached: after an edit the answer resumes its source a few tokens on, not at another occurrence and not
further back), then the latest.
The context handed to the schedule is (match length bucket, whether the longest occurrences agree), with
"session" before it where the copy comes from a session's earlier outputs (engine/speculative/suffix.py): a
SessionIndex given to the drafter is searched too (it only reads it: its owner adds each finished output), and its
match is copied where it is longer than any in the prompt and the output.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from engine.speculative.drafters import Draft, Drafter
from engine.speculative.suffix import SessionIndex

MATCH_CAP = 16  # a match is followed back at most this far: past ~8 tokens a match is a copy either way
MAX_CANDIDATES = 32  # occurrences of a suffix weighed per lookup, the latest ones (a common token has hundreds)
ANCHOR_SPAN = 8  # tokens after a break (with no match chosen since) for which the anchor still says where the
# copy had got to
BUCKETS = (16, 8, 4, 3, 2, 1)  # a match length's bucket: the largest of these it reaches
# acceptance of a proposal's first token before any evidence, by (bucket, occurrences agree); rounded from
# bench/spec.py's analysis of its text sets, the schedule's own counts take over within a run
PRIORS = {(16, True): 0.95, (8, True): 0.9, (4, True): 0.8, (3, True): 0.65, (3, False): 0.3, (2, True): 0.5,
          (2, False): 0.2, (1, True): 0.25, (1, False): 0.1}


def context(length: int, agree: bool) -> tuple[int, bool]:
    b = next(b for b in BUCKETS if length >= b)
    return b, agree or b >= 4  # past 3 tokens a match's occurrences nearly always agree: one context


class Choice(NamedTuple):
    src: int  # the position the copy starts at: in the drafter's tokens, or in the session index
    ctx: tuple  # the schedule's context
    session: bool = False


class NgramDrafter(Drafter):
    """Prompt lookup over the prompt and the output (see the module docstring). Copies are one-hot drafts: the
    target keeps a draft exactly where its own sample equals it, with probability p_target(x). A copy may run
    past the sequence's end; it then continues from its own proposal, which extends a repeating pattern
    periodically."""

    name = "ngram"
    draft_cost = 0.0  # dict probes and a few comparisons: nothing next to a forward pass

    def __init__(self, max_n: int = 3, min_n: int = 1, session: SessionIndex | None = None):
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n, self.session = max_n, min_n, session
        self.device = torch.device("cpu")
        self.reset([])

    def reset(self, ids) -> None:
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> its starts, ascending
        self.anchor: int | None = None  # the source position the answer's next token is expected from
        self.since = 0  # tokens emitted since the copy broke, with no match chosen since
        self.choice: Choice | None = None  # this round's
        self.extend(ids)

    def begin(self, target, prompt_ids, sampling=None, extra=0) -> None:
        self.device = target.device if target is not None else torch.device("cpu")
        self.reset(prompt_ids)

    def extend(self, ids) -> None:
        for tok in ids:
            p = len(self.tokens)  # position of tok: every n-gram ending at p-1 now has a follower
            for n in range(self.min_n, min(self.max_n, p) + 1):
                self.index.setdefault(tuple(self.tokens[p - n:p]), []).append(p - n)
            self.tokens.append(int(tok))
        self.choice = None

    def candidates(self) -> list[tuple[int, int]]:
        """(position the copy starts at, match length) of each weighed occurrence of the longest suffix seen
        before, latest first; [] when none is."""
        toks = self.tokens
        end = len(toks)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            starts = self.index.get(tuple(toks[end - n:]))
            if not starts:
                continue
            out = []
            for s in reversed(starts[-MAX_CANDIDATES:]):
                length, i, j = n, s - 1, end - n - 1  # follow the match back: toks[i] against toks[j]
                while length < MATCH_CAP and i >= 0 and toks[i] == toks[j]:
                    length, i, j = length + 1, i - 1, j - 1
                out.append((s + n, length))
            return out
        return []

    def choose(self) -> Choice | None:
        """This round's proposal: where it copies from and its context, or None."""
        found, toks, anchor = self.candidates(), self.tokens, self.anchor
        longest = max((n for _, n in found), default=0)
        if self.session is not None and longest < MATCH_CAP:
            far = self.session.matches(toks, MAX_CANDIDATES, MATCH_CAP)
            src, length = max(far, key=lambda c: (c[1], c[0]), default=(0, 0))  # the longest, then the latest
            if length > longest:
                nxt = {self.session.at(c) for c, n in far if n == length}
                return Choice(src, ("session", *context(length, len(nxt) == 1)), True)
        if not found:
            return None
        def rank(c):  # the longest match; then one at or after the anchor, nearest first; then the latest
            return (c[1], anchor is not None and c[0] >= anchor, -abs(c[0] - anchor) if anchor is not None else 0,
                    c[0])
        src, length = max(found, key=rank)
        # the source at src may be the sequence's end (a copy of itself): its next token is its own first draft
        nxt = {toks[c] if c < len(toks) else None for c, n in found if n == length}
        return Choice(src, context(length, len(nxt) == 1))

    def context(self) -> tuple | None:
        self.choice = self.choose()
        return None if self.choice is None else self.choice.ctx

    def prior(self, key) -> float:
        return PRIORS[key[-2:]]  # a session match starts from a prompt match's prior; its own counts take over

    def lookup(self, k: int) -> list[int]:
        self.choice = self.choice or self.choose()
        if self.choice is None:
            return []
        if self.choice.session:
            return self.session.copy(self.choice.src, k)
        toks, src, out = self.tokens, self.choice.src, []
        for j in range(k):
            out.append(toks[src + j] if src + j < len(toks) else out[src + j - len(toks)])
        return out

    def propose(self, k, sampling=None, noise=None) -> Draft:
        return Draft(torch.tensor(self.lookup(k), dtype=torch.long, device=self.device), None, None)

    def commit(self, n_accepted, emitted) -> None:
        """Follow the emitted tokens along the source: the match chosen for the round (drafted from or not)
        re-bases the copy there; the first token that differs from the source breaks it, and the anchor stays
        at the break for ANCHOR_SPAN tokens."""
        if self.choice is not None and not self.choice.session:
            self.anchor, self.since = self.choice.src, 0
        if self.anchor is not None:
            toks = self.tokens
            for tok in emitted:
                if self.since == 0 and self.anchor < len(toks) and toks[self.anchor] == tok:
                    self.anchor += 1
                else:
                    self.since += 1
            if self.since > ANCHOR_SPAN:
                self.anchor, self.since = None, 0
        self.extend(emitted)

    def describe(self) -> dict:
        out = {"drafter": self.name, "max_n": self.max_n, "min_n": self.min_n}
        return out | ({"session_tokens": len(self.session)} if self.session is not None else {})
