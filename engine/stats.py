"""Round and Token events, and the Stats computed from them.

One vocabulary everywhere (docs/ARCHITECTURE.md): a token's kind is one of KINDS. A plain decode step is a Round
with one `target` token; a speculative round carries its accepted / rejected / resampled / bonus tokens.
Everything the UI or a CSV shows is computed here from the events, never re-measured.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

KINDS = ("target", "accepted", "rejected", "resampled", "bonus")
EMITTED_KINDS = ("target", "accepted", "resampled", "bonus")  # `rejected` is shown, never output
PHASES = ("draft", "target", "sample", "host")  # what a round's time is spent on, in order (Round.phases)
# A rate needs an interval the clock resolves as work: no decode step of any engine takes under 10 us (a CUDA
# graph's launch alone takes about that), so a shorter one is tokens that arrived together (an endpoint's
# chunks in one read, stamped microseconds apart), and their tok/s would be a million of nothing.
MIN_RATE_MS = 0.01


@dataclass
class Token:
    token_id: int
    kind: str
    draft_position: int | None = None  # 0-based position in the round's draft; None for target/bonus
    p_target: float | None = None  # target probability of this token where defined
    p_draft: float | None = None  # drafter probability of this token (1.0 for one-hot drafters)
    text: str | None = None  # the text a remote server sent for it (engine.endpoint), where ids are not ours
    inferred: bool = False  # its kind inferred from a chunk's token count, not reported by the server


@dataclass
class Round:
    index: int  # 0 is the prefill round that emits the first token
    tokens: list[Token]
    t_start_ms: float  # since the run started (prompt handed to the engine)
    t_end_ms: float
    draft_ms: float = 0.0  # the drafter's time in the round: commit, lookup, catch-up and proposal (plain rounds too)
    target_ms: float = 0.0  # the target's forward: prefill, decode step, or the k+1 verify chunk
    sample_ms: float = 0.0  # sampling / acceptance on the logits
    n_drafted: int = 0  # draft tokens the target verified this round
    finished: bool = False  # set on the round that ends the run (EOS or max_new_tokens)
    k: int | None = None  # the draft length chosen for this round (0: a plain step); None outside speculation
    verified: int | None = None  # drafts the verify pass accepted, where EOS or the budget cut the tokens short
    draft_info: dict | None = None  # round 0 of a speculative run: the drafter as begin() left it (Drafter.describe)
    propose_ms: float = 0.0  # the proposal alone, within draft_ms: what a draft token's measured cost is made of

    @property
    def total_ms(self) -> float:
        return self.t_end_ms - self.t_start_ms

    @property
    def host_ms(self) -> float:
        """Round time not inside draft / target / sample: Python, syncs, bookkeeping."""
        return max(0.0, self.total_ms - self.draft_ms - self.target_ms - self.sample_ms)

    @property
    def emitted(self) -> list[Token]:
        return [t for t in self.tokens if t.kind in EMITTED_KINDS]

    @property
    def token_ms(self) -> float | None:
        """Each emitted token's latency: the round's time shared by the tokens it emitted.

        A speculative round delivers several tokens at once; sharing its time is what makes ITL comparable
        between plain and speculative runs (the sum of ITLs is the decode time either way)."""
        n = len(self.emitted)
        return self.total_ms / n if n else None

    def phases(self) -> list[tuple[str, float, float]]:
        """(phase, start ms, duration ms) of the round's non-empty phases, in the order they ran:
        draft -> target -> sample, then host (the rest of the round)."""
        out, t = [], self.t_start_ms
        for phase, ms in (("draft", self.draft_ms), ("target", self.target_ms), ("sample", self.sample_ms)):
            if ms > 0:
                out.append((phase, t, ms))
            t += ms
        if self.host_ms > 0:
            out.append(("host", t, self.host_ms))
        return out

    @property
    def n_accepted(self) -> int:
        """Drafts the target accepted. A round that EOS or the budget ended inside its accepted drafts shows
        only the tokens up to the end, but its acceptance is what the verify pass decided (`verified`)."""
        if self.verified is not None:
            return self.verified
        return sum(t.kind == "accepted" for t in self.tokens)

    @property
    def accepted_len(self) -> int | None:
        """The round's accepted length: the tokens its verify pass settled, the drafts it accepted plus the one
        it added (resampled or bonus), as the verify pass decided even where EOS or the budget cut the round's
        tokens short; None for a round that verified no drafts. The one definition behind "mean accepted
        length" in Stats.summary, the CLI and the CSV rows."""
        return self.n_accepted + 1 if self.n_drafted else None


