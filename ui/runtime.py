"""What the app serves: one shared engine (plus draft engines) and the one generator that touches it.

The Runtime is built once in app.py's main() and bound into the callbacks; it never goes into gr.State.
Everything the engine side measures comes back as plain records (Round, RunFacts): on a ZeroGPU Space
engine_rounds runs in a forked GPU worker, and nothing but pickled records crosses back.
"""
from __future__ import annotations

import math
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from engine import request
from engine.request import Request, either
from engine.speculative import SessionIndex
from engine.stats import Round, Stats, finite
from ui.baseline import Baselines
from ui.export import ExportStore

LAYER_SKIP_KEEP = 2
# The read-bandwidth probe around each run: 128 MB is 4x the largest L3 cache a CPU here has, so the reads
# come from memory, and a probe costs ~0.1 s on a busy 2-core box (the launch probe reads 512 MB).
PROBE_BYTES = 128 * 2**20
PROBE_REPEATS = 3


@dataclass(frozen=True)
class RunFacts:
    """What the engine side measured besides the rounds, as a plain record: one before the run (the read
    bandwidth, the bytes a decode step reads, the path that runs) and one after it (the bandwidth again and
    the run's peak memory). A stopped run has no `after`."""
    when: str  # "before" | "after"
    bandwidth_gbs: float = math.nan  # read (CPU) or copy (CUDA) bandwidth measured on the spot
    peak_memory_mb: float = math.nan
    weight_bytes: int = 0
    path: str = ""  # what ran: "eager · torch", "graph · fused", ... (a graph that failed to capture says so)


def ceiling_gbs(facts: list[RunFacts]) -> float:
    """The bandwidth a run is compared with: the larger of the probes around it (a probe that lost the
    memory bus to another job reads low; the engine could not have streamed faster than the larger one)."""
    seen = [f.bandwidth_gbs for f in facts if finite(f.bandwidth_gbs) is not None]
    return max(seen) if seen else math.nan


