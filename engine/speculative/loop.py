"""Speculative decoding: a drafter proposes k tokens, the target verifies k+1 positions in one chunk pass,
and rejection sampling keeps the output distributed exactly as plain sampling from the target.

Acceptance follows Leviathan et al. (2023) / Chen et al. (2023), the same step gpt-fast, HF assisted
generation and vLLM's rejection sampler implement: keep draft x with probability min(1, p_t(x) / p_d(x))
up to the first rejection, then draw from normalize(max(p_t - p_d, 0)); if all k are kept, draw a bonus
token from the target's last row. p_t and p_d are both shaped by sampling.probs (temperature, top-k,
top-p), the one shaping plain decoding uses; at temperature 0 both are one-hot, so a draft is kept while
it equals the target's argmax and the token after the run is that argmax. Greedy output is therefore the
plain greedy output wherever the verify pass's logits rank tokens as a decode step's do: token for token in
fp32 (the tests' setting); in bf16 or fp16 a chunk pass and a decode step round differently, so a near-tie
between the top two tokens can break the other way and the texts part there (the bf16 test in
tests/test_speculative.py checks that a parting is such a near-tie).

k is the most a round drafts. The schedule (engine/speculative/schedule.py) picks each round's k from the run's
measured costs and acceptance, 0 being a plain decode step, and never more than the tokens left less one
(the token after the drafts comes free). The target's cache therefore never holds more than plain decoding's
prompt + max_new_tokens - 1 positions, and a speculative run needs no slots beyond a plain one's.

A round costs one host sync: the accepted count, the emitted ids and their probabilities come back in one
read. The target cache then rolls back to the accepted prefix (a fill of seq_lens) and the drafter
rolls back or catches up in commit().
"""
from __future__ import annotations

import time
from itertools import count
from collections.abc import Iterator

import torch

from engine.sampling import SamplingParams, draw, probs, shown_probs
from engine.speculative.drafters import Draft, Drafter
from engine.speculative.schedule import Schedule
from engine.stats import EMITTED_KINDS, Round, Stats, Token
from engine.timing import now_ms

K_MAX = 16


def check_k(k) -> None:
    if not (isinstance(k, int) and 1 <= k <= K_MAX):
        raise ValueError(f"k={k} must be an integer in 1..{K_MAX} (draft tokens per round)")


