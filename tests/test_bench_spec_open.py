"""bench/spec_open.py's alternation: every prompt under every mode back to back, the order rotated prompt by
prompt, a session per mode and repeat, and each repeat's figures summed per mode."""
from types import SimpleNamespace

from bench import spec_open


def fake_stats(tokens: int, ms: float, plain_ms: list[float]):
    rounds = [SimpleNamespace(t_end_ms=0.0, n_drafted=0, total_ms=0.0, draft_ms=0.0)]
    rounds += [SimpleNamespace(t_end_ms=0.0, n_drafted=0, total_ms=x, draft_ms=0.01) for x in plain_ms]
    rounds[-1].t_end_ms = ms
    return SimpleNamespace(ids=list(range(tokens + 1)), rounds=rounds)


def test_alternate_interleaves_modes_per_prompt_and_rotates():
    calls = []

    def run(name, state, prompt):
        calls.append((name, prompt, state))
        if state is not None:
            state.append(prompt)
        return fake_stats(10, 100.0 if name == "plain" else 50.0, [1.0, 3.0])

    modes = dict(plain=lambda: None, ngram=lambda: None, session=list)
    out = spec_open.alternate(modes, ["p0", "p1", "p2"], run, repeats=2)
    assert len(calls) == 2 * 3 * 3
    # each prompt runs under all three modes before the next prompt starts, in a rotated order
    groups = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert [g[0][1] for g in groups] == ["p0", "p1", "p2"] * 2
    assert all(len({c[1] for c in g}) == 1 and {c[0] for c in g} == set(modes) for g in groups)
    firsts = [g[0][0] for g in groups]
    assert firsts == ["plain", "ngram", "session", "ngram", "session", "plain"]
    # a session lives for one repeat and sees the prompts in order
    sessions = [c[2] for c in calls if c[0] == "session"]
    assert sessions[0] is sessions[2] and sessions[3] is not sessions[0]
    assert sessions[3] == ["p0", "p1", "p2"]
    # per repeat: tokens and ms summed over the prompts, every plain round kept
    assert out["plain"] == [(30, 300.0, [1.0, 3.0] * 3, [0.01] * 6, [False] * 6)] * 2
    assert [rep[1] for rep in out["ngram"]] == [150.0, 150.0]
    rows = spec_open.rows_of(out, set="s")
    ngram = next(r for r in rows if r["mode"] == "ngram")
    assert ngram["ratio"] == 2.0 and ngram["plain_round_over_step"] == 1.0 and ngram["plain_rounds"] == 12


def test_plain_rounds_are_told_apart_by_the_round_before_them():
    drafted = SimpleNamespace(t_end_ms=0.0, n_drafted=3, total_ms=9.0, draft_ms=0.0)

    def plain(ms):
        return SimpleNamespace(t_end_ms=0.0, n_drafted=0, total_ms=ms, draft_ms=0.01)

    first = SimpleNamespace(t_end_ms=0.0, n_drafted=0, total_ms=0.0, draft_ms=0.0)
    last = plain(1.0)
    last.t_end_ms = 40.0
    stats = SimpleNamespace(ids=list(range(8)), rounds=[first, plain(1.0), drafted, plain(1.5), plain(1.0), drafted,
                                                        plain(1.5), last])
    figures = spec_open.decode_figures(stats)
    tokens, ms, rounds, choice, after = figures
    assert (tokens, ms, rounds) == (7, 40.0, [1.0, 1.5, 1.0, 1.5, 1.0]) and after == [False, True, False, True, False]
    step = spec_open.Figures(10, 10.0, [1.0, 1.0], [], [False, False])
    out = dict(plain=[step, step], ngram=[figures] * 2)
    row = next(r for r in spec_open.rows_of(out, set="s") if r["mode"] == "ngram")
    assert row["after_plain_over_step"] == 1.0 and row["after_draft_over_step"] == 1.5
    assert row["plain_round_over_step"] == 1.0 and row["plain_rounds"] == 10 and row["after_draft_rounds"] == 4
