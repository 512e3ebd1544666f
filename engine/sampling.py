"""Sampling: temperature, top-k, top-p and seeded draws keyed by output position; greedy (argmax) at temperature 0.

`probs()` is the one place logits become a sampling distribution, so plain decoding, the drafters and the verify
pass shape their distributions identically. `draw()` is the one way a token is drawn from a distribution, in
plain and speculative decoding alike, and its randomness is `Noise`: the draw for output position i uses a row
of noise that is a function of (seed, i) alone, never of how many draws came before. A speculative run that
verifies a position computes there the very sample plain decoding would have drawn, so the same seed gives the
same text whatever draft lengths the schedule picked (engine/speculative/loop.py).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch

from engine.ops import ref

MASK64 = (1 << 64) - 1
ROWS_KEPT = 20  # noise rows a run keeps: a speculative round uses at most K_MAX + 1 = 17 positions ahead


@dataclass(frozen=True)
class SamplingParams:
    """How a run draws its tokens; a Request's `sampling` (engine/request.py reads each field's metadata: the
    help, the page's label and the range a request accepts; the engine's own API checks only what it needs)."""
    temperature: float = field(default=0.0, metadata=dict(
        label="temperature (0 = greedy)", range=(0.0, 2.0), help="the logits' temperature; 0 is greedy"))
    top_p: float = field(default=1.0, metadata=dict(
        label="top-p", range=(0.05, 1.0), help="sample within the smallest set of this much probability (1: off)"))
    top_k: int = field(default=0, metadata=dict(
        label="top-k (0 = off)", range=(0, 200), help="sample among the k likeliest tokens (0: off)"))
    seed: int | None = field(default=0, metadata=dict(
        label="seed", help="the draws' seed: the same seed gives the same text in every mode and at any k"))

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; use 1 to switch nucleus sampling off")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k={self.top_k} must be an integer >= 0; use 0 to switch top-k off")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device, fill=ref.exp_noise, race=None) -> Noise:
        """The run's noise: from the seed, or from a fresh random seed where seed is None; `fill` makes a row and
        `race`, where given, draws with the noise made on the fly (the engine passes its OpSet's exp_noise and
        race)."""
        return Noise(torch.seed() if self.seed is None else self.seed, device, fill, race)


def position_key(seed: int, position: int) -> int:
    """A 63-bit key for (seed, position), its noise row's: splitmix64's finalizer, so nearby pairs give unrelated
    rows (seed s at position i + 1 and seed s + 1 at position i never share one)."""
    x = (seed * 0x9E3779B97F4A7C15 + position) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) >> 1


class Noise:
    """The random draws of one run, keyed by output position.

    Row i is V independent Exp(1) values (-log U, U uniform in (0, 1)) made by `fill` (an OpSet's exp_noise:
    engine/ops/ref.py, or the CPU kernel, the same uniforms) from position_key(seed, i) alone: the noise output
    token i is drawn with, whichever loop draws it and whenever. A cursor (`position`) says which row the next
    draw takes; a draw of R rows takes R positions and moves it on. Plain decoding never moves it otherwise, so
    its i-th draw is position i; the speculative loop sets it with at() before each draw. With `race` (an
    OpSet's race kernel) a draw hands it the positions' keys and the rows are made on the fly, never written;
    without, draw() races over rows made by `fill`, and rows drawn ahead (a drafter's, a verify pass's past a
    rejection) are kept until the cursor passes them (at most ROWS_KEPT), so a position's row is made once."""

    def __init__(self, seed: int, device, fill=ref.exp_noise, race=None):
        self.seed, self.device, self.fill, self.race = int(seed), torch.device(device), fill, race
        self.position = 0
        self.rows: dict[int, torch.Tensor] = {}  # position -> [V] float32, for positions >= self.position

    def at(self, position: int) -> Noise:
        """Point the cursor at `position`; rows before it are dropped (no draw goes back)."""
        self.position = position
        self.rows = {i: r for i, r in self.rows.items() if i >= position}
        return self

    def row(self, position: int, V: int) -> torch.Tensor:
        r = self.rows.get(position)
        if r is None or r.shape[0] != V:
            r = self.fill(torch.empty(V, device=self.device), position_key(self.seed, position))
            self.rows[position] = r
            while len(self.rows) > ROWS_KEPT:
                del self.rows[min(self.rows)]
        return r

    def take(self, n: int, V: int) -> torch.Tensor:
        """Rows [n, V] for the n positions from the cursor on; the cursor moves past them."""
        rows = torch.stack([self.row(self.position + i, V) for i in range(n)])
        self.position += n
        return rows

    def keys(self, n: int) -> list[int]:
        """The keys of the n positions from the cursor on, whose rows take() would give; the cursor moves past."""
        keys = [position_key(self.seed, self.position + i) for i in range(n)]
        self.position += n
        return keys


def on_host(x: torch.Tensor) -> bool:
    """Whether numpy can read x in place: float32 on the CPU, needing no grad. The host reads (argmax below,
    Engine.pick's greedy_rows, speculative.loop.judge_on_host) skip the small tensor ops that are slow with the
    caches cold."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1), the same indices (the first maximum; a NaN counts as the maximum, as torch's does): on the
    CPU through numpy, whose argmax reads 151,936 float32 logits in ~12 us where torch's takes ~150 (2 AVX2
    cores), about 1% of a 1.5B model's decode step."""
    if on_host(x):
        return torch.as_tensor(x.numpy().argmax(-1))
    return x.argmax(-1)


def probs(logits: torch.Tensor, params: SamplingParams, softmax=ref.softmax) -> torch.Tensor:
    """float32 logits [R, V] -> sampling distribution [R, V]; one-hot argmax when greedy. `softmax` is the OpSet's
    (engine/ops): (x, temperature, top_k, top_p) -> softmax(x / temperature) over the tokens top-k and top-p keep
    (ref.mask_logits), 0 elsewhere; the CPU kernel's reads a row a few times and sorts only the tokens near its
    top (a 49,152-token row with top-p: ~50 us where the twin's torch ops took ~700)."""
    if params.greedy:
        return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()
    return softmax(logits, params.temperature, params.top_k, params.top_p)


def shown_at(logits: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, dist: torch.Tensor | None,
             params: SamplingParams, logsumexp=ref.logsumexp) -> torch.Tensor:
    """The probabilities tokens are reported with, at (rows[j], ids[j]) of logits [R, V]: the sampling
    distribution `dist`'s, except when greedy, where that is one-hot and says nothing, so the model's own softmax
    there, exp(logit - logsumexp(row)). `logsumexp` is the OpSet's (engine/ops): each row is read once and no
    [R, V] softmax is written (a greedy step of a 262,144-token vocabulary spent ~0.6 ms on that softmax)."""
    if not params.greedy:
        return dist[rows, ids]
    return (logits[rows, ids].float() - logsumexp(logits)[rows]).exp()


HELD_ROWS = 32  # a head pass of at most this many rows (decode steps, verify passes) keeps its logits alive


class HeadPicks:
    """greedy's picks (engine/ops/ref.py) of a head pass's logits, made by the pass itself (OpSet.head_greedy) as
    each stretch of logits was written. Read after a CPU step instead, the row came back from memory and the
    argmax's and logsumexp's code with it: 80-100 us of a ~3.5 ms default-model step, and every Python operation
    after a step is slow (its objects too have left the caches), so this lookup is a few of them.

    The picks hold their logits where the pass had at most HELD_ROWS rows (a step's, a verify pass's: ~34 MB at
    most, 32 rows of a 262,144-token vocabulary), until the next head pass replaces them: the memory can then hold
    nothing else, so an address in it is those logits' rows. Under torch.inference_mode, where every run decodes,
    a view keeps no Python reference to its base: the tensor the head returned is gone once the model and the
    engine have taken their views of it ([B, T, V], decode's [:, -1], a round's [0]), and a weak reference found
    it gone after every pass, so each pick ran the greedy pass over the finished rows again (a default-model
    verify round of 9 rows: ~0.25 ms of its judge). A longer pass (a prefill's full logits can be a GB) is held
    only weakly: its picks answer while its tensor is alive.

    Nothing in the engine writes logits in place, and inference tensors keep no version to check it by: a
    caller that changes logits pick from a copy."""

    def __init__(self, logits: torch.Tensor, picks: list[tuple[int, float, float]]):
        self.held = logits if logits.shape[0] <= HELD_ROWS else None
        self.weak = weakref.ref(logits)
        self.ptr, self.row_bytes, self.picks = logits.data_ptr(), 4 * logits.shape[-1], picks

    def alive(self) -> bool:
        """Whether the memory at ptr still holds the logits the picks were made of."""
        return self.held is not None or self.weak() is not None

    def of(self, x: torch.Tensor) -> list[tuple[int, float, float]] | None:
        """The picks of x [R, V] or [V] where its rows are a run of those logits' rows; else None."""
        row, offset = divmod(x.data_ptr() - self.ptr, self.row_bytes)
        n = 1 if x.dim() == 1 else x.shape[0]
        if offset or not 0 <= row <= len(self.picks) - n or not self.alive() or not x.is_contiguous() \
                or 4 * x.shape[-1] != self.row_bytes:
            return None
        return self.picks[row:row + n]


def greedy_rows(logits: torch.Tensor, head: HeadPicks | None = None, greedy=ref.greedy) -> list[tuple]:
    """Each row's (first argmax, max, logsumexp) of float32 CPU logits [R, V] or [V]: the head's own where these are
    its logits (HeadPicks), else `greedy`'s (the OpSet's: a CPU kernel's one pass, or the twin)."""
    known = head.of(logits) if head is not None else None
    return known if known is not None else greedy(logits.reshape(-1, logits.shape[-1]))


def shown_one(logits: torch.Tensor, tok_id: int, dist: torch.Tensor | None, params: SamplingParams,
              logsumexp=ref.logsumexp) -> float:
    """shown_at for one token of one row, read on the host: logits [V] on the CPU, dist [1, V] or None. The same
    value, without the small tensor ops shown_at's indexing costs (~10 us each on 2 cores, a greedy pick's
    shown_at took about what the whole softmax did on a 49,152-token row)."""
    if not params.greedy:
        return float(dist[0, tok_id])
    return math.exp(float(logits[tok_id]) - float(logsumexp(logits[None])[0]))


def draw(weights: torch.Tensor, noise: Noise | None) -> torch.Tensor:
    """Sample from unnormalized weights [R, V] -> [R] long, row r with the noise of position cursor + r, without
    a host sync.

    argmax(w / E) with E ~ Exp(1) picks index i with probability w_i / sum(w) (the exponential race, the
    Gumbel-max trick with G = -log E), so the row never needs normalizing, and unlike torch.multinomial it
    never synchronizes on CUDA (gpt-fast samples this way for the same reason). The noise's race kernel, where
    it has one, makes the same quotients without writing a row (Noise). noise=None draws fresh, unkeyed noise (a
    caller that needs no reproducibility)."""
    R, V = weights.shape
    if noise is None:
        return argmax(weights / torch.rand(R, V, device=weights.device).log_().neg_())
    if noise.race is not None:
        return noise.race(weights, noise.keys(R))
    return argmax(weights / noise.take(R, V))


def sample(logits: torch.Tensor, params: SamplingParams, noise: Noise | None, softmax=ref.softmax,
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [R, V] -> (token ids [R] long, the distribution [R, V] they were drawn from), on the device; row r
    is output position noise.position + r. Greedy takes the argmax, draws no noise and leaves the one-hot
    distribution unbuilt (None). `softmax`: the OpSet's, as probs() takes it."""
    if params.greedy:
        return argmax(logits), None
    dist = probs(logits, params, softmax)
    return draw(dist, noise), dist
