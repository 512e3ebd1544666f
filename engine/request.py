"""A run as asked for: one record, `Request` (its sampling nested), and the one function that runs it.

Each setting is one field declared once, with its default, help, label and the range or choices a request
accepts (`setting`). Everything else is derived from the fields: the page's widgets and the names its API takes
(`NAMES`, `SPECS`), the CLI's flags (`add_flags`, `from_flags`), the CSV columns (`Request.flat`) and the tests'
settings, so a new setting is one field here and its use where it takes effect. A Request cannot hold a value
out of its range: construction refuses it, naming the value and the range. What depends on the launch (the
modes, weight formats, drafts and models it has) is judged by the caller (ui.runtime, the CLI's load).

    req = Request(mode="n-gram", k=8, max_new_tokens=64)
    ids, stats = generate(eng, req, prompt_ids, make_drafter(req, eng))
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace

from engine import speculative
from engine.endpoint.servers import AUTO, SERVER_CHOICES
from engine.sampling import SamplingParams
from engine.stats import Round, Stats
from engine.weights import FORMATS

MODES = ("plain", "n-gram", "self-draft", "draft model", "layer-skip")
BACKENDS = ("engine", "endpoint")  # ours, or a serving engine's OpenAI-compatible API (engine/endpoint)
CALIBRATED = 0  # Request.layers: the layer-skip drafter's layers calibrated on each prompt
SINKS = 4  # attention sinks kept with a window (StreamingLLM's choice)


def setting(default, help: str, *, label: str = "", range: tuple | None = None, choices: tuple | None = None,
            off: tuple | None = None, short: str | None = None):
    """One setting: its default, help (the CLI's and the API's), the page's label, and what it accepts: a range
    (lo, hi; hi None: no bound here), choices, `off` = (value, meaning) a value outside the range that switches
    the setting off, `short` a one-letter CLI flag."""
    return field(default=default, metadata=dict(help=help, label=label, range=range, choices=choices, off=off,
                                                 short=short))


@dataclass(frozen=True)
class Spec:
    """One setting as the page, the API, the CLI and the CSV see it (read from the record's fields)."""
    name: str
    type: type  # bool, int, float or str: the default's
    default: object
    help: str
    label: str
    range: tuple | None = None
    choices: tuple | None = None
    off: tuple | None = None
    short: str | None = None
    within: str | None = None  # the nested record that holds it ("sampling"), None at the top

    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def accepts(self) -> str:
        """What the setting accepts, as a message says it: '1..16', '0 (full attention) or 16..8192', ..."""
        if self.choices:
            return either([str(c) for c in self.choices])
        lo, hi = self.range
        text = f"{lo:g} or more" if hi is None else f"{lo:g}..{hi:g}"
        return f"{self.off[0]} ({self.off[1]}) or {text}" if self.off else text

    def check(self, value) -> None:
        """ValueError naming the value and what the setting accepts."""
        kind = self.type
        if not (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
                or kind is float and isinstance(value, int) and not isinstance(value, bool)):
            raise ValueError(f"{self.name}={value!r} must be {TYPE_WORDS[kind]}")
        if kind is float and not math.isfinite(value):
            raise ValueError(f"{self.name}={value!r} must be a finite number")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name}={value!r} is not one of {self.accepts()}")
        if self.range and not (self.off and value == self.off[0]):
            lo, hi = self.range
            if value < lo or hi is not None and value > hi:
                raise ValueError(f"{self.name}={value:g} is out of range; pick {self.accepts()} ({self.help})")

    def parse(self, value):
        """A widget's, a query's or a flag's value as the setting's type (ValueError naming a bad one)."""
        if self.type is bool:
            if isinstance(value, str):
                if value.strip().lower() not in BOOL_WORDS:
                    raise ValueError(f"{self.name}={value!r} must be true or false")
                return BOOL_WORDS[value.strip().lower()]
            return bool(value)
        if self.type is int:
            return as_int(self.name, value)
        if self.type is float:
            try:
                f = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{self.name}={value!r} must be a number") from None
            if not math.isfinite(f):
                raise ValueError(f"{self.name}={value!r} must be a finite number")
            return f
        return "" if value is None else str(value).strip()


TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
              "off": False, "": False}


