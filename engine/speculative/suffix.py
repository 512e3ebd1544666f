"""Drafts from a session's earlier outputs: a second request for a similar edit copies from the first one's
answer (SuffixDecoding, Oliaro et al. 2024, indexes every earlier output the same way).

Prompt lookup finds what the answer quotes from its own prompt; what it cannot find is what the model wrote
last time: the renamed identifier, the preamble, the reworded sentence the earlier answer already settled on.
A SessionIndex maps every n-gram of the outputs it has seen to where each occurs, and the lookup
(engine/speculative/lookup.py) weighs its matches beside the prompt's: the longer match is copied, the prompt's
on a tie (it is this request's own text). The schedule keeps a session match's acceptance apart from a prompt
match's, so a session whose earlier answers do not fit the new one costs a few probes, like any bad context.

Memory is bounded: at most `cap` tokens are indexed, the oldest outputs dropped first, whole. Its owner adds each
finished output (add); a drafter only reads it, so a run in another process (a ZeroGPU worker, handed a pickled
copy) drafts from it as well as one in-process, and a run's own tokens are the prompt lookup's to find. The
drafts never change the text (loop.py): a session only moves how many tokens a round settles.

What a stranger can see: a rejected draft is shown on the page, so a session index must hold only outputs its
user may read (one per browser session, never one shared by every visitor).
"""
from __future__ import annotations

from collections import deque

SEPARATOR = -1  # between outputs: no n-gram and no match crosses from one output into the next
CAP = 1 << 15  # tokens a session index keeps by default: ~32k tokens, a few MB of lists and dict entries


class SessionIndex:
    """The n-grams (min_n..max_n tokens) of a session's outputs, each to its starts in order, over at most `cap`
    tokens. Positions are absolute (they keep counting as old outputs are dropped); `at(p)` reads one."""

    def __init__(self, cap: int = CAP, max_n: int = 3, min_n: int = 1):
        if not (isinstance(cap, int) and cap >= 1):
            raise ValueError(f"cap={cap} must be a positive number of tokens")
        if not (isinstance(min_n, int) and isinstance(max_n, int) and 1 <= min_n <= max_n):
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.cap, self.max_n, self.min_n = cap, max_n, min_n
        self.tokens: list[int] = []  # tokens[i] is position offset + i; those before base are dropped
        self.offset = self.base = 0
        self.index: dict[tuple[int, ...], deque[int]] = {}
        self.starts: deque[int] = deque()  # where each output kept begins (its separator), oldest first
        self.open = False  # the last output may still grow

    def __len__(self) -> int:
        return self.end - self.base

    @property
    def end(self) -> int:
        return self.offset + len(self.tokens)

    def at(self, p: int) -> int:
        """The token at absolute position p; SEPARATOR outside what is kept."""
        return self.tokens[p - self.offset] if self.base <= p < self.end else SEPARATOR

    def add(self, ids) -> None:
        """One finished output."""
        self.start()
        self.extend(ids)

    def start(self) -> None:
        """A new output begins: nothing written from now on continues the previous one."""
        self.open = False

    def extend(self, ids) -> None:
        """Append tokens to the current output (a new one after start()); every n-gram that gains a follower is
        indexed. Past the cap, the oldest outputs go, whole (one output longer than the cap keeps its end)."""
        if not self.open:
            self.starts.append(self.end)
            self.tokens.append(SEPARATOR)
            self.open = True
        for tok in ids:
            for n in range(self.min_n, self.max_n + 1):  # the n-grams ending just before tok, within its output
                gram = self._gram(self.end - n, n)
                if self.end - n < self.base or SEPARATOR in gram:
                    break
                self.index.setdefault(gram, deque()).append(self.end - n)
            self.tokens.append(int(tok))
        while len(self) > self.cap:
            if len(self.starts) > 1:
                self.starts.popleft()
                self._drop_before(self.starts[0])
            else:
                self._drop_before(self.end - self.cap)

    def _gram(self, p: int, n: int) -> tuple[int, ...]:
        return tuple(self.tokens[p - self.offset:p - self.offset + n])

    def _drop_before(self, p: int) -> None:
        """Forget positions < p: each indexed n-gram starting there is the first of its list."""
        for q in range(self.base, p):
            for n in range(self.min_n, self.max_n + 1):
                gram = self._gram(q, n)
                starts = self.index.get(gram)
                if starts and starts[0] == q:
                    starts.popleft()
                    if not starts:
                        del self.index[gram]
        self.base = p
        if self.base - self.offset > len(self.tokens) // 2:  # compact: the list never holds twice what is kept
            self.tokens, self.offset = self.tokens[self.base - self.offset:], self.base

    def matches(self, seq: list[int], limit: int, cap: int) -> list[tuple[int, int]]:
        """(position the copy starts at, match length) of the latest `limit` occurrences of seq's longest suffix
        the index holds, each match followed back through seq up to `cap` tokens (never across an output's
        start); latest first, [] when no suffix occurs."""
        end = len(seq)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            starts = self.index.get(tuple(seq[end - n:]))
            if not starts:
                continue
            out = []
            for i in range(len(starts) - 1, max(-1, len(starts) - 1 - limit), -1):
                s = starts[i]
                length, a, b = n, s - 1, end - n - 1
                while length < cap and b >= 0 and self.at(a) == seq[b]:
                    length, a, b = length + 1, a - 1, b - 1
                out.append((s + n, length))
            return out
        return []

    def copy(self, src: int, k: int) -> list[int]:
        """Up to k tokens from src, stopping where the output ends."""
        out = []
        for p in range(src, min(src + k, self.end)):
            tok = self.at(p)
            if tok == SEPARATOR:
                break
            out.append(tok)
        return out
