"""A greedy pick's numbers, (first argmax, max, logsumexp) of each row of logits: the CPU kernel's pass
(csrc/cpu/greedy.h, ops greedy) against torch's argmax / max / logsumexp and its twin ref.greedy, on every
instruction-set path; the head's matmul that makes them as it writes each stretch of logits (linear_greedy)
against the plain matmul and the pass over its finished rows (the same bits); and the engine's use of the head's
picks (sampling.HeadPicks): only for the rows of the logits they were made of."""
from __future__ import annotations

import gc

import pytest
import torch

from cpu_paths import KERNEL_FORMATS, NAN, each_path, linear, randn
from engine import Engine, Tokenizer, load_model
from engine import weights as W
from engine.ops import ref
from engine.sampling import HELD_ROWS, HeadPicks, SamplingParams, greedy_rows

INF = float("inf")


def assert_picks(got, x: torch.Tensor) -> None:
    """got: one (index, max, logsumexp) per row of x: torch's first argmax and max exactly, its logsumexp in
    doubles within 2e-7 of the row's scale (each 1,024-value stretch summed in fp32, ~1e-7 relative)."""
    want_lse = torch.logsumexp(x.double(), -1)
    assert [g[0] for g in got] == x.argmax(-1).tolist()
    assert [g[1] for g in got] == x.max(-1).values.double().tolist()
    for g, w in zip(got, want_lse.tolist(), strict=True):
        assert abs(g[2] - w) <= 2e-7 * max(1.0, abs(w)), (g, w)


@pytest.mark.parametrize("V", [1, 17, 1023, 1024, 1025, 4097, 49152, 151936])
def test_greedy_is_torchs(m, V):
    """One row (split across the threads by stretches of 1,024) or several, at the scale of real logits and far
    past exp's range; the twin gives the same indices and maxima."""
    for rows in (1, 2, 9):
        for scale in (8.0, 300.0):
            x = randn(rows, V, seed=V + rows, scale=scale)
            got = m.greedy(x)
            assert_picks(got, x)
            assert [g[:2] for g in got] == [g[:2] for g in ref.greedy(x)]


def test_greedy_ties_go_to_the_first_wherever_they_sit(m):
    """Tied maxima within a stretch, across stretches (the first stretch holding the maximum is the one searched),
    in the last short stretch, and a row whose later stretch has the larger maximum: torch's first index."""
    V = 5000  # stretches 0..3 of 1,024 and a last one of 904
    for where in ([3, 7], [1023, 1024], [2000, 10, 4999], [4990, 4999], [4096, 4097], [0, 4999]):
        x = randn(1, V, seed=sum(where), scale=4)
        x[0, where] = x.max() + 1
        assert m.greedy(x)[0][0] == min(where)
    x = randn(1, V, seed=3, scale=4)
    x[0, 100], x[0, 3000] = 50.0, 50.5
    assert m.greedy(x)[0][:2] == (3000, 50.5)


