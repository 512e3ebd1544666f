"""A run as the user asked for it: the settings record, the ranges the page offers, and the widget-value checks.

Nothing here touches the engine; Runtime.validate judges a RunSettings against what this launch can run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.speculative import K_MAX

MODES = ("plain", "n-gram", "self-draft", "draft model", "layer-skip")
K_RANGE = (1, K_MAX)
NGRAM_RANGE = (1, 8)
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
    model: str = ""  # the model as the picker names it ("": the launch's first; ui/models.py)

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    @property
    def on_endpoint(self) -> bool:
        return self.backend == "endpoint"

    def as_dict(self, model: str) -> dict:
        """The settings as a run's record keeps them, `model` the name of the model that ran it."""
        return {**asdict(self), "model": model}

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


def either(names: list[str]) -> str:
    """'a', 'a or b', 'a, b or c': the choices a message offers."""
    return " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]
