"""What the app serves: one shared engine (plus draft engines), the settings of a run, and the pump that
runs the engine on its own thread while the page is fed.

The Runtime is built once in app.py's main() and bound into the callbacks; it never goes into gr.State.
"""
from __future__ import annotations

import contextvars
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from engine.sampling import SamplingParams
from engine.speculative import K_MAX, check_k
from engine.stats import Round, Stats
from ui.export import ExportStore

MODES = ("plain", "n-gram", "self-draft", "draft model", "layer-skip")
K_RANGE = (1, K_MAX)
NGRAM_RANGE = (1, 8)
LAYER_SKIP_KEEP = 2
CALIBRATED = 0  # RunSettings.layers: the layer-skip drafter's layers calibrated on each prompt
SINKS = 4  # attention sinks kept with a window (StreamingLLM's choice)
WINDOW_RANGE = (16, 8192)  # RunSettings.window when not 0 (full attention)


@dataclass(frozen=True)
class RunSettings:
    """One run as the user asked for it; validated before the engine sees it."""
    mode: str = "plain"
    k: int = 5  # the most a round drafts; the schedule picks each round's k unless adaptive is off
    ngram: int = 3
    layers: int = CALIBRATED  # layer-skip: 0 = calibrated on the prompt, N = the first N layers
    draft_model: str | None = None
    cuda_graphs: bool = False
    fused_kernels: bool = False
    chat: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 128
    adaptive: bool = True
    weights: str = ""  # the projections' weight format; "" is the one the app launched with
    window: int = 0  # 0: full attention; W: the last W positions and SINKS sinks (decode and verify)
    backend: str = "engine"  # "engine" (ours) or "endpoint" (a serving engine's OpenAI-compatible API: ui/endpoint.py)
    endpoint: str = ""  # its base URL
    endpoint_model: str = ""  # the served model's name ("": the first it lists)
    server: str = "auto"  # which server it is, for its own fields (engine.endpoint.servers)

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    @property
    def on_endpoint(self) -> bool:
        return self.backend == "endpoint"

    def as_dict(self, model: str) -> dict:
        return dict(model=model, **asdict(self))

    def label(self) -> str:
        if self.on_endpoint:  # the server decides how it decodes
            return " · ".join(p for p in ("endpoint", self.endpoint, self.endpoint_model) if p)
        parts = [self.mode_label(), "graph" if self.cuda_graphs else "eager",
                 "fused" if self.fused_kernels else "torch"]
        parts += [self.weights] if self.weights else []
        parts += [f"window {self.window}"] if self.window else []
        return " · ".join(parts)

    def mode_label(self) -> str:
        parts = [self.mode]
        if self.mode == "n-gram":
            parts.append(f"n={self.ngram}")
        elif self.mode == "layer-skip":
            parts.append("calibrated" if self.layers == CALIBRATED else f"first {self.layers} layers")
        elif self.mode == "draft model":
            parts.append(str(self.draft_model))
        if self.speculative:
            parts.append(f"k≤{self.k}" if self.adaptive else f"k={self.k}")
        return " ".join(parts)