@dataclass(frozen=True)
class Request:
    """One run as asked for; the page lays out its settings in this order."""
    model: str = setting("", "the model as the app's picker names it ('': the launch's first)", label="Model")
    backend: str = setting("engine", "run on this engine, or on a serving engine's OpenAI-compatible API",
                           label="Backend", choices=BACKENDS)
    endpoint: str = setting("", "the endpoint's base URL, e.g. http://127.0.0.1:8080/v1", label="Endpoint")
    endpoint_model: str = setting("", "the served model's name ('': the first it lists)", label="Model")
    server: str = setting(AUTO, "which server the endpoint is, for its own fields (auto: ask it)", label="Server",
                          choices=SERVER_CHOICES)
    mode: str = setting("plain", "how tokens are proposed: plain decoding, or a speculative drafter",
                        label="Mode", choices=MODES)
    k: int = setting(speculative.K_DEFAULT, "the most draft tokens a round proposes",
                     label="k (the most drafts per round)", range=(1, speculative.K_MAX), short="-k")
    adaptive: bool = setting(True, "each round drafts what the run's measured costs and acceptance say pays (0: a "
                                   "plain step); off: k every round", label="Adaptive k")
    ngram: int = setting(3, "n-gram mode: the longest n-gram the lookup matches", label="n-gram size",
                         range=(1, 8))
    layers: int = setting(CALIBRATED, "layer-skip mode: 0 calibrates which layers to skip on each prompt; N runs "
                                      "the first N", label="layer-skip layers (0: which to skip calibrated on each "
                                                           "prompt; N: the first N)", range=(0, None))
    draft_model: str = setting("", "draft model mode: the model that drafts", label="Draft model")
    cuda_graphs: bool = setting(True, "replay the captured decode step (CUDA; elsewhere off, with the reason)",
                                label="CUDA graphs")
    fused_kernels: bool = setting(True, "our kernels instead of torch ops", label="Fused kernels")
    weights: str = setting("", "the projections' weight format ('': the one the model launched with)",
                           label="Weights", choices=("", *FORMATS))
    window: int = setting(0, f"attend to the last W positions and {SINKS} sinks", label="attention window",
                          range=(16, 8192), off=(0, "full attention"))
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = setting(128, "the most new tokens; with the prompt they must fit the cache",
                                  label="max new tokens", range=(1, None), short="-n")
    chat: bool = setting(True, "wrap the prompt as a user turn of the model's chat template", label="Chat template")

    def __post_init__(self):
        for spec in SPECS.values():
            spec.check(self.value(spec.name))

    def value(self, name: str):
        spec = SPECS[name]
        return getattr(getattr(self, spec.within) if spec.within else self, name)

    def flat(self) -> dict:
        """Every setting by name, in NAMES order: the CSV columns, the API's parameters, a record's settings."""
        return {name: self.value(name) for name in NAMES}

    def as_dict(self, model: str) -> dict:
        """The settings as a run's record keeps them, `model` the name of the model that ran it."""
        return self.flat() | {"model": model}

    def with_(self, **changes) -> Request:
        """A copy with settings changed by name, nested ones included (ValueError naming an unknown one)."""
        unknown(changes)
        nested = {}
        for name, v in changes.items():
            if (within := SPECS[name].within) is not None:
                nested.setdefault(within, {})[name] = v
        top = {n: v for n, v in changes.items() if SPECS[n].within is None}
        return replace(self, **top, **{w: replace(getattr(self, w), **d) for w, d in nested.items()})

    @classmethod
    def from_values(cls, values: Mapping, base: Request | None = None) -> Request:
        """Settings by name, as a widget, an API client or a test sends them (missing ones: base's, else the
        defaults): parsed to their types and checked, ValueError naming the bad one and what it accepts."""
        unknown(values)
        return (base or cls()).with_(**{name: SPECS[name].parse(v) for name, v in values.items()})

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    @property
    def on_endpoint(self) -> bool:
        return self.backend == "endpoint"

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


def specs(cls=Request, within: str | None = None) -> dict[str, Spec]:
    """The settings of cls by name, a nested record's (sampling) in its place."""
    out = {}
    for f in fields(cls):
        if f.default_factory is not MISSING and is_dataclass(f.default_factory):
            out.update(specs(f.default_factory, f.name))
            continue
        m = f.metadata
        out[f.name] = Spec(f.name, type(f.default), f.default, m.get("help", ""), m.get("label") or f.name,
                           m.get("range"), m.get("choices"), m.get("off"), m.get("short"), within)
    return out


SPECS: dict[str, Spec] = specs()
NAMES: tuple[str, ...] = tuple(SPECS)  # every setting, in the record's (the page's) order


