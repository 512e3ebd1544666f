"""Building the Runtime at launch: load the models, build kernels, capture graphs, describe the machine.

Called from app.py's main() (and from tests), never at import. Progress goes to the terminal.
"""
from __future__ import annotations

import platform
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from ui.runtime import Runtime, engine_rounds
from engine.request import Request

DEFAULT_MODEL = "default"  # the embedded SmolLM2-135M-Instruct
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded)"
GEMMA = "gemma3-270m"  # the embedded Gemma 3 270M
OFFERED = (DEFAULT_MODEL, GEMMA)  # what a launch without --model offers on the page: the first loads at start
# The models a launch may name without --allow-any-model: the embedded ones (engine/checkpoint/embedded.py: Gemma 3
# 270M is the second, fetched on first use like the default), then hub ids of the families the engine runs.
KNOWN_MODELS = (
    DEFAULT_MODEL,
    GEMMA,
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "meta-llama/Llama-3.2-1B-Instruct",
    "meta-llama/Llama-3.2-3B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen3-0.6B",
    "google/gemma-3-270m-it",
    "google/gemma-3-1b-it",
    "microsoft/Phi-3-mini-4k-instruct",
)
TINY = "tiny"  # --tiny: random weights, for tests and smoke runs
# What one run asks ZeroGPU for: budgets, not measurements (no GPU run has measured these paths yet). A fresh
# worker moves the weights onto the GPU, a format's first run loads it and a graph is captured inside the call:
# ZERO_GPU_BASE_S. Per token: the twins' Python and dispatch, ~15 ms of a step on 2 CPU cores (README
# "Measured", bench/results/profile-cpu.json), with headroom for a drafter's own steps. Shorter requests wait
# less in ZeroGPU's queue.
ZERO_GPU_BASE_S = 30
ZERO_GPU_TOKEN_S = 0.08
ZERO_GPU_MAX_S = 120  # what the Space asked of every run before durations followed the request
ZERO_GPU_KERNELS = ("off on ZeroGPU: the CUDA kernels would JIT-build with nvcc inside a GPU call (a minute of "
                    "the visitor's quota, and the Space image has no nvcc); the torch ops run, with CUDA graphs")
ZERO_GPU_GRAPHS = "captured inside each GPU call (a worker keeps its capture while it lives)"


def check_allowed(names: list[str], allow_any: bool) -> None:
    bad = [n for n in names if n not in KNOWN_MODELS and n != TINY]
    if bad and not allow_any:
        raise SystemExit(f"model {bad[0]!r} is not in the launch list ({', '.join(KNOWN_MODELS)}); "
                         "pass --allow-any-model to load another folder or hub id")


def title(name: str) -> str:
    """The model as the page names it (the picker, the runs table, the CSVs' model column)."""
    from engine.checkpoint.embedded import MODELS

    if name == DEFAULT_MODEL:
        return EMBEDDED_NAME
    return f"{MODELS[name].title} (embedded)" if name in MODELS else name


def first_load(name: str) -> str:
    """What the first load of a model does, said on the page before it starts."""
    from engine.checkpoint import embedded, store

    if name in embedded.MODELS:
        m = embedded.MODELS[name]
        if not embedded.ready(store.cache_dir(None) / m.folder):
            return f"fetching its {m.size_mb} MB file and converting it once, then reading its weights"
    return "reading its weights and building its engine; the next runs start at once"


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def zero_gpu() -> bool:
    try:
        from spaces.config import Config
    except ImportError:
        return False
    return bool(Config.zero_gpu)


def zero_gpu_duration(s: Request, prompt_ids: list[int], earlier=None) -> int:
    """Seconds of GPU a run asks for, from what it asks (spaces.GPU calls it with the run's arguments)."""
    return min(ZERO_GPU_MAX_S, round(ZERO_GPU_BASE_S + ZERO_GPU_TOKEN_S * s.max_new_tokens))


def on_zero_gpu(fn):
    """fn under spaces.GPU when the `spaces` package reports ZeroGPU; fn itself everywhere else."""
    if not zero_gpu():
        return fn
    import spaces

    return spaces.GPU(duration=zero_gpu_duration)(fn)


