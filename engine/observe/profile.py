"""Where the time goes inside a step: N decode steps and one verify pass of the engine as configured, under
torch.profiler (CPU activities, plus CUDA where present), reduced (engine/observe/breakdown.py) to rows per layer and
op class with the bytes each moved and the GB/s it achieved against the measured bandwidth ceiling.

    configs = [profile.Config("torch", fused=False), profile.Config("fused", fused=True)]
    results = profile.compare({"fp32": eng}, configs, steps=8, k=4)   # weight format -> Engine
    results[0].rows, results[0].summary, results[0].trace              # rows, per-pass figures, Trace Event JSON
    results[0].formats                                                 # bytes and time per weight format

Each step runs twice at the same cache position, plainly (the reference step time) and under the profiler
with scopes on the model's forward and each Block (forward hooks) and on the OpSet's ops (engine/observe/scopes.py),
installed for the profiled step only and removed after it. What the profiler adds is the difference between the two,
reported as profiler_overhead_pct.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch._C._profiler import _RecordFunctionFast as Scope
from torch.profiler import ProfilerActivity

from engine.observe.breakdown import SAMPLE, quiet, reduce_trace, row_order
from engine.observe.scopes import scopes
from engine.layers import Linear, RMSNorm
from engine.sampling import SamplingParams, on_host

STEP, VERIFY = "decodescope/step", "decodescope/verify"
WARMUP = 2
CONTEXT = 64  # cache positions before the profiled steps when no prompt is given


@dataclass(frozen=True)
class Config:
    """One configuration to profile: which kernels, whether the step replays a CUDA graph, which weights."""
    label: str
    fused: bool = False
    graphs: bool = False
    weights: str = "fp32"


@dataclass
class Result:
    config: Config
    reason: str | None = None  # why it cannot run here; nothing else is set then
    rows: list[dict] = field(default_factory=list)
    summary: list[dict] = field(default_factory=list)  # one dict per pass
    trace: dict | None = None  # the Trace Event JSON torch.profiler exported
    formats: list[dict] = field(default_factory=list)  # per pass and weight format: bytes a pass reads, its time


def apply(eng, cfg: Config) -> str | None:
    """Switch eng's kernels and step runner to cfg; the reason when this machine cannot run it."""
    if (eng.model.ops.name == "fused") != cfg.fused:
        eng.use_fused(cfg.fused)
    if cfg.fused and eng.model.ops.name != "fused":
        return f"fused kernels unavailable: {eng.model.ops.reason}"
    if (eng.graph is not None) != cfg.graphs:
        eng.use_graphs(cfg.graphs)
    if cfg.graphs and eng.graph is None:
        return f"CUDA graphs unavailable: {eng.graph_status}"
    return None


def projections(block) -> list[tuple[str, torch.nn.Module]]:
    """The weight-bearing leaf modules a Block calls (its norms' weights are read by the OpSet's ops)."""
    return [(n, m) for n, m in block.named_modules() if n and not any(m.children()) and not isinstance(m, RMSNorm)]


def tensor_bytes(*modules) -> int:
    """Bytes of the weights the modules hold: projections in their packed format, and plain tensors."""
    packed = sum(m.weight.nbytes for top in modules for m in top.modules() if isinstance(m, Linear))
    return packed + sum(t.numel() * t.element_size() for m in modules for t in (*m.parameters(), *m.buffers()))


def bytes_moved(eng, T: int, kv_len: float) -> dict[tuple[str, str], float]:
    """(layer, class) -> bytes one pass of T tokens reads or writes: each weight once, the K/V of kv_len live
    positions per layer, the T new K/V rows. Activations are left out (kilobytes against megabytes)."""
    model, cfg = eng.model, eng.config
    kv_row = eng.cache.bytes_per_token / cfg.n_layers  # K and V of one position in one layer
    norms = [b.attn_norm for b in model.layers[1:]] + [model.norm]  # block i's second add+norm reads the next norm
    out = {("embed", "norm"): tensor_bytes(model.layers[0].attn_norm),
           ("embed", "other"): T * cfg.hidden_size * model.dtype.itemsize,
           ("head", "matmul"): tensor_bytes(model.lm_head)}
    for i, block in enumerate(model.layers):
        layer = str(i)
        out[(layer, "matmul")] = tensor_bytes(*(m for _, m in projections(block)))
        out[(layer, "norm")] = tensor_bytes(block.mlp_norm, norms[i])
        out[(layer, "attention")] = kv_row * kv_len
        out[(layer, "kv_write")] = kv_row * T
    return out


def format_bytes(model) -> dict[str, int]:
    """Weight format -> the bytes its projections hold, each read once by a pass of any length."""
    out: dict[str, int] = {}
    for s in (s for m in model.linears() for s in m.weight.segments):
        out[s.fmt] = out.get(s.fmt, 0) + s.nbytes
    return out