def accept(draft: torch.Tensor, p_target: torch.Tensor, p_draft: torch.Tensor | None = None,
           gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance step, on the device, no host sync.

    draft: [k] long; p_target: [k+1, V] target distributions at the k draft positions and after the last;
    p_draft: [k, V] the distributions the drafts were drawn from, or None for a one-hot drafter.
    Returns (n_accepted, next_token), both 0-d long: the token after the accepted run is the resampled one
    (n < k) or the bonus (n == k)."""
    k, V = draft.shape[0], p_target.shape[-1]
    assert p_target.shape[0] == k + 1 and (p_draft is None or p_draft.shape == (k, V))
    rows = torch.arange(k, device=draft.device)
    pt = p_target[rows, draft].double()
    pd = torch.ones_like(pt) if p_draft is None else p_draft[rows, draft].double()
    # u < p_t / p_d without dividing (p_d of a drawn draft is > 0); strict, so p_t = 0 is never kept
    u = torch.rand(k, dtype=torch.float64, device=draft.device, generator=gen)
    n = (u * pd < pt).long().cumprod(0).sum()
    # the residual's row n; padding with a zero draft row makes row k the plain target row: the bonus
    if p_draft is None:
        drafted = torch.cat([draft, draft.new_full((1,), -1)])[n]
        residual = p_target[n] * (torch.arange(V, device=draft.device) != drafted)
    else:
        residual = (p_target[n] - torch.cat([p_draft, p_draft.new_zeros(1, V)])[n]).clamp_min(0)
    # an all-zero residual needs p_t == p_d, where a rejection has probability 0; rounding can still get here
    residual = torch.where(residual.sum() > 0, residual, p_target[n])
    return n, draw(residual[None], gen)[0]


def judge(draft: Draft, logits: torch.Tensor, sampling: SamplingParams, gen) -> tuple[list[Token], int]:
    """Verify logits [k+1, V] against a draft -> the round's tokens (accepted, rejected, resampled | bonus)
    and the accepted count, read back in one host sync."""
    k = draft.ids.shape[0]
    p_t = probs(logits, sampling)
    n, nxt = accept(draft.ids, p_t, draft.probs, gen)
    shown = shown_probs(logits, p_t, sampling)
    rows = torch.arange(k, device=logits.device)
    pd = torch.ones(k, device=logits.device) if draft.p is None else draft.p
    nan = torch.full((1,), float("nan"), device=logits.device)
    pd_next = nan if draft.probs is None else torch.cat([draft.probs[:, nxt], nan])[n, None]
    packed = torch.cat([torch.stack([n, nxt]).double(), draft.ids.double(), shown[rows, draft.ids].double(),
                        pd.double(), shown[n, nxt][None].double(), pd_next.double()]).tolist()
    n, nxt, pt_next, pd_next = int(packed[0]), int(packed[1]), packed[-2], packed[-1]
    ids, pt, pd = (packed[2 + i * k:2 + (i + 1) * k] for i in range(3))
    tokens = [Token(int(ids[i]), "accepted", i, pt[i], pd[i]) for i in range(n)]
    if n < k:
        tokens.append(Token(int(ids[n]), "rejected", n, pt[n], pd[n]))
        tokens.append(Token(nxt, "resampled", n, pt_next, None if pd_next != pd_next else pd_next))
    else:
        tokens.append(Token(nxt, "bonus", None, pt_next, None))
    return tokens, n


def cut(tokens: list[Token], stop: set[int], budget: int) -> tuple[list[Token], bool]:
    """Tokens up to and including the first stop id or the budget-th emitted token; True if the run ends."""
    emitted = 0
    for i, t in enumerate(tokens):
        if t.kind in EMITTED_KINDS:
            emitted += 1
            if t.token_id in stop or emitted == budget:
                return tokens[: i + 1], True
    return tokens, False


@torch.inference_mode()
def stream(eng, drafter: Drafter, prompt_ids, k: int = 5, max_new_tokens: int = 64, temperature: float = 0.0,
           top_p: float = 1.0, top_k: int = 0, seed: int | None = 0, stop_ids=None,
           adaptive: bool = True) -> Iterator[Round]:
    """Round 0 is the prefill (its token is the first output, as in Engine.stream), then one Round per
    draft -> verify -> accept, or a plain decode step where the schedule picks k = 0 or the drafter has
    nothing to propose. adaptive=False drafts k tokens whenever the drafter can (the budget permitting)."""
    check_k(k)
    sampling = SamplingParams(temperature, top_p, top_k, seed)
    gen = eng.begin(prompt_ids, max_new_tokens, sampling)
    stop = set(eng.model.eos_ids if stop_ids is None else stop_ids)
    clock, t0 = eng.clock, time.perf_counter()
    schedule = Schedule(k, drafter, adaptive)

    # The drafter's own prefill runs first, inside round 0 (draft_ms), so the first token's time is honest.
    start, a = now_ms(t0), clock.mark()
    drafter.begin(eng, list(prompt_ids), sampling, max_new_tokens)
    b = clock.mark()
    logits = eng.prefill(list(prompt_ids))
    c = clock.mark()
    tok, p = eng.pick(logits, sampling, gen)
    d = clock.mark()
    done = tok in stop or max_new_tokens == 1
    yield Round(0, [Token(tok, "target", p_target=p)], start, now_ms(t0), draft_ms=clock.ms(a, b),
                target_ms=clock.ms(b, c), sample_ms=clock.ms(c, d), finished=done, draft_info=drafter.describe())
    n_out, n_acc, emitted = 1, 0, [tok]

    for index in count(1):
        if done:
            return
        start, a = now_ms(t0), clock.mark()
        # commit here rather than at the end of the last round: its device work is then timed as drafting
        # and completes before this round's sync, so every CUDA event read below has finished
        drafter.commit(n_acc, emitted)
        k_round = schedule.choose(drafter.context(), max_new_tokens - n_out)
        draft = drafter.propose(k_round, sampling, gen) if k_round else None
        b = clock.mark()
        last = torch.tensor(emitted[-1:], dtype=torch.long, device=eng.device)
        if draft is None or draft.ids.shape[0] == 0:
            logits = eng.decode(last)[0]
            c = clock.mark()
            tok, p = eng.pick(logits, sampling, gen)
            tokens, n_acc, n_drafted = [Token(tok, "target", p_target=p)], 0, 0
        else:
            base = eng.length
            logits = eng.chunk(torch.cat([last, draft.ids])[None])[0]  # [k'+1, V]
            c = clock.mark()
            tokens, n_acc = judge(draft, logits, sampling, gen)
            eng.rollback(base + 1 + n_acc)
            n_drafted = draft.ids.shape[0]
        d = clock.mark()
        kept, done = cut(tokens, stop, max_new_tokens - n_out)
        # a run that ends inside the accepted drafts shows tokens up to its end; its acceptance stays the verify's
        verified = n_acc if len(kept) < len(tokens) else None
        tokens = kept
        emitted = [t.token_id for t in tokens if t.kind in EMITTED_KINDS]
        n_out += len(emitted)
        rnd = Round(index, tokens, start, now_ms(t0), draft_ms=clock.ms(a, b), target_ms=clock.ms(b, c),
                    sample_ms=clock.ms(c, d), n_drafted=n_drafted, finished=done, k=k_round, verified=verified)
        schedule.observe(rnd)
        yield rnd


def generate(eng, drafter: Drafter, prompt_ids, k: int = 5, max_new_tokens: int = 64, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, seed: int | None = 0, stop_ids=None,
             adaptive: bool = True) -> tuple[list[int], Stats]:
    """-> (the new ids, Stats); Stats.baseline_tok_s is left for a caller that measured a plain run."""
    settings = dict(mode=drafter.name, k=k, adaptive=adaptive, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    rounds = list(stream(eng, drafter, prompt_ids, k, max_new_tokens, temperature, top_p, top_k, seed, stop_ids,
                         adaptive))
    stats = eng.stats(rounds, len(prompt_ids), settings | drafter.describe())
    return stats.ids, stats