def _tiny_folders(progress) -> tuple[Path, Path, Path]:
    from engine.tiny import tiny_config, write_tiny_model

    root = Path(tempfile.mkdtemp(prefix="decodescope-tiny-"))
    progress(f"writing tiny random-weight models to {root}")
    target = write_tiny_model(root / "target", tiny_config(), seed=0)
    draft = write_tiny_model(root / "draft", tiny_config(num_hidden_layers=2), seed=1)
    return root, target, draft


def _load_engine(name, device, dtype, max_seq_len, progress, weights=None, kv_cache=None):
    """On ZeroGPU nothing here may touch CUDA (spaces keeps the weights aside until a GPU call): no kernel
    build, no graph capture; both would happen in the main process, which has no GPU."""
    from engine import Engine, load_model

    zero = zero_gpu()
    t0 = time.perf_counter()
    model = load_model(None if name == DEFAULT_MODEL else name, device=device, dtype=dtype, weights=weights,
                       fused=not zero, progress=progress, kv_cache=kv_cache)
    eng = Engine(model, max_seq_len=max_seq_len)
    progress(f"loaded {name} in {time.perf_counter() - t0:.1f} s ({eng.kernel_status})")
    if not zero:
        eng.use_graphs(True)  # off with the reason on CPU
        progress(f"CUDA graphs: {eng.graph_status}")
    return eng


def _same_model(eng, dtype, progress, loaded: list, fmt: str, kv_cache: str | None = None):
    """The target of `eng` on a new Engine (its own cache) in weight format fmt: the weights of an engine
    already in that format (eng or one of `loaded`) shared, else loaded; the measured bandwidth copied."""
    from engine import Engine

    have = next((e.model for e in [eng, *loaded] if e.model.weight_format == fmt), None)
    if have is None:
        new = _load_engine(eng.model.path, eng.device, dtype, eng.max_seq_len, progress, fmt, kv_cache)
    else:
        new = Engine(have, max_seq_len=eng.max_seq_len)
        if eng.graph is not None:
            new.use_graphs(True)
    new.bandwidth_gbs = eng.bandwidth_gbs
    return new


def build_runtime(model: str = DEFAULT_MODEL, drafts: list[str] = (), device: str = "auto", dtype: str | None = None,
                  max_seq_len: int = 2048, tiny: bool = False, bandwidth: bool = True, progress=print,
                  self_draft: str | None = "q4", weights: str | None = None, shared: dict | None = None,
                  kv_cache: str | None = "auto") -> Runtime:
    """shared: Runtime fields another model's Runtime lends this one (ui/models.py). kv_cache: load_model's, for
    every engine here (auto: fp16 on the CPU kernels)."""
    from engine import Tokenizer

    zero = zero_gpu()
    device = pick_device(device)
    draft_names, temp_dirs, paths = list(drafts), [], {}
    if tiny:
        root, target, draft = _tiny_folders(progress)
        model, draft_names, paths = TINY, [TINY + "-draft"], {TINY: target, TINY + "-draft": draft}
        temp_dirs.append(root)
    eng = _load_engine(paths.get(model, model), device, dtype, max_seq_len, progress, weights, kv_cache)
    draft_engines = {n: _load_engine(paths.get(n, n), device, dtype, max_seq_len, progress, kv_cache=kv_cache)
                     for n in draft_names}
    # quantized self-drafting: the target's own checkpoint in a cheaper format, on an Engine of its own (which
    # drafts over the target's cache: ModelDrafter); the weights are shared with the target when the target
    # already runs that format
    self_drafts = {}
    if self_draft:
        self_drafts[self_draft] = _same_model(eng, dtype, progress, [], self_draft, kv_cache)
    tok = Tokenizer(eng.model.path)
    if bandwidth and not zero:  # on ZeroGPU the probes run inside each GPU call (engine_rounds)
        from engine.observe.bandwidth import measure_gbs

        eng.bandwidth_gbs = measure_gbs(device)
        progress(f"measured memory bandwidth: {eng.bandwidth_gbs:.1f} GB/s")
    if not zero:  # Profile is refused on ZeroGPU
        from engine.observe.profile import warm

        warm()  # the profiler's first session in a process sets up its tracer (~1 s): at launch, not in a Profile
    graphs_reason = None if eng.graph is not None else eng.graph_status
    fused_reason = None if eng.model.ops.name == "fused" else eng.model.ops.reason
    if zero:
        graphs_reason = None if device == "cuda" else graphs_reason
        fused_reason = ZERO_GPU_KERNELS
    name = title(model)
    special = tok.eos_ids | ({tok.bos_id} if tok.bos_id is not None else set())
    rt = Runtime(eng, tok, name, drafts=draft_engines, self_drafts=self_drafts, fused_reason=fused_reason,
                 graphs_reason=graphs_reason, temp_dirs=temp_dirs, probe_bandwidth=bandwidth,
                 special_ids=frozenset(special), **(shared or {}))
    rt.load_format = partial(_same_model, eng, dtype, progress, list(self_drafts.values()), kv_cache=kv_cache)
    rt.rounds_fn = on_zero_gpu(partial(engine_rounds, rt))
    rt.env = environment(rt, device)
    return rt


