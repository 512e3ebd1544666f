"""Whether each example beats plain decoding of the launch's default on this machine: measured, never assumed.

Each candidate example (ui/examples.py) runs CHECK_TOKENS greedy tokens, alternating ROUNDS times with plain
decoding of the same prompt in the launch's weight format (what a visitor gets without picking anything); each
side keeps its best round, so a round that lost the cores to another job does not decide. An example is offered
when it is faster than plain; otherwise the page names it with the measured ratio. An example whose drafter sat
the run out (its own model said no round could pay, Drafter.sits_out) runs plain steps: within noise of plain
either way, it is not offered, and the page says why. Verdicts are kept in the model
cache per machine (device, CPU or GPU model, threads), model and example settings: a launch on a machine that
checked before starts at once, and another machine measures for itself.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.request import Request
from engine.stats import Round
from ui.examples import examples
from ui.runtime import Runtime, engine_rounds

CHECK_TOKENS = 48  # long enough for the schedule to settle and a calibration to pay back, short enough for launch
ROUNDS = 2
CLEAR = (0.7, 1.5)  # a first round's ratio outside this decides without a second
CACHE_FILE = "example-checks.json"
VERSION = 2  # bump when what is measured changes: older verdicts are then measured again


@dataclass(frozen=True)
class Check:
    tok_s: float  # the example's best decode tok/s
    plain_tok_s: float  # plain decoding's best, same prompt, the launch's weights
    plain_weights: str
    measured: str  # when, UTC
    sat_out: str | None = None  # why the example's drafter drafted nothing (Drafter.sits_out)

    @property
    def ratio(self) -> float:
        return self.tok_s / self.plain_tok_s

    @property
    def offered(self) -> bool:
        return self.ratio > 1.0 and not self.sat_out

    @property
    def reason(self) -> str:
        timed = (f"×{self.ratio:.2f} vs plain {self.plain_weights} ({self.tok_s:.0f} against {self.plain_tok_s:.0f} "
                 f"tok/s, measured here {self.measured})")
        return f"drafts nothing here: {self.sat_out} ({timed})" if self.sat_out else timed


Measure = Callable[[Runtime, Request, list[int]], tuple[float, str | None]]


def measure_tok_s(rt: Runtime, s: Request, ids: list[int]) -> tuple[float, str | None]:
    """One run of s on this runtime's engine, as the page runs it: its decode tok/s, and why its drafter sat the
    run out (None: it did not)."""
    rounds = [r for r in engine_rounds(rt, s, ids) if isinstance(r, Round)]
    stats = rt.stats(rounds, len(ids), s.as_dict(rt.model_name))
    return stats.summary()["decode_tok_s"], stats.drafter_info.get("sits_out")


def requests(rt: Runtime, row: list) -> tuple[Request, Request]:
    """The example as the page would run it and plain decoding of the launch's default on the same prompt."""
    prompt, mode, k, layers, weights = row
    graphs, fused = rt.graphs_reason is None, rt.fused_reason is None
    chat = rt.tokenizer.chat_template is not None
    draft = next(iter(rt.drafts), "")
    s = Request(mode=mode, k=k, layers=layers, weights=weights, draft_model=draft if mode == "draft model" else "",
                cuda_graphs=graphs, fused_kernels=fused, chat=chat, max_new_tokens=CHECK_TOKENS)
    return s, Request(cuda_graphs=graphs, fused_kernels=fused, chat=chat, max_new_tokens=CHECK_TOKENS)


def machine(rt: Runtime) -> str:
    import torch

    from engine.observe.provenance import cpu_info

    dev = rt.engine.device
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    else:  # the brand alone ("AMD EPYC") is the same on a Zen 3, 4 and 5: their examples measure apart
        cpu = cpu_info()
        name = f"{cpu['cpu_model']} ({cpu.get('cpu_kind', 'kind unknown')})"
    return f"{dev.type}:{name}:{torch.get_num_threads()} threads"


def key(rt: Runtime, s: Request, prompt: str) -> str:
    return json.dumps([VERSION, machine(rt), rt.model_name, rt.weight_format, prompt, s.flat()], sort_keys=True)


def check(rt: Runtime, measure: Measure = measure_tok_s, cache_dir: str | Path | None = None,
          progress=print) -> dict:
    """Each example's Check by label, measured where the cache has none; kept in rt.example_checks (what the
    page's examples read) and in the cache."""
    from engine.checkpoint import store

    path = store.cache_dir(cache_dir) / CACHE_FILE
    kept = read(path)
    rows, labels = examples(rt)
    out, plain_best = {}, {}
    for row, label in zip(rows, labels, strict=True):
        if row[1] == "plain":  # plain decoding itself: nothing to beat
            continue
        s, plain = requests(rt, row)
        k = key(rt, s, row[0])
        if k in kept:
            out[label] = Check(**kept[k])
            continue
        progress(f"checking the example {label!r} against plain decoding on this machine (once per machine)")
        ids = rt.encode(row[0], s.chat)
        best = 0.0
        for _ in range(ROUNDS):  # alternating: a minute of load on a shared box falls on both sides
            ours, sat_out = measure(rt, s, ids)
            theirs, _ = measure(rt, plain, ids)
            best = max(best, ours)
            plain_best[row[0]] = max(plain_best.get(row[0], 0.0), theirs)
            if sat_out or not CLEAR[0] < best / plain_best[row[0]] < CLEAR[1]:  # a margin no load would turn
                break
        out[label] = kept[k] = Check(best, plain_best[row[0]], rt.weight_format,
                                     time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), sat_out)
        progress(f"  {label}: {out[label].reason}")
    write(path, {k: asdict(v) if isinstance(v, Check) else v for k, v in kept.items()})
    rt.example_checks = out
    return out


def read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or a damaged file: measure again
        return {}
    return data if isinstance(data, dict) else {}


def write(path: Path, data: dict) -> None:
    """Beside the target, then renamed into place: two launches writing at once leave one whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