def as_int(name: str, value) -> int:
    """Sliders and number boxes send floats; an integral float is fine, anything else is named back."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a whole number") from None
    if not f.is_integer():
        raise ValueError(f"{name}={value!r} must be a whole number")
    return int(f)


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
    rounds_fn: Callable | None = None  # (settings, prompt_ids) -> Round iterator; engine_rounds bound to this runtime
    lock: threading.Lock = field(default_factory=threading.Lock)
    layer_skip: dict = field(default_factory=dict)  # depth (0: calibrated) -> LayerSkipDrafter, see drafter_for
    model_drafters: dict = field(default_factory=dict)  # (mode, name) -> ModelDrafter: keeps its measured cost
    temp_dirs: list = field(default_factory=list)  # folders this runtime made (--tiny models), removed by close
    endpoints: list[str] = field(default_factory=list)  # the endpoints a run may use (--endpoint)
    allow_any_endpoint: bool = False  # a typed URL too (--allow-any-endpoint): off, or the app is a proxy
    endpoint_key: str | None = field(default=None, repr=False)  # the launch's key (--api-key-env), never shown
    endpoint_stall_s: float = 30.0
    stream_interval_s: float = 1 / 15  # token updates to the page, at most this often
    plot_interval_s: float = 5.0  # the latency figure mid-run (a figure costs far more to build, send and draw)

    def __post_init__(self):
        self.store = self.store or ExportStore()
        self.rounds_fn = self.rounds_fn or partial(engine_rounds, self)
        self.engines.setdefault(self.engine.model.weight_format, self.engine)

    @property
    def weight_format(self) -> str:
        """The format the app launched with: what RunSettings.weights = "" means."""
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

    def stats(self, rounds: list[Round], prompt_len: int, settings: dict) -> Stats:
        """The run's Stats; its settings gain what the drafter chose at the start (e.g. the layers it skips)."""
        info = (rounds[0].draft_info or {}) if rounds else {}
        return self.engine_for(settings.get("weights", "")).stats(rounds, prompt_len, {**info, **settings})

    def validate(self, s: RunSettings, prompt_ids: list[int]) -> None:
        """Raise ValueError naming the setting to change; the engine re-checks what it owns."""
        if s.on_endpoint:
            from ui import endpoint

            return endpoint.check(self, s)
        if s.backend != "engine":
            raise ValueError(f"backend={s.backend!r} is not one of engine, endpoint")
        if s.mode not in MODES:
            raise ValueError(f"mode={s.mode!r} is not one of {', '.join(MODES)}")
        if (why := self.modes()[s.mode]) is not None:
            raise ValueError(f"{s.mode} mode is unavailable: {why}")
        fmt = s.weights or self.weight_format
        if fmt not in (formats := self.formats()):
            raise ValueError(f"weights={fmt!r} is not one of {', '.join(formats)}")
        if formats[fmt] is not None:
            raise ValueError(f"weights {fmt} are unavailable here: {formats[fmt]}")
        if s.mode == "self-draft" and fmt == self.self_draft_format:
            raise ValueError(f"self-draft drafts with {fmt} weights, and the target already runs {fmt}: pick fp32 "
                             "or fp16 weights for the target, or another mode")
        if s.window and not WINDOW_RANGE[0] <= s.window <= WINDOW_RANGE[1]:
            raise ValueError(f"window={s.window} is out of range; pick 0 (full attention) or "
                             f"{WINDOW_RANGE[0]}..{WINDOW_RANGE[1]} positions")
        if s.speculative:
            check_k(s.k)
        if s.mode == "n-gram" and not NGRAM_RANGE[0] <= s.ngram <= NGRAM_RANGE[1]:
            raise ValueError(f"n-gram size {s.ngram} is out of range; pick {NGRAM_RANGE[0]}..{NGRAM_RANGE[1]}")
        if s.mode == "layer-skip" and not 0 <= s.layers < self.n_layers:
            raise ValueError(f"layer-skip depth {s.layers} must be 0 (calibrated on the prompt) or "
                             f"1..{self.n_layers - 1} (the first N; the model has {self.n_layers} layers)")
        if s.mode == "draft model" and s.draft_model not in self.drafts:
            raise ValueError(f"draft model {s.draft_model!r} is not one of {', '.join(self.drafts)}")
        if s.cuda_graphs and self.graphs_reason:
            raise ValueError(f"CUDA graphs are unavailable here ({self.graphs_reason}); switch them off")
        if s.fused_kernels and self.fused_reason:
            raise ValueError(f"fused kernels are unavailable here ({self.fused_reason}); switch them off")
        SamplingParams(s.temperature, s.top_p, s.top_k, s.seed)  # raises naming the bad setting
        # a speculative run needs no cache slots beyond plain decoding's (speculative.stream caps k)
        self.engine.check_request(prompt_ids, s.max_new_tokens)