def environment(rt: Runtime, device: str) -> dict:
    """The environment card. On ZeroGPU the main process has no GPU to ask: the card says what it is instead."""
    eng, cfg = rt.engine, rt.engine.config
    params = eng.model.n_params
    zero = zero_gpu()
    if zero:
        gpu = "ZeroGPU: a GPU slice attached for each run"
    else:
        gpu = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    bandwidth = (f"{eng.bandwidth_gbs:.1f} GB/s at launch; " if eng.bandwidth_gbs == eng.bandwidth_gbs else "") + \
        ("measured again around each run" if rt.probe_bandwidth else "not measured around runs")
    return {
        "model": f"{rt.model_name} ({cfg.model_type}, {cfg.n_layers} layers, {cfg.n_heads}/{cfg.n_kv_heads} heads)",
        "parameters": f"{params / 1e6:.1f} M",
        "dtype": str(eng.model.dtype).removeprefix("torch."),
        "device": f"{device}: {gpu}",
        "torch": torch.__version__,
        "CUDA": torch.version.cuda or "none (CPU build)",
        "kernels": eng.model.ops.reason if rt.fused_reason is None else f"torch ({rt.fused_reason})",
        "weights": f"{eng.model.weight_format} at launch ({eng.weight_bytes / 1e6:.0f} MB read per step; the LM head "
                   f"in {eng.model.lm_head.weight.fmt}); other formats load on their first run",
        "loaded": load_note(eng.model),
        "CUDA graphs": (ZERO_GPU_GRAPHS if zero else "available") if rt.graphs_reason is None else rt.graphs_reason,
        "draft models": ", ".join(rt.drafts) or "none (start with --draft NAME)",
        "self-draft": ", ".join(rt.self_drafts) or "none (start with --self-draft q4)",
        "KV cache": f"{eng.max_seq_len} positions in {str(eng.cache.k.dtype).removeprefix('torch.')} "
                    f"({eng.cache.bytes_per_token:,} bytes a position; --kv-cache at launch)",
        "memory bandwidth": bandwidth,
        "ZeroGPU": "yes" if zero else "no",
        **machine_state("cpu" if zero else device),
    }


def load_note(model) -> str:
    """What the loader did with the model's file (its load notes), or that it read a folder's tensors as they are.
    The Weights picker's launch format is the one the file's own blocks run in most (engine.model.weight_format)."""
    notes = [n.removeprefix("decodescope: ") for n in model.load_notes]
    return "; ".join(notes) or f"the folder's tensors as {model.weight_format}"


def machine_state(device: str) -> dict:
    """The machine at launch (engine.provenance): CPU model and flags, clock and governor, load; GPU clocks,
    heat, power and throttling. What would make a number on this page suspect is listed last."""
    from engine.observe.provenance import describe, snapshot

    state = describe(snapshot(device))
    state.pop("sampled")
    flags = state.pop("flags")
    return {**state, "flags at launch": flags}