def format_rows(base: dict, kind: str, held: dict[str, int], timed: dict, ceiling: float) -> list[dict]:
    """One row per weight format of a pass: its bytes, and where the kernels name their format (the CPU
    kernels do), its projections' time per pass and the GB/s that makes; the heaviest format first."""
    rows = []
    for fmt in sorted(held, key=held.get, reverse=True):
        cell = timed.get(fmt)
        ms = cell.ms if cell else None
        gbs = held[fmt] / ms / 1e6 if ms else None
        rows.append(dict(base, **{"pass": kind}, format=fmt, bytes=held[fmt], ms=ms,
                         calls=cell.calls if cell else None, gbs=gbs,
                         pct_of_ceiling=100 * gbs / ceiling if gbs and ceiling else None))
    return rows


def quiet_mean(xs: list[float]) -> float:
    """Mean of the values at or below the median: the runs another job did not interrupt."""
    q = quiet(xs)
    return sum(q) / len(q)


class Recorder:
    """Runs the steps: greedy sampling (the step's argmax and the shown softmax), fixed cache positions.

    Plain and profiled steps alternate, each pair at the same cache position, so a load that comes and goes
    (another job on a shared machine) weighs on both alike. Each profiled step is its own profiler session
    with the scopes installed for it alone: a session after the first starts and stops in well under a
    millisecond, outside the step."""

    def __init__(self, eng, steps: int, k: int, context: list[int]):
        self.eng, self.steps, self.T = eng, steps, k + 1
        eng.check_prompt(context, WARMUP + steps + self.T + 1, " + the profiled steps")
        self.context = context
        self.sampling = SamplingParams()
        self.gen = self.sampling.generator(eng.device, eng.model.ops.exp_noise, eng.model.ops.race)
        self.chunk = torch.tensor([(context * self.T)[-self.T:]], device=eng.device)  # [1, T]
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.device.type == "cuda" else [])
        self.traces: list[dict] = []

    def step(self, position: int, tok: torch.Tensor) -> tuple[float, int]:
        """One decode step writing position `position`: (ms for the forward, sampling and its host read, id)."""
        eng = self.eng
        eng.rollback(position)
        t = time.perf_counter()
        with Scope(STEP):
            logits = eng.decode(tok)
            with Scope(SAMPLE):
                tok_id, _ = eng.pick(logits[0], self.sampling, self.gen)
        return (time.perf_counter() - t) * 1e3, tok_id

    def verify(self) -> float:
        """One verify pass of T = k + 1 tokens after the context and its greedy read as a speculative round reads it
        (Engine.greedy on the CPU: the head pass's own picks; argmax on a device), then rolled back."""
        eng = self.eng
        eng.rollback(len(self.context))
        t = time.perf_counter()
        with Scope(VERIFY):
            logits = eng.chunk(self.chunk)
            with Scope(SAMPLE):
                if on_host(logits):
                    eng.greedy(logits[0])
                else:
                    logits[0].argmax(-1).tolist()
        ms = (time.perf_counter() - t) * 1e3
        eng.rollback(len(self.context))
        return ms

    def profiled(self, fn, *args):
        """fn(*args) under the profiler and the scopes; its trace is kept."""
        with scopes(self.eng.model, self.eng.cache), torch.profiler.profile(activities=self.activities) as prof:
            out = fn(*args)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "trace.json"
            prof.export_chrome_trace(str(path))
            self.traces.append(json.loads(path.read_text()))
        return out

    @torch.inference_mode()
    def record(self) -> tuple[dict, dict, float]:
        """(the profiled steps' trace, plain ms per pass kind, seconds it took)."""
        t0, n = time.perf_counter(), len(self.context)
        self.eng.prefill(self.context)
        tok = torch.tensor([self.context[-1]], device=self.eng.device)
        for i in range(WARMUP):  # allocator, kernels; the verify graph is captured on first use
            tok = torch.tensor([self.step(n + i, tok)[1]], device=self.eng.device)
        self.verify()
        plain = dict(decode=[], verify=[self.verify()])
        for i in range(self.steps):
            ms, _ = self.step(n + i, tok)
            plain["decode"].append(ms)
            tok = torch.tensor([self.profiled(self.step, n + i, tok)[1]], device=self.eng.device)
        self.profiled(self.verify)
        plain["verify"].append(self.verify())
        return merge(self.traces), plain, time.perf_counter() - t0


def merge(traces: list[dict]) -> dict:
    """Several sessions' traces as one: their events (one clock, so they line up), metadata events once."""
    seen, events = set(), []
    for t in traces:
        for ev in t.get("traceEvents", []):
            if ev.get("ph") == "M":
                key = json.dumps(ev, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
            events.append(ev)
    head = {k: v for k, v in (traces[0] if traces else {}).items() if k not in ("traceEvents", "traceName")}
    return dict(head, traceEvents=events)


def warm() -> None:
    """The first profiler session in a process sets up its tracer (about a second on 2 cores): pay
    it at launch, not in the first Profile a user asks for."""
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]):
        pass


