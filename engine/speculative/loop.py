"""Speculative decoding: a drafter proposes up to k tokens, the target verifies k+1 positions in one chunk pass,
and the text that comes out is the text plain decoding would have produced with the same seed, whatever k each
round drafted: every random draw is keyed by output position (sampling.Noise) and a draft is kept where it equals
the target's own draw there. A round costs one host sync; the target's cache then rolls back to the accepted
prefix. The proof, and what a drafter's own draws are for: docs/SPECULATIVE.md.
"""
from __future__ import annotations

import math
import time
from itertools import count
from collections.abc import Iterator

import torch

from engine.ops import ref
from engine.sampling import Noise, SamplingParams, greedy_rows, on_host, sample, shown_at
from engine.speculative.drafters import Draft, Drafter
from engine.speculative.schedule import Schedule
from engine.stats import EMITTED_KINDS, Round, Stats, Token
from engine.timing import now_ms

K_MAX = 16
K_DEFAULT = 8  # the most a round drafts when nothing says (engine/request.py's default k reads it)


def check_k(k) -> None:
    if not (isinstance(k, int) and 1 <= k <= K_MAX):
        raise ValueError(f"k={k} must be an integer in 1..{K_MAX} (draft tokens per round)")


def accept(draft: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance step, on the device, no host sync.

    draft: [k] long; target: [k+1] long, the target's own sample at the k draft positions and after the last
    (each drawn with its position's keyed noise). Returns (n_accepted, next_token), both 0-d long: the drafts
    are kept up to the first that differs from the target's sample, and the next token is the target's sample
    there (resampled) or after the last draft (bonus)."""
    k = draft.shape[0]
    assert target.shape == (k + 1,)
    n = (draft == target[:k]).long().cumprod(0).sum()
    return n, target[n]


def judge(draft: Draft, logits: torch.Tensor, sampling: SamplingParams, noise: Noise,
          position: int, logsumexp=ref.logsumexp, softmax=ref.softmax, greedy=greedy_rows) -> tuple[list[Token], int]:
    """Verify logits [k+1, V] against a draft whose first token is output position `position` -> the round's
    tokens (accepted, rejected, resampled | bonus) and the accepted count, read back in one host sync.
    `logsumexp` and `softmax` are the engine's OpSet's (engine/sampling.py shown_at, probs), `greedy` the
    engine's (argmax, max, logsumexp) of each row (Engine.greedy: the head's own where it made them)."""
    if on_host(logits):
        return judge_on_host(draft, logits, sampling, noise, position, greedy, softmax)
    return judge_on_device(draft, logits, sampling, noise, position, logsumexp, softmax)


def judge_on_host(draft: Draft, logits: torch.Tensor, sampling: SamplingParams, noise: Noise,
                  position: int, greedy=greedy_rows, softmax=ref.softmax) -> tuple[list[Token], int]:
    """judge for logits numpy reads in place (sampling.on_host): the same draws (sample, accept), then the rows
    read on the host, where judge_on_device assembles the round in ~25 small tensor ops, each slow with the caches
    cold after the verify pass (default model, copy set: 353 -> 154-158 us a round at temperature 0, 354 -> 256 at
    0.7). Greedy takes each row's argmax and logsumexp from `greedy` (sampling.greedy_rows), and shows
    exp(logit - logsumexp) as shown_at does: the same tokens and count as judge_on_device, the same probabilities
    within float rounding (sampled: the same floats)."""
    ids = draft.ids.tolist()
    k = len(ids)
    if sampling.greedy:
        rows = logits.numpy()
        picks = greedy(logits)
        target, lse = [p[0] for p in picks], [p[2] for p in picks]  # each row's first maximum, as argmax takes it
        n = 0
        while n < k and ids[n] == target[n]:  # kept up to the first draft that differs, as accept keeps them
            n += 1
        nxt = target[n]

        def shown(r: int, tok: int) -> float:
            return math.exp(float(rows[r, tok]) - lse[r])
    else:
        # row r: plain decoding's draw at `position` + r
        target, p_t = sample(logits, sampling, noise.at(position), softmax)
        n, nxt = (int(x) for x in accept(draft.ids, target))
        dist = p_t.numpy()

        def shown(r: int, tok: int) -> float:
            return float(dist[r, tok])

    pd = [1.0] * k if draft.p is None else draft.p.tolist()
    pd_next = float("nan") if draft.probs is None or n == k else float(draft.probs[n, nxt])
    pt = [shown(i, ids[i]) for i in range(min(n + 1, k))]  # the drafts judged: accepted, and the rejected one
    return round_tokens(ids, n, nxt, pt, pd, shown(n, nxt), pd_next), n


def judge_on_device(draft: Draft, logits: torch.Tensor, sampling: SamplingParams, noise: Noise,
                    position: int, logsumexp=ref.logsumexp, softmax=ref.softmax) -> tuple[list[Token], int]:
    """judge with every step on the logits' device (sample, accept, shown_at) and one host sync at the end."""
    k = draft.ids.shape[0]
    # row r: plain decoding's draw at `position` + r
    target, p_t = sample(logits, sampling, noise.at(position), softmax)
    n, nxt = accept(draft.ids, target)
    # the drafts' shown probabilities, then the next token's: one shown_at over k + 1 (row, id) pairs
    rows = torch.cat([torch.arange(k, device=logits.device), n[None]])
    shown = shown_at(logits, rows, torch.cat([draft.ids, nxt[None]]), p_t, sampling, logsumexp)
    pd = torch.ones(k, device=logits.device) if draft.p is None else draft.p
    nan = torch.full((1,), float("nan"), device=logits.device)
    pd_next = nan if draft.probs is None else torch.cat([draft.probs[:, nxt], nan])[n, None]
    packed = torch.cat([torch.stack([n, nxt]).double(), draft.ids.double(), shown[:k].double(),
                        pd.double(), shown[k:].double(), pd_next.double()]).tolist()
    n, nxt, pt_next, pd_next = int(packed[0]), int(packed[1]), packed[-2], packed[-1]
    ids, pt, pd = (packed[2 + i * k:2 + (i + 1) * k] for i in range(3))
    return round_tokens([int(i) for i in ids], n, nxt, pt, pd, pt_next, pd_next), n


def round_tokens(ids: list[int], n: int, nxt: int, pt: list[float], pd: list[float], pt_next: float,
                 pd_next: float) -> list[Token]:
    """A verify round's tokens: drafts ids[:n] accepted, then ids[n] rejected and nxt resampled in its place, or
    nxt the bonus after all k. pt / pd: the drafts' shown probabilities (at least the first min(n + 1, k)); pt_next:
    nxt's; pd_next: the drafter's probability of a resampled nxt (NaN: none, shown as None)."""
    k = len(ids)
    tokens = [Token(ids[i], "accepted", i, pt[i], pd[i]) for i in range(n)]
    if n < k:
        tokens.append(Token(ids[n], "rejected", n, pt[n], pd[n]))
        tokens.append(Token(nxt, "resampled", n, pt_next, None if pd_next != pd_next else pd_next))
    else:
        tokens.append(Token(nxt, "bonus", None, pt_next, None))
    return tokens


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
def stream(eng, drafter: Drafter, prompt_ids, k: int = K_DEFAULT, max_new_tokens: int = 64,
           temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = 0, stop_ids=None,
           adaptive: bool = True) -> Iterator[Round]:
    """Round 0 is the prefill (its token is the first output, as in Engine.stream), then one Round per
    draft -> verify -> accept, or a plain decode step where the schedule picks k = 0 or the drafter has
    nothing to propose. adaptive=False drafts k tokens whenever the drafter can (the budget permitting)."""
    check_k(k)
    sampling = SamplingParams(temperature, top_p, top_k, seed)
    noise = eng.begin(prompt_ids, max_new_tokens, sampling)
    stop = set(eng.model.eos_ids if stop_ids is None else stop_ids)
    clock, t0 = eng.clock, time.perf_counter()
    schedule = Schedule(k, drafter, adaptive)
    schedule.recall(eng)

    # The drafter's own prefill runs first, inside round 0 (draft_ms), so the first token's time is honest; a
    # calibrated layer skip over a short prompt has made the target's prefill there too (Drafter.prefilled).
    start, a = now_ms(t0), clock.mark()
    drafter.begin(eng, list(prompt_ids), sampling, max_new_tokens)
    b = clock.mark()
    logits = drafter.prefilled()
    if logits is None:
        logits = eng.prefill(list(prompt_ids))
    c = clock.mark()
    tok, p = eng.pick(logits, sampling, noise.at(0))
    d = clock.mark()
    done = tok in stop or max_new_tokens == 1
    yield Round(0, [Token(tok, "target", p_target=p)], start, now_ms(t0), draft_ms=clock.ms(a, b),
                target_ms=clock.ms(b, c), sample_ms=clock.ms(c, d), finished=done, draft_info=drafter.describe())
    n_out, n_acc, emitted = 1, 0, [tok]

    for index in count(1):
        if done:
            drafter.commit(n_acc, emitted)  # the run's last tokens, for a drafter that keeps what runs produced
            schedule.remember(eng)
            return
        # draft_ms covers the drafter's whole share of the round: the commit of the last round's outcome (here
        # rather than at that round's end: its device work then completes before this round's sync, so every
        # CUDA event read below has finished), the lookup, the catch-up and the proposal; propose_ms is the
        # proposal alone, what the schedule's cost per draft token measures
        start, a = now_ms(t0), clock.mark()
        drafter.commit(n_acc, emitted)
        k_round = schedule.choose(drafter.context(), max_new_tokens - n_out)
        if k_round:
            drafter.prepare()
        a2 = clock.mark()
        draft = drafter.propose(k_round, sampling, noise.at(n_out)) if k_round else None
        b = clock.mark()
        last = torch.tensor(emitted[-1:], dtype=torch.long, device=eng.device)
        if draft is None or draft.ids.shape[0] == 0:
            logits = eng.decode(last)[0]
            c = clock.mark()
            tok, p = eng.pick(logits, sampling, noise.at(n_out))
            tokens, n_acc, n_drafted = [Token(tok, "target", p_target=p)], 0, 0
        else:
            base = eng.length
            logits = eng.chunk(torch.cat([last, draft.ids])[None])[0]  # [k'+1, V]
            c = clock.mark()
            tokens, n_acc = judge(draft, logits, sampling, noise, n_out, eng.model.ops.logsumexp,
                                  eng.model.ops.softmax, eng.greedy)
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
                    sample_ms=clock.ms(c, d), n_drafted=n_drafted, finished=done, k=k_round, verified=verified,
                    propose_ms=clock.ms(a2, b) if draft is not None else 0.0)
        schedule.observe(rnd)
        yield rnd


def generate(eng, drafter: Drafter, prompt_ids, k: int = K_DEFAULT, max_new_tokens: int = 64,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = 0, stop_ids=None,
             adaptive: bool = True) -> tuple[list[int], Stats]:
    """-> (the new ids, Stats); Stats.baseline_tok_s is left for a caller that measured a plain run."""
    settings = dict(mode=drafter.name, k=k, adaptive=adaptive, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    rounds = list(stream(eng, drafter, prompt_ids, k, max_new_tokens, temperature, top_p, top_k, seed, stop_ids,
                         adaptive))
    stats = eng.stats(rounds, len(prompt_ids), settings | drafter.describe())
    return stats.ids, stats