def special_rows(V):
    """Rows holding NaN, inf and -inf: a NaN (two), a +inf (two, and a -inf), all -inf, all -inf but a few, every
    other value -inf, a NaN after a +inf."""
    x = randn(7, V, seed=V, scale=5)
    x[0, [V // 2 + 3, V - 1]] = NAN
    x[1, [V - 2, 5]] = INF
    x[1, 0] = -INF
    x[2] = -INF
    x[3, : V - 30] = -INF
    x[4, 1::2] = -INF
    x[5, 2], x[5, V - 1] = INF, NAN
    x[6, V // 2:] = -INF
    return x


def test_greedy_nan_and_inf_are_torchs(m):
    """A NaN wins at its first index (the row's max and logsumexp NaN), a +inf at its first (+inf, +inf), a row of
    -inf gives (0, -inf, -inf), a -inf among finite values counts as e^-inf = 0: torch's answers and the twin's,
    for each row alone and all together, in one stretch or several."""
    for V in (40, 3000, 20000):
        x = special_rows(V)
        want = ref.greedy(x)
        for got in (m.greedy(x), [m.greedy(x[r:r + 1].clone())[0] for r in range(7)]):
            for g, w in zip(got, want, strict=True):
                assert g[0] == w[0]
                torch.testing.assert_close(torch.tensor(g[1:]), torch.tensor(w[1:]), rtol=2e-7, atol=0,
                                           equal_nan=True)


def test_greedy_is_the_same_bits_on_any_thread_count(cpu_module):
    """The stretches fold in order whatever thread made them: 1, 2, 3 and 48 threads give the same floats."""
    x = randn(3, 50000, seed=8, scale=6)
    threads = torch.get_num_threads()
    try:
        seen = []
        for n in (1, 2, 3, 48):
            torch.set_num_threads(n)
            seen.append(cpu_module.greedy(x))
        assert all(s == seen[0] for s in seen)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_the_heads_picks_are_its_logits_picks(cpu_module, fmt):
    """linear_greedy writes the plain matmul's logits, bit for bit, and returns greedy's picks of them, the same
    floats: rows 1..17 (a step, verify passes), a vocabulary of whole stretches and one with a short last one, on
    every path; a head of no inputs gives zeros and their picks."""
    for n_out in (3000, 2048):
        b = W.quantize(randn(n_out, 256, seed=n_out, scale=0.5), fmt)
        panels = W.to_panels(b)
        code = cpu_module.formats().index(fmt)
        for name, mod in each_path(cpu_module):
            for T in (1, 2, 6, 9, 17):
                x = randn(T, 256, seed=T, scale=3.0)
                plain, fused = torch.full((T, n_out), NAN), torch.full((T, n_out), NAN)
                linear(mod, fmt, plain, x, *panels)
                picks = mod.linear_greedy(fused, x, code, list(panels))
                assert torch.equal(fused, plain), (name, T)
                assert picks == mod.greedy(plain), (name, T)
                assert_picks(picks, plain)


def test_linear_greedy_rejects_a_head_of_strided_rows(cpu_module):
    b = W.quantize(randn(64, 64, seed=1), "int8")
    wide = torch.empty(2, 100)
    with pytest.raises(RuntimeError, match="out must be a dense"):
        cpu_module.linear_greedy(wide[:, :64], randn(2, 64, seed=2), cpu_module.formats().index("int8"),
                                 list(W.to_panels(b)))


def test_head_picks_answer_only_for_their_own_rows():
    """The picks of a [3, V] head pass serve any run of its rows (a verify pass's rows, one row of a step, as a
    view), and nothing else: another tensor with the same values, a strided view, logits no longer alive."""
    logits = randn(3, 2000, seed=4, scale=5)
    picks = ref.greedy(logits)
    head = HeadPicks(logits, picks)
    assert head.of(logits) == picks and head.of(logits[1:]) == picks[1:] and head.of(logits[2]) == [picks[2]]
    assert head.of(logits[0][None]) == [picks[0]]
    assert head.of(logits.clone()) is None and head.of(logits[:, ::2]) is None
    assert head.of(logits.view(-1)[1:2001]) is None  # the right length, but not a row's start
    assert greedy_rows(logits[1:], head, greedy=lambda x: pytest.fail("recomputed")) == picks[1:]
    other = randn(2, 2000, seed=5, scale=5)
    assert greedy_rows(other, head) == ref.greedy(other)
    del logits
    gc.collect()
    assert head.alive() and head.of(other) is None  # a step's logits are held: the memory is still theirs


def test_a_long_passes_picks_answer_only_while_its_logits_live():
    """A pass of more rows than HELD_ROWS (a prefill's full logits) is not kept alive by its picks: once the
    logits are freed, their memory may hold another tensor, which the picks must not answer for."""
    logits = randn(HELD_ROWS + 1, 300, seed=6, scale=5)
    head = HeadPicks(logits, ref.greedy(logits))
    assert head.of(logits[:2]) == ref.greedy(logits[:2])
    del logits
    gc.collect()
    assert not head.alive() and head.of(torch.empty(1, 300)) is None


def test_the_picks_outlive_the_views_an_inference_mode_run_takes():
    """Under torch.inference_mode a view keeps no Python reference to its base, and the head's tensor dies as soon
    as the caller holds only a view of it: the picks must still answer for that view's rows."""
    with torch.inference_mode():
        base = randn(6, 500, seed=7, scale=5)
        head = HeadPicks(base, ref.greedy(base))
        view = base.view(1, 6, 500)[0]
        del base
        gc.collect()
        assert head.of(view) == ref.greedy(view) and head.of(view[3:]) == ref.greedy(view[3:])


@pytest.fixture(scope="module")
def default_engine():
    model = load_model(None, device="cpu")
    if model.ops.head_greedy is None:
        pytest.skip(f"the CPU kernels are not in use: {model.ops.reason}")
    return Engine(model, max_seq_len=256), Tokenizer(model.path)


@pytest.mark.slow
def test_a_steps_pick_is_the_heads_and_the_kernels(default_engine):
    """After each decode step and verify pass of the default model, under torch.inference_mode as every run
    decodes, the engine's greedy picks are the head's own (HeadPicks answers), the same floats as the standalone
    pass over the logits and torch's argmax; a greedy run's tokens and shown probabilities are those of picking
    from a copy of each step's logits (no head picks)."""
    with torch.inference_mode():
        eng, tok = default_engine
        prompt = tok.encode_chat("Name three rivers.")
        sampling = SamplingParams(0.0)
        eng.begin(prompt, 40, sampling)
        logits = eng.prefill(prompt)
        ids, ps = [], []
        for _ in range(12):
            tok_id, p = eng.pick(logits, sampling, None)
            copied = eng.pick(logits.clone(), sampling, None)
            assert eng.model.head_picks.of(logits) is not None
            assert eng.greedy(logits) == eng.model.ops.greedy(logits[None]) and tok_id == int(logits.argmax())
            assert (tok_id, p) == copied
            ids.append(tok_id)
            ps.append(p)
            logits = eng.decode(torch.tensor([tok_id]))[0]
        rows = eng.chunk(torch.tensor([ids[-6:]]))[0]  # a verify pass's rows
        assert eng.greedy(rows) == eng.model.ops.greedy(rows) and eng.model.head_picks.of(rows) is not None
        assert [r[0] for r in eng.greedy(rows[2:])] == rows[2:].argmax(-1).tolist()