def synthetic_context(vocab_size: int, n: int = CONTEXT) -> list[int]:
    """n token ids spread over the vocabulary: a step's cost depends on the context's length, not its text."""
    return [(i * 7919) % vocab_size for i in range(1, n + 1)]


def run(eng, cfg: Config, steps: int = 8, k: int = 4, context: list[int] | None = None) -> Result:
    """Profile eng as it is configured now (apply() first to switch it); see the module docstring."""
    t0 = time.perf_counter()
    context = list(context) if context else synthetic_context(eng.config.vocab_size)
    rec = Recorder(eng, steps, k, context)
    trace, plain, record_s = rec.record()
    t1 = time.perf_counter()
    passes = reduce_trace(trace)
    seconds = dict(record_s=record_s, reduce_s=time.perf_counter() - t1)
    result = Result(cfg, trace=trace)
    base = dict(configuration=cfg.label, device=eng.device.type, kernels=eng.model.ops.name,
                graphs=eng.graph is not None, weights=cfg.weights, k=k, context=len(context))
    lengths = dict(decode=(1, len(context) + (steps + 1) / 2), verify=(rec.T, len(context) + rec.T))
    held = format_bytes(eng.model)
    for kind, pb in passes.items():
        result.formats += format_rows(base, kind, held, pb.formats, eng.bandwidth_gbs)
        T, kv_len = lengths[kind]
        moved = bytes_moved(eng, T, kv_len)
        step_ms = quiet_mean(plain[kind])
        for key in sorted(set(pb.cells) | set(moved), key=row_order):
            cell = pb.cells.get(key)
            ms, calls, nbytes = (cell.ms if cell else 0.0), (cell.calls if cell else 0.0), moved.get(key, 0.0)
            gbs = nbytes / ms / 1e6 if ms > 0 and nbytes else None
            result.rows.append(dict(base, **{"pass": kind}, layer=key[0], op_class=key[1], calls=calls, ms=ms,
                                    pct_of_step=100 * ms / pb.step_ms, bytes=nbytes, gbs=gbs,
                                    pct_of_ceiling=100 * gbs / eng.bandwidth_gbs if gbs else None))
        rows_ms = sum(c.ms for c in pb.cells.values())
        total_bytes = sum(moved.values())
        result.summary.append(dict(
            base, **{"pass": kind}, windows=pb.windows, used=pb.used, step_ms=step_ms, profiled_ms=pb.step_ms,
            rows_ms=rows_ms, rows_vs_step=rows_ms / step_ms, profiler_overhead_pct=100 * (pb.step_ms / step_ms - 1),
            host_pct=100 * sum(c.ms for (_, cls), c in pb.cells.items() if cls == "host") / rows_ms,
            **pb.split, bytes=total_bytes, gbs=total_bytes / step_ms / 1e6, bandwidth_gbs=eng.bandwidth_gbs,
            weight_bytes=eng.weight_bytes, kernel_status=eng.kernel_status, graph_status=eng.graph_status))
    seconds["total_s"] = time.perf_counter() - t0
    events = sum(1 for e in trace.get("traceEvents", []) if e.get("ph") == "X")
    for s in result.summary:
        s.update(seconds, trace_events=events)
    return result


def compare(engines: dict, configs: list[Config], probe=None, **kwargs) -> list[Result]:
    """Profile each configuration (engines: weight format -> Engine); one it cannot run gets its reason.

    probe: a function that measures the memory bandwidth now (GB/s). It runs before the first configuration,
    after each one that ran and so between them, and every result is set against the best reading: a probe
    that lost the memory bus to another job reads low, and the steps cannot have streamed faster than the
    best. Without one, each engine's own bandwidth_gbs (measured at launch) is the ceiling."""
    readings = [probe()] if probe else []
    out = []
    for cfg in configs:
        eng = engines.get(cfg.weights)
        if eng is None:
            have = ", ".join(engines) or "none"
            out.append(Result(cfg, reason=f"{cfg.weights} weights are not loaded here (loaded: {have})"))
            continue
        reason = apply(eng, cfg)
        out.append(Result(cfg, reason=reason) if reason else run(eng, cfg, **kwargs))
        if probe and not reason:
            readings.append(probe())
    if readings:
        for r in out:
            set_ceiling(r, readings)
    return out


def set_ceiling(result: Result, readings: list[float]) -> None:
    """The best of the probes' readings as the result's ceiling; every reading kept (probes_gbs) for the panel."""
    seen = [x for x in readings if x == x]
    ceiling = max(seen) if seen else float("nan")
    for s in result.summary:
        s.update(bandwidth_gbs=ceiling, probes_gbs=list(readings))
    for row in (*result.rows, *result.formats):
        row["pct_of_ceiling"] = 100 * row["gbs"] / ceiling if row["gbs"] and seen else None
