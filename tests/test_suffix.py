"""Drafting from a session's earlier outputs: the index against a brute force as outputs come and go under the
cap, and runs that share a session: output identical to plain decoding's (greedy, and sampled with the same
seed), a second request that copies the first one's answer, and memory that stays under the cap."""
import random

import pytest

from engine import Engine, load_model, speculative
from engine.speculative import loop
from engine.speculative.suffix import SEPARATOR, SessionIndex
from engine.tiny import tiny_config, write_tiny_model
from schedules import Modeled

pytestmark = pytest.mark.usefixtures("one_thread")


def brute_index(seq, base, end, sizes):
    """n-gram -> its starts in positions base..end of seq, for every n-gram followed by a token of its output."""
    out = {}
    for p in range(base, end):
        for n in sizes:
            gram = tuple(seq[p:p + n])
            if p + n < end and seq[p + n] != SEPARATOR and SEPARATOR not in gram:
                out.setdefault(gram, []).append(p)
    return out


@pytest.mark.parametrize("max_n, min_n", [(3, 1), (2, 2)])
def test_the_index_matches_a_brute_force_under_the_cap(max_n, min_n):
    rng = random.Random(0)
    for trial in range(300):
        cap = rng.randint(1, 40)
        s, seq = SessionIndex(cap=cap, max_n=max_n, min_n=min_n), []
        for _ in range(rng.randint(1, 6)):
            s.start()
            seq.append(SEPARATOR)
            for _ in range(rng.randint(1, 4)):  # an output arrives in pieces, as rounds commit it
                ids = [rng.randint(0, 3) for _ in range(rng.randint(0, 8))]
                s.extend(ids)
                seq += ids
            assert len(s) <= cap and len(s.tokens) <= 2 * cap + 8, (trial, len(s), cap)
        assert s.end == len(seq)
        got = {g: list(v) for g, v in s.index.items()}
        assert got == brute_index(seq, s.base, s.end, range(min_n, max_n + 1)), trial
        assert all(s.at(p) == seq[p] for p in range(s.base, s.end)) and s.at(s.base - 1) == SEPARATOR
        # whole outputs are dropped, except where the last one alone outgrows the cap
        assert seq[s.base] == SEPARATOR or s.base == s.end - cap


def test_matches_and_copies_stop_at_an_output_s_edges():
    s = SessionIndex(cap=100)
    s.extend([5, 6, 7, 8, 9])
    s.start()
    s.extend([1, 2, 7, 8, 4])
    # positions: 0 separator, 1..5 the first output, 6 separator, 7..11 the second
    assert sorted(s.matches([9, 7, 8], limit=32, cap=16)) == [(5, 2), (11, 2)]  # the longest suffix held: 7, 8
    assert s.matches([1, 1, 2, 7, 8], limit=32, cap=16) == [(11, 4)]  # followed back to the output's start
    assert s.matches([1, 2, 7, 8], limit=32, cap=3) == [(11, 3)]
    assert s.copy(5, 5) == [9] and s.copy(11, 5) == [4]  # never into the next output, nor past the end
    assert s.matches([3, 3], limit=32, cap=16) == []
    with pytest.raises(ValueError, match="cap=0"):
        SessionIndex(cap=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_tiny_model(tmp_path_factory.mktemp("suffix") / "m", tiny_config(), seed=1))


PROMPTS = [[72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100], [72, 101, 108, 108, 111, 32, 119, 111, 114, 108],
           [3, 14, 15, 92, 65, 35], [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]]


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.8, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_a_session_s_runs_are_plain_decoding_s(tiny, monkeypatch, sampling):
    """Every run that shares a session gives plain decoding's text; a request seen before drafts the earlier
    answer, which the prompt lookup cannot find, and the target keeps it."""
    monkeypatch.setattr(loop, "Schedule", Modeled)  # the choices follow the acceptance, not the box's load
    eng = Engine(tiny, max_seq_len=256)
    session = SessionIndex(cap=4096)
    accepted = []
    for prompt in PROMPTS:
        want, _ = eng.generate(prompt, max_new_tokens=48, stop_ids=[], **sampling)
        got, stats = speculative.generate(eng, speculative.NgramDrafter(session=session), prompt, k=8,
                                          max_new_tokens=48, stop_ids=[], **sampling)
        assert got == want
        session.add(got)
        accepted.append(sum(r.n_accepted for r in stats.rounds[1:] if r.n_drafted))
    _, without = speculative.generate(eng, speculative.NgramDrafter(), PROMPTS[3], k=8, max_new_tokens=48,
                                      stop_ids=[], **sampling)
    if sampling["temperature"]:  # (the tiny model's greedy text repeats itself: the prompt lookup has it all)
        assert accepted[3] >= 30 and accepted[3] > 5 * sum(r.n_accepted for r in without.rounds[1:]), accepted
    assert len(session) <= 4096 and session.end == sum(48 + 1 for _ in PROMPTS)


def test_a_drafter_only_reads_its_session(tiny):
    """A run drafts from the session and leaves it as it was: a ZeroGPU worker's run reads a pickled copy, so
    only what the owner adds may count."""
    eng = Engine(tiny, max_seq_len=256)
    session = SessionIndex()
    session.add(eng.generate(PROMPTS[0], max_new_tokens=32, stop_ids=[])[0])
    before = (list(session.tokens), {g: list(v) for g, v in session.index.items()})
    speculative.generate(eng, speculative.NgramDrafter(session=session), PROMPTS[0], k=8, max_new_tokens=32,
                         stop_ids=[])
    assert (session.tokens, {g: list(v) for g, v in session.index.items()}) == before


def test_a_session_keeps_at_most_its_cap(tiny):
    eng = Engine(tiny, max_seq_len=256)
    session = SessionIndex(cap=100)
    for prompt in PROMPTS * 2:
        want, _ = eng.generate(prompt, max_new_tokens=40, stop_ids=[])
        got, stats = speculative.generate(eng, speculative.NgramDrafter(session=session), prompt, k=5,
                                          max_new_tokens=40, stop_ids=[])
        session.add(got)
        assert got == want and len(session) <= 100 and stats.settings["session_tokens"] <= 100
    assert len(session.index) <= 3 * 100 and all(min(v) >= session.base for v in session.index.values())
