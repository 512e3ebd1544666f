"""What limits a lookup drafter on a text set, measured on plain decoding's own output (bench/spec.py runs it).

Greedy plain decoding fixes the text every drafter must reproduce, so a lookup can be judged at every output
position without running the target: its proposal there is right for as many tokens as agree with the text.

  lookup_stats   at each position: the longest match, the latest occurrence's proposal (what a latest-match
                 lookup drafts), the chosen one (engine/speculative/lookup.py) and the best of all candidates
                 (what a perfect choice among them would give); and around each place a copy breaks (the text
                 stops following its source: an edit, or the end of the passage), how far the text goes before a
                 proposal is right again
  replay         a drafter and the real Schedule over the text, each round costing the verify pass this run
                 measured for its size: tokens per plain-step time, the speedup the timing rows can approach;
                 and the same with a schedule that knows each proposal's outcome (the drafter's ceiling)

LatestMatch is the lookup the project had before: the latest occurrence of the longest suffix, its context the
match length in three buckets. It runs in the timed rows too, so each step's gain is measured twice.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.speculative import Schedule, lookup
from engine.stats import Round

K = 16  # the longest proposal judged (the bench's k)
BUCKETS = ("1", "2-3", "4-7", "8+")  # match lengths, as the analysis table groups them
RESUME_CAP = 8  # positions after a break within which a proposal right again counts as the copy resumed
LATEST_PRIORS = {1: 0.15, 2: 0.35, 4: 0.6}


class LatestMatch(lookup.NgramDrafter):
    """The latest occurrence of the longest suffix (max_n..min_n tokens); context: its match length followed back
    up to 4 tokens, bucketed 1, 2-3, 4+."""

    name = "ngram_latest"

    def choose(self):
        found = self.candidates()
        if not found:
            return None
        src, length = found[0]
        return lookup.Choice(src, 1 if length == 1 else 2 if length < 4 else 4)

    def prior(self, key) -> float:
        return LATEST_PRIORS[key]


def agreed(tokens: list[int], src: int, text: list[int]) -> int:
    """Tokens of a K-token copy from src (continuing periodically past the end) that agree with text."""
    n, out = 0, []
    for j in range(min(K, len(text))):
        tok = tokens[src + j] if src + j < len(tokens) else out[src + j - len(tokens)]
        out.append(tok)
        if tok != text[j]:
            break
        n += 1
    return n


def lookup_stats(prompt: list[int], out: list[int]) -> dict:
    """Counts over the output positions of one text (summed over a set by `pool`)."""
    d = lookup.NgramDrafter()
    d.begin(None, prompt)
    s = dict(positions=len(out), no_match=0, latest_wrong_other_right=0, latest_tokens=0, chosen_tokens=0,
             best_tokens=0, breaks=0, back_latest=0, back_chosen=0)
    for b in BUCKETS:
        s[f"match_{b}"] = s[f"match_{b}_right"] = 0
    latest_ok, chosen_ok = [], []
    for i in range(len(out)):
        text, found = out[i:], d.candidates()
        d.context()
        if not found:
            s["no_match"] += 1
            latest = chosen = best = 0
        else:
            latest = agreed(d.tokens, found[0][0], text)
            chosen = agreed(d.tokens, d.choice[0], text)
            best = max(agreed(d.tokens, c, text) for c, _ in found)
            b = bucket(max(n for _, n in found))
            s[f"match_{b}"] += 1
            s[f"match_{b}_right"] += chosen > 0
        s["latest_wrong_other_right"] += latest == 0 and best > 0
        s["latest_tokens"], s["chosen_tokens"], s["best_tokens"] = (
            s["latest_tokens"] + latest, s["chosen_tokens"] + chosen, s["best_tokens"] + best)
        latest_ok.append(latest > 0)
        chosen_ok.append(chosen > 0)
        d.commit(0, out[i:i + 1])
    # a break: the copy (the chosen proposal right at the last position) stops being right here; how many
    # positions on is each lookup's proposal right again (RESUME_CAP: not within that)
    for i in range(1, len(out)):
        if chosen_ok[i - 1] and not chosen_ok[i]:
            s["breaks"] += 1
            for key, ok in (("back_latest", latest_ok), ("back_chosen", chosen_ok)):
                s[key] += next((j for j in range(RESUME_CAP) if i + j < len(out) and ok[i + j]), RESUME_CAP)
    return s


def bucket(length: int) -> str:
    return "1" if length == 1 else "2-3" if length < 4 else "4-7" if length < 8 else "8+"


def pool(stats: list[dict]) -> dict:
    """Counts summed over texts -> the shares and means the analysis table shows."""
    t = {k: sum(s[k] for s in stats) for k in stats[0]}
    n, matched, breaks = t["positions"], t["positions"] - t["no_match"], t["breaks"]
    row = dict(positions=n, no_match_pct=100 * t["no_match"] / n)
    for b in BUCKETS:
        row[f"match_{b}_pct"] = 100 * t[f"match_{b}"] / n
        row[f"right_at_{b}"] = t[f"match_{b}_right"] / t[f"match_{b}"] if t[f"match_{b}"] else None
    row.update(latest_wrong_other_right_pct=100 * t["latest_wrong_other_right"] / matched if matched else None,
               latest_tokens=t["latest_tokens"] / n, chosen_tokens=t["chosen_tokens"] / n,
               best_tokens=t["best_tokens"] / n, breaks=breaks,
               back_latest=t["back_latest"] / breaks if breaks else None,
               back_chosen=t["back_chosen"] / breaks if breaks else None)
    return row


def replay(make: Callable[[], lookup.NgramDrafter], prompt: list[int], out: list[int], verify: dict[int, float],
           k_max: int = K, oracle: bool = False) -> tuple[float, float]:
    """(plain-step times, tokens) of the drafter and the real Schedule decoding `out` after `prompt`, a round of
    T positions costing verify[T] plain steps (verify[1]: a plain step). oracle=True drafts exactly the tokens
    the proposal gets right (none: a plain step) instead of asking the schedule."""
    d = make()
    d.begin(None, prompt)
    schedule = Schedule(k_max, d, True)
    d.commit(0, out[:1])  # the prefill's token
    i, t, index = 1, 0.0, 1
    while i < len(out):
        ctx = d.context()
        left = len(out) - i
        k = schedule.choose(ctx, left)
        if oracle:
            k = agreed(d.tokens, d.choice[0], out[i:i + min(k_max, left - 1)]) if ctx is not None else 0
        draft = d.lookup(k) if k else []
        n = 0
        while n < len(draft) and draft[n] == out[i + n]:
            n += 1
        ms = verify[len(draft) + 1]
        schedule.observe(Round(index, [], t, t + ms, n_drafted=len(draft), k=k, verified=n if draft else None))
        d.commit(n, out[i:i + n + 1])
        t, i, index = t + ms, i + n + 1, index + 1
    return t, len(out) - 1