def finite(x) -> float | None:
    """x as a float, or None for a missing, NaN or infinite figure (CSV cells, JSON, the page)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Stats:
    rounds: list[Round]
    prompt_len: int
    settings: dict = field(default_factory=dict)  # mode, k, temperature, ... as the run was asked
    peak_memory_mb: float = float("nan")
    weight_bytes: int = 0  # bytes read per decode step for weights (for % of bandwidth ceiling)
    bandwidth_gbs: float = float("nan")  # measured memory bandwidth, when a caller measured it
    baseline_tok_s: float | None = None  # another run's decode tok/s this one's speedup is against (Compare)

    @property
    def ids(self) -> list[int]:
        return [t.token_id for r in self.rounds for t in r.emitted]

    def token_latencies_ms(self) -> list[float]:
        """Round.token_ms of each emitted token after the first (whose latency is the TTFT)."""
        return [ms for r in self.rounds[1:] if (ms := r.token_ms) is not None for _ in range(len(r.emitted))]

    def summary(self) -> dict:
        rs = self.rounds
        n_tokens = len(self.ids)
        ttft = rs[0].t_end_ms if rs else float("nan")
        total = rs[-1].t_end_ms if rs else float("nan")
        decode_ms = total - ttft
        itl = self.token_latencies_ms()
        spec = [r for r in rs if r.n_drafted]
        drafted = sum(r.n_drafted for r in spec)
        accepted = sum(r.n_accepted for r in spec)
        decode_rounds = [r for r in rs[1:] if r.k is not None]  # the decode rounds of a speculative run
        round_ms = sum(r.total_ms for r in decode_rounds)
        decode_tok_s = (n_tokens - 1) / decode_ms * 1e3 if n_tokens > 1 and decode_ms >= MIN_RATE_MS else float("nan")
        s = dict(
            tokens=n_tokens,
            prompt_tokens=self.prompt_len,
            rounds=len(rs),
            ttft_ms=ttft,
            itl_mean_ms=sum(itl) / len(itl) if itl else float("nan"),
            itl_p50_ms=percentile(itl, 50),
            itl_p99_ms=percentile(itl, 99),
            decode_tok_s=decode_tok_s,
            total_ms=total,
            peak_memory_mb=self.peak_memory_mb,
            # drafts accepted over drafts verified: 0 where every draft was rejected, NaN where none was made
            acceptance_rate=accepted / drafted if drafted else float("nan"),
            # Round.accepted_len averaged over the rounds that verified drafts
            mean_accepted_len=sum(r.accepted_len for r in spec) / len(spec) if spec else float("nan"),
            # the drafter's share of the decode rounds' time, plain rounds included (a lookup that found nothing
            # to propose still cost its lookup); NaN for plain decoding, which has no drafter
            draft_overhead_pct=100 * sum(r.draft_ms for r in decode_rounds) / round_ms if round_ms else float("nan"),
        )
        ks = [k for _, k in self.chosen_k()]
        s["mean_k"] = sum(ks) / len(ks) if ks else float("nan")  # the schedule's mean draft length (0 = plain)
        s["plain_round_pct"] = 100 * sum(k == 0 for k in ks) / len(ks) if ks else float("nan")
        ceiling = self.bandwidth_gbs * 1e9 / self.weight_bytes if self.weight_bytes else float("nan")
        s["bandwidth_ceiling_tok_s"] = ceiling
        s["pct_of_ceiling"] = 100 * decode_tok_s / ceiling if ceiling == ceiling and ceiling > 0 else float("nan")
        if self.baseline_tok_s:
            s["speedup"] = decode_tok_s / self.baseline_tok_s
        return s

    def per_position_acceptance(self) -> list[float]:
        """Acceptance rate at each draft position 0..k-1 (of the drafts that reached that position)."""
        seen: dict[int, list[int]] = {}
        for r in self.rounds:
            # the verify pass judges drafts in order up to the first rejection: positions 0..n, n the accepted count
            for p in range(min(r.n_drafted, r.n_accepted + 1)):
                seen.setdefault(p, []).append(p < r.n_accepted)
        return [sum(seen[p]) / len(seen[p]) for p in sorted(seen)]

    def chosen_k(self) -> list[tuple[int, int]]:
        """(round index, the draft length chosen for it) for every decode round of a speculative run."""
        return [(r.index, r.k) for r in self.rounds[1:] if r.k is not None]

    @property
    def drafter_info(self) -> dict:
        """What the drafter reported after its begin() (e.g. the layers a calibrated layer-skip drafter runs)."""
        return dict(self.rounds[0].draft_info or {}) if self.rounds else {}

    def accepted_histogram(self) -> dict[int, int]:
        """Number of speculative rounds by how many drafts they accepted."""
        hist: dict[int, int] = {}
        for r in self.rounds:
            if r.n_drafted:
                hist[r.n_accepted] = hist.get(r.n_accepted, 0) + 1
        return dict(sorted(hist.items()))

    def rows(self) -> list[dict]:
        """One dict per token a round touched (rejected drafts included), in order, for CSV. round_accepted_len is
        the round's Round.accepted_len: its mean over the rounds that have one is summary()'s mean_accepted_len."""
        rows, index = [], 0
        for r in self.rounds:
            token_ms = r.token_ms  # once per round: a round of n tokens is n rows, not n * n
            for t in r.tokens:
                emitted = t.kind in EMITTED_KINDS
                rows.append(dict(
                    round=r.index, round_k=r.k, round_accepted_len=r.accepted_len,
                    token_index=index if emitted else None, **asdict(t),
                    latency_ms=token_ms if emitted else None, round_ms=r.total_ms,
                    draft_ms=r.draft_ms, target_ms=r.target_ms, sample_ms=r.sample_ms,
                    t_end_ms=r.t_end_ms,
                ))
                index += emitted
        return rows
