"""Stats from Round events: what each speculative figure means, and that summary(), the CLI's stats line and the
CSV rows give the same numbers (the page shows summary()'s)."""
import math

from engine.cli import format_summary
from engine.stats import Round, Stats, Token

PROMPT_LEN = 5


def run(*rounds: tuple) -> Stats:
    """Stats of a speculative run from (kinds, ms, draft_ms, k, verified) per decode round after a 10 ms round 0;
    kinds list the round's tokens ("a" accepted, "r" rejected, "s" resampled, "b" bonus, "t" target); a round
    of k > 0 verified k drafts."""
    names = dict(a="accepted", r="rejected", s="resampled", b="bonus", t="target")
    out, t = [Round(0, [Token(1, "target")], 0.0, 10.0, draft_ms=3.0)], 10.0
    for i, (kinds, ms, draft_ms, k, verified) in enumerate(rounds, 1):
        tokens = [Token(100 + j, names[c], j if c in "ar" else None) for j, c in enumerate(kinds)]
        out.append(Round(i, tokens, t, t + ms, draft_ms=draft_ms, n_drafted=k, k=k, verified=verified))
        t += ms
    return Stats(out, PROMPT_LEN, {"mode": "ngram"})


def test_acceptance_is_zero_where_every_draft_was_rejected_and_blank_where_none_was_made():
    rejected = run(("rs", 4.0, 0.2, 1, None), ("rs", 4.0, 0.2, 1, None), ("t", 3.0, 0.1, 0, None))
    assert rejected.summary()["acceptance_rate"] == 0.0
    assert "acceptance 0.0%" in format_summary(rejected.summary())
    nothing = run(("t", 3.0, 0.1, 0, None), ("t", 3.0, 0.1, 0, None))
    s = nothing.summary()
    assert math.isnan(s["acceptance_rate"]) and math.isnan(s["mean_accepted_len"])
    assert "acceptance - (nothing drafted)" in format_summary(s)
    assert s["draft_overhead_pct"] > 0  # the lookups that found nothing still cost their time


def test_mean_accepted_length_is_one_figure_everywhere():
    """Tokens a verify pass settled, drafts accepted plus the one the target added, over the rounds that
    verified drafts: 4 (3 kept + bonus), 1 (the first draft rejected), 3 (2 kept, the third rejected), and a
    round the budget cut after 1 of its 2 kept drafts still counts what its verify pass settled, 3."""
    stats = run(("aaab", 6.0, 0.3, 3, None), ("rs", 4.0, 0.3, 4, None), ("t", 3.0, 0.1, 0, None),
                ("aars", 5.0, 0.3, 5, None), ("a", 4.0, 0.3, 4, 2))
    s = stats.summary()
    assert s["mean_accepted_len"] == (4 + 1 + 3 + 3) / 4
    per_round = {r["round"]: r["round_accepted_len"] for r in stats.rows()}
    assert per_round == {0: None, 1: 4, 2: 1, 3: None, 4: 3, 5: 3}
    shown = [v for v in per_round.values() if v is not None]
    assert sum(shown) / len(shown) == s["mean_accepted_len"]
    assert f"mean accepted length {s['mean_accepted_len']:.2f}" in format_summary(s)
    assert s["acceptance_rate"] == (3 + 0 + 2 + 2) / (3 + 4 + 5 + 4)


def test_draft_overhead_counts_every_decode_round():
    """The drafter's share of the decode rounds' time, plain rounds' lookups included and round 0 (the drafter's
    prefill, inside the TTFT) left out: (0.5 + 0.25 + 0.25) / (5 + 2 + 3)."""
    stats = run(("aab", 5.0, 0.5, 2, None), ("t", 2.0, 0.25, 0, None), ("t", 3.0, 0.25, 0, None))
    assert stats.summary()["draft_overhead_pct"] == 100 * 1.0 / 10.0
    assert "drafting 10.0% of decode time" in format_summary(stats.summary())


def test_plain_decoding_has_no_speculative_figures():
    rounds = [Round(i, [Token(i, "target")], 2.0 * i, 2.0 * i + 2) for i in range(4)]
    s = Stats(rounds, PROMPT_LEN).summary()
    assert all(math.isnan(s[key]) for key in ("acceptance_rate", "mean_accepted_len", "draft_overhead_pct",
                                             "mean_k"))
    assert "acceptance" not in format_summary(s)