def drafter_for(rt: Runtime, s: RunSettings):
    """The run's drafter. Those with an engine are kept between runs: a layer-skip drafter owns KV caches (and
    graphs, once captured), and a model drafter remembers what its drafts cost, so one found too slow on this
    machine is not probed again."""
    from engine import speculative

    if s.mode == "n-gram":
        return speculative.NgramDrafter(max_n=s.ngram)
    if s.mode in ("draft model", "self-draft"):
        name = s.draft_model if s.mode == "draft model" else rt.self_draft_format
        key = (s.mode, name)
        if key not in rt.model_drafters:
            engine = rt.drafts[name] if s.mode == "draft model" else rt.self_drafts[name]
            rt.model_drafters[key] = speculative.ModelDrafter(engine)
        return rt.model_drafters[key]
    cache, key = rt.layer_skip, (s.weights or rt.weight_format, s.layers)
    if key not in cache:
        while len(cache) >= LAYER_SKIP_KEEP:
            cache.pop(next(iter(cache)))
        n_layers = None if s.layers == CALIBRATED else s.layers
        cache[key] = speculative.LayerSkipDrafter(rt.engine_for(s.weights), n_layers=n_layers)
    return cache[key]


def engine_rounds(rt: Runtime, s: RunSettings, prompt_ids: list[int]) -> Iterator[Round]:
    """The one generator that touches the engine: plain Round records out, nothing of the UI in it.

    On a ZeroGPU Space this runs under spaces.GPU in a forked worker: the runtime is bound in before the
    fork, the settings and ids are pickled over, and the Round records are pickled back."""
    eng = rt.engine_for(s.weights)
    if (eng.model.ops.name == "fused") != s.fused_kernels:
        eng.use_fused(s.fused_kernels)
    if (eng.graph is not None) != s.cuda_graphs:
        eng.use_graphs(s.cuda_graphs)
    if (eng.window or 0) != s.window:
        eng.use_window(s.window or None, SINKS)
    sampling = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed)
    if s.speculative:
        from engine import speculative

        yield from speculative.stream(eng, drafter_for(rt, s), prompt_ids, s.k, s.max_new_tokens, **sampling,
                                      adaptive=s.adaptive)
    else:
        yield from eng.stream(prompt_ids, s.max_new_tokens, **sampling)


_DONE = object()
IDLE_POLL_S = 0.5  # an idle generator still yields this often, so gradio can close it


class RoundPump:
    """Runs a round generator on its own thread, so the engine never waits while the page is fed.

    The thread holds the runtime's lock for the whole run: one run on the engine at a time, and a
    stopped run frees the engine after the round in flight."""

    def __init__(self, rt: Runtime, s: RunSettings, prompt_ids: list[int], stop: threading.Event):
        self.rt, self.s, self.prompt_ids, self.stop = rt, s, prompt_ids, stop
        self.closed = threading.Event()  # the page's generator went away (closed tab, cancelled event)
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        ctx = contextvars.copy_context()  # spaces.GPU reads the gradio request from context
        self.thread = threading.Thread(target=ctx.run, args=(self._run,), name="decodescope-run", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.rt.lock, torch.inference_mode():
            rounds = self.rt.rounds_fn(self.s, self.prompt_ids)
            try:
                for rnd in rounds:
                    self.q.put(rnd)
                    if self.stop.is_set() or self.closed.is_set():
                        break
            except Exception as e:  # handed to the page's generator, which re-raises it there
                self.q.put(e)
            finally:
                rounds.close()
                self.q.put(_DONE)

    def batches(self, interval_s: float) -> Iterator[list[Round]]:
        """The rounds that arrived, at most one list per interval (the first round goes out at once).

        An empty list means nothing arrived for a while; errors from the engine are re-raised here."""
        batch: list[Round] = []
        last = time.monotonic() - interval_s
        while True:
            now = time.monotonic()
            if batch and now >= last + interval_s:
                yield batch
                batch, last = [], now
                continue
            try:
                item = self.q.get(timeout=last + interval_s - now if batch else IDLE_POLL_S)
            except queue.Empty:
                if not batch:
                    yield batch
                continue
            if item is _DONE:
                if batch:
                    yield batch
                return
            if isinstance(item, Exception):
                raise item
            batch.append(item)

    def close(self) -> None:
        """Ask the run to end after its round in flight. No join: this may run on gradio's event loop,
        and the lock already keeps the next run off the engine until this one has let go."""
        self.closed.set()