@dataclass
class Runtime:
    engine: object  # engine.Engine
    tokenizer: object  # engine.Tokenizer
    model_name: str
    drafts: dict[str, object] = field(default_factory=dict)  # name -> Engine of a draft model
    self_drafts: dict[str, object] = field(default_factory=dict)  # weight format -> the target's Engine in it
    engines: dict[str, object] = field(default_factory=dict)  # weight format -> the target's Engine in it
    load_format: Callable | None = None  # weight format -> a new Engine of the target in it (startup binds it)
    fused_reason: str | None = None  # None: fused kernels can run here; else why not
    graphs_reason: str | None = None  # None: CUDA graphs can run here; else why not
    env: dict = field(default_factory=dict)  # the environment card
    store: ExportStore | None = None
    rounds_fn: Callable | None = None  # (settings, prompt_ids, earlier) -> Round iterator: engine_rounds, bound
    lock: threading.Lock = field(default_factory=threading.Lock)
    layer_skip: dict = field(default_factory=dict)  # depth (0: calibrated) -> LayerSkipDrafter, see drafter_for
    model_drafters: dict = field(default_factory=dict)  # (mode, name) -> ModelDrafter: keeps its measured cost
    temp_dirs: list = field(default_factory=list)  # folders this runtime made (--tiny models), removed by close
    endpoints: list[str] = field(default_factory=list)  # the endpoints a run may use (--endpoint)
    allow_any_endpoint: bool = False  # a typed URL too (--allow-any-endpoint): off, or the app is a proxy
    endpoint_key: str | None = field(default=None, repr=False)  # the launch's key (--api-key-env), never shown
    endpoint_stall_s: float = 30.0
    stream_interval_s: float = 1 / 15  # the page fetches a streaming run's new spans this often (ui/stream.py)
    plot_interval_s: float = 5.0  # the latency figure mid-run (a figure costs far more to build, send and draw)
    probe_bandwidth: bool = True  # measure the bandwidth around each run (tests switch it off)
    special_ids: frozenset = frozenset()  # tokens shown as a marker, not as text (end of turn, bos)
    baselines: Baselines = field(default_factory=Baselines)  # plain runs a speculative one is compared with
    example_checks: dict = field(default_factory=dict)  # example label -> ui/example_check.Check (none: unchecked)

    def __post_init__(self):
        self.store = self.store or ExportStore()
        self.rounds_fn = self.rounds_fn or partial(engine_rounds, self)
        self.engines.setdefault(self.engine.model.weight_format, self.engine)

    @property
    def weight_format(self) -> str:
        """The format the app launched with: what Request.weights = "" means."""
        return self.engine.model.weight_format

    def formats(self) -> dict[str, str | None]:
        """Each weight format -> None when it can run here, else the reason it cannot."""
        from engine.weights import FORMATS, PANEL_FORMATS

        if self.load_format is None:
            return {f: None if f in self.engines else "only the launch format is loaded" for f in FORMATS}
        cpu_kernels = self.engine.device.type == "cpu" and self.fused_reason is None
        runs = ", ".join(f for f in FORMATS if f in PANEL_FORMATS)
        return {f: f"{f} has no CPU kernel (the CPU kernels run {runs})" if cpu_kernels and f not in PANEL_FORMATS
                else None for f in FORMATS}

    def engine_for(self, fmt: str):
        """The target in weight format fmt ("" is the launch format): loaded on first use, kept after (one
        more copy of the weights, in that format)."""
        fmt = fmt or self.weight_format
        if fmt not in self.engines:
            self.engines[fmt] = self.load_format(fmt)
        return self.engines[fmt]

    def close(self) -> None:
        """Remove every file the app wrote: exports and any temporary model folders."""
        self.store.close()
        for d in self.temp_dirs:
            shutil.rmtree(d, ignore_errors=True)

    @property
    def n_layers(self) -> int:
        return self.engine.config.n_layers

    def modes(self) -> dict[str, str | None]:
        """Each mode -> None when it can run here, else the reason it cannot."""
        return {
            "plain": None, "n-gram": None,
            "self-draft": None if self.self_drafts else "no cheaper weight format was loaded at launch (--self-draft)",
            "draft model": None if self.drafts else "no draft model was given at launch (--draft PATH)",
            "layer-skip": None if self.n_layers >= 2 else f"the model has {self.n_layers} layer; layer-skip needs 2",
        }

    def text_of(self, token_id: int) -> str:
        return self.tokenizer.token_text(token_id)

    def encode(self, prompt: str, chat: bool) -> list[int]:
        return self.tokenizer.encode_chat(prompt) if chat else self.tokenizer.encode(prompt)

    @property
    def self_draft_format(self) -> str | None:
        return next(iter(self.self_drafts), None)

    def stats(self, rounds: list[Round], prompt_len: int, settings: dict, facts: list[RunFacts] = ()) -> Stats:
        """The run's Stats from its records alone: its settings gain what the drafter chose at the start (e.g.
        the layers it skips), the peak memory, weight bytes and bandwidth come from the engine side's RunFacts.
        Nothing here asks the engine (on ZeroGPU it lives in another process)."""
        info = (rounds[0].draft_info or {}) if rounds else {}
        before = next((f for f in facts if f.when == "before"), RunFacts("before"))
        after = next((f for f in facts if f.when == "after"), RunFacts("after"))
        return Stats(rounds, prompt_len, {**info, **settings}, peak_memory_mb=after.peak_memory_mb,
                     weight_bytes=before.weight_bytes, bandwidth_gbs=ceiling_gbs(list(facts)))

    def loaded(self, fmt: str) -> bool:
        """Whether the target in weight format fmt ("" is the launch format) is loaded (else its first run loads it)."""
        return (fmt or self.weight_format) in self.engines

    def self_draft_targets(self) -> list[str]:
        """The formats a self-draft target may run in: those that read more bytes a weight than its drafts, so a
        draft costs less than a target step."""
        from engine.weights import BITS

        fmt = self.self_draft_format
        if fmt is None:
            return []
        return [f for f, why in self.formats().items() if why is None and BITS[f] > BITS[fmt]]

    def validate(self, s: Request, prompt_ids: list[int]) -> None:
        """Raise ValueError naming the setting to change: what this launch can run (the Request itself holds only
        values in its ranges); the engine re-checks what it owns."""
        if s.on_endpoint:
            raise ValueError("an endpoint run is checked by ui/endpoint.py, not by this engine")
        if (why := self.modes()[s.mode]) is not None:
            raise ValueError(f"{s.mode} mode is unavailable: {why}")
        fmt = s.weights or self.weight_format
        if fmt not in (formats := self.formats()):
            raise ValueError(f"weights={fmt!r} is not one of {', '.join(formats)}")
        if formats[fmt] is not None:
            raise ValueError(f"weights {fmt} are unavailable here: {formats[fmt]}")
        if s.mode == "self-draft" and fmt not in (targets := self.self_draft_targets()):
            raise ValueError(f"self-draft drafts with {self.self_draft_format} weights, which cost as much as a "
                             f"{fmt} target step: pick {either(targets) or 'a denser format'} weights for "
                             "the target, or another mode")
        if s.mode == "layer-skip" and not 0 <= s.layers < self.n_layers:
            raise ValueError(f"layer-skip depth {s.layers} must be 0 (calibrated on the prompt) or "
                             f"1..{self.n_layers - 1} (the first N; the model has {self.n_layers} layers)")
        if s.mode == "draft model" and s.draft_model not in self.drafts:
            raise ValueError(f"draft model {s.draft_model!r} is not one of {', '.join(self.drafts)}")
        if s.cuda_graphs and self.graphs_reason:
            raise ValueError(f"CUDA graphs are unavailable here ({self.graphs_reason}); switch them off")
        if s.fused_kernels and self.fused_reason:
            raise ValueError(f"fused kernels are unavailable here ({self.fused_reason}); switch them off")
        self.check_room(len(prompt_ids), s.max_new_tokens)
        # a speculative run needs no cache slots beyond plain decoding's (speculative.stream caps k)
        self.engine.check_request(prompt_ids, s.max_new_tokens)

    def check_room(self, n_prompt: int, max_new_tokens: int) -> None:
        """The prompt and the new tokens fit the cache, or a message naming what to change on the page. (A
        window does not help: the cache keeps a slot for every position either way.)"""
        room = self.engine.max_seq_len
        if n_prompt >= room:
            raise ValueError(f"the prompt is {n_prompt} tokens and this app's cache holds {room} positions (prompt "
                             f"and new tokens together): shorten the prompt by at least {n_prompt - room + 1} tokens")
        if n_prompt + max_new_tokens > room:
            raise ValueError(f"the prompt ({n_prompt} tokens) + max new tokens ({max_new_tokens}) = "
                             f"{n_prompt + max_new_tokens} is more than the {room} positions this app's cache holds: "
                             f"lower max new tokens to {room - n_prompt} or shorten the prompt")