def unknown(values: Mapping) -> None:
    if bad := [n for n in values if n not in SPECS]:
        raise ValueError(f"unknown setting {', '.join(map(repr, bad))}; the settings are {', '.join(NAMES)}")


def as_int(name: str, value) -> int:
    """Sliders and number boxes send floats; an integral float is fine, anything else is named back."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}={value!r} must be a whole number") from None
    if not f.is_integer():
        raise ValueError(f"{name}={value!r} must be a whole number")
    return int(f)


def either(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c': the choices a message offers."""
    return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]


# ---- the CLI's flags, from the same fields ----------------------------------------------------------------
def add_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per setting (--max-new-tokens, --no-adaptive, ...), its help and default the field's."""
    group = parser.add_argument_group("request", "the run's settings (the page's, under the same names)")
    for spec in SPECS.values():
        if spec.name in skip:
            continue
        names = [spec.flag(), *([spec.short] if spec.short else [])]
        extra = dict(choices=spec.choices) if spec.choices else {}
        if spec.type is bool:
            group.add_argument(*names, action=argparse.BooleanOptionalAction, default=spec.default,
                               help=f"{spec.help} (default: {'on' if spec.default else 'off'})")
        else:
            shown = f" ({spec.accepts()})" if spec.range else ""
            group.add_argument(*names, type=spec.type, default=spec.default, **extra,
                               help=f"{spec.help}{shown} (default: {spec.default!r})")


def from_flags(args: argparse.Namespace, **overrides) -> Request:
    """The Request the parsed flags ask for (ValueError naming a bad value)."""
    return Request.from_values({**{n: getattr(args, n) for n in NAMES if hasattr(args, n)}, **overrides})


# ---- running a request ------------------------------------------------------------------------------------
def configure(eng, req: Request, sinks: int = SINKS) -> str:
    """Switch the engine to the request's kernels, step runner and attention (each only where it differs);
    returns what runs: 'eager · torch', 'graph · fused', ... with the reason where graphs did not capture."""
    if (eng.model.ops.name == "fused") != req.fused_kernels:
        eng.use_fused(req.fused_kernels)
    if (eng.graph is not None) != req.cuda_graphs:
        eng.use_graphs(req.cuda_graphs)
    if (eng.window or 0) != req.window:
        eng.use_window(req.window or None, sinks)
    path = f"{'graph' if eng.graph is not None else 'eager'} · {eng.model.ops.name}"
    if req.cuda_graphs and eng.graph is None:
        path += f" (CUDA graphs requested: {eng.graph_status})"
    return path


def make_drafter(req: Request, eng, draft=None, earlier: speculative.SessionIndex | None = None):
    """The request's drafter (None for plain decoding): the one place a mode becomes a drafter. draft: the
    Engine that drafts in 'draft model' and 'self-draft' modes (the caller loads or keeps it); earlier: the
    session's earlier answers, which n-gram mode also drafts from (engine/speculative/suffix.py)."""
    if req.mode == "plain":
        return None
    if req.mode == "n-gram":
        return speculative.NgramDrafter(max_n=req.ngram, session=earlier)
    if req.mode == "layer-skip":
        return speculative.LayerSkipDrafter(eng, n_layers=None if req.layers == CALIBRATED else req.layers)
    if draft is None:
        raise ValueError(f"{req.mode} mode needs a drafting engine: give a draft model")
    return speculative.ModelDrafter(draft)


def stream(eng, req: Request, prompt_ids: list[int], drafter=None, stop_ids=None) -> Iterator[Round]:
    """The request's Round events on eng as it stands (configure() first to switch it): plain decoding, or the
    speculative loop with drafter (make_drafter)."""
    s = req.sampling
    sample = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed, stop_ids=stop_ids)
    if not req.speculative:
        return eng.stream(prompt_ids, req.max_new_tokens, **sample)
    if drafter is None:
        raise ValueError(f"{req.mode} mode needs its drafter (engine.request.make_drafter)")
    return speculative.stream(eng, drafter, prompt_ids, req.k, req.max_new_tokens, adaptive=req.adaptive, **sample)


def generate(eng, req: Request, prompt_ids: list[int], drafter=None) -> tuple[list[int], Stats]:
    """stream() collected -> (the new ids, Stats with the request's settings and what the drafter chose)."""
    rounds = list(stream(eng, req, prompt_ids, drafter))
    info = drafter.describe() if drafter is not None else {}
    stats = eng.stats(rounds, len(prompt_ids), {**req.flat(), **info})
    return stats.ids, stats