def drafter_for(rt: Runtime, s: Request, earlier: SessionIndex | None = None):
    """The run's drafter (engine.request.make_drafter decides which). Those with an engine are kept between runs:
    a layer-skip drafter owns KV caches (and graphs, once captured), and a model drafter remembers what its
    drafts cost, so one found too slow on this machine is not probed again."""
    if s.mode in ("draft model", "self-draft"):
        name = s.draft_model if s.mode == "draft model" else rt.self_draft_format
        key = (s.mode, name)
        if key not in rt.model_drafters:
            draft = rt.drafts[name] if s.mode == "draft model" else rt.self_drafts[name]
            rt.model_drafters[key] = request.make_drafter(s, rt.engine, draft)
        return rt.model_drafters[key]
    if s.mode != "layer-skip":
        return request.make_drafter(s, rt.engine, earlier=earlier)
    cache, key = rt.layer_skip, (s.weights or rt.weight_format, s.layers)
    if key not in cache:
        while len(cache) >= LAYER_SKIP_KEEP:
            cache.pop(next(iter(cache)))
        cache[key] = request.make_drafter(s, rt.engine_for(s.weights))
    return cache[key]


def engine_rounds(rt: Runtime, s: Request, prompt_ids: list[int],
                  earlier: SessionIndex | None = None) -> Iterator[Round | RunFacts]:
    """The one generator that touches the engine: plain records out (RunFacts before, the Round events, RunFacts
    after), nothing of the UI in it. earlier: the browser session's earlier answers (n-gram mode drafts from
    them too; the run only reads them).

    On a ZeroGPU Space this runs under spaces.GPU in a forked worker: the runtime is bound in before the
    fork, the settings and ids are pickled over, and the records are pickled back. Every CUDA touch of a run
    happens here: graph capture, the bandwidth probes, the clocks, the peak memory read."""
    eng = rt.engine_for(s.weights)
    path = request.configure(eng, s, request.SINKS)
    yield RunFacts("before", bandwidth_gbs=probe(rt, eng), weight_bytes=eng.weight_bytes, path=path)
    drafter = drafter_for(rt, s, earlier) if s.speculative else None
    yield from request.stream(eng, s, prompt_ids, drafter)
    yield RunFacts("after", bandwidth_gbs=probe(rt, eng), peak_memory_mb=eng.clock.peak_memory_mb())


def probe(rt: Runtime, eng) -> float:
    """The bandwidth now, on the engine's device (NaN where the runtime does not probe)."""
    if not rt.probe_bandwidth:
        return math.nan
    from engine.observe.bandwidth import measure_gbs

    return measure_gbs(eng.device, PROBE_BYTES, PROBE_REPEATS)
