"""What the latency, speculative and profile benchmarks share: the model shapes they time on random weights,
and the timing of one decode step and of one verify pass of T tokens on an engine. Run as a script: the verify
cost table of the CPU kernels, a verify pass of T = 2..17 over the decode step per weight format and kernel path,
on the default model (main() below).

Each timed call ends with the read-back a real decode loop needs anyway (to sample, stream or stop), so a
step's time is what a user waits for, device work included.
"""
from __future__ import annotations

import inspect
import os
import statistics
import sys
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
import torch

from bench.common import in_tree, markdown_table
from engine import Engine
from engine.config import ModelConfig

SHAPES = {
    # TinyLlama-1.1B: the GPU benchmarks' model (22 layers, GQA 32/4, head_dim 64)
    "tinyllama": dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5,
                      max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False),
    # SmolLM2-135M, the embedded default model's shape (30 layers, GQA 9/3, tied 49152-token head)
    "default": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5,
                    max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True),
}


def shape_config(name: str) -> ModelConfig:
    return ModelConfig.from_dict(SHAPES[name])


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def sync(t: torch.Tensor) -> None:
    t.reshape(-1)[:1].tolist()


def greedy_ids(eng: Engine, logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy id of logits [R, V], read as the engine's own loops read them: on the CPU Engine.greedy
    (the head pass's own picks where it made them, else the kernels' one pass over the row), elsewhere torch's
    argmax. A tree whose engine has no host pick (a --baseline before it) takes torch's argmax everywhere, as its
    own loops did. torch's argmax over a 6 x 49,152 verify pass's logits took ~300 us on 2 cores, 44 us over one
    row: timing passes with it charged a 6-token pass ~0.07 of a default-model step the engine never pays."""
    greedy = getattr(eng, "greedy", None)
    if greedy is None or logits.device.type != "cpu":
        return logits.argmax(-1)
    return torch.tensor([p[0] for p in greedy(logits)], device=logits.device)


@torch.inference_mode()
def step_ms(eng: Engine, prompt: list[int], steps: int, batch: int = 1, warmup: int = 4) -> list[float]:
    """ms of each of `steps` greedy decode steps on `batch` identical rows after the prompt's prefill."""
    tokens = torch.tensor([prompt] * batch, device=eng.device)
    eng.cache.set_length(len(prompt))
    tok = eng.model(tokens, eng.cache, "prefill", last_only=True).argmax(-1)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        tok = greedy_ids(eng, eng.decode(tok))
        sync(tok)
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return times


@torch.inference_mode()
def verify_ms(eng: Engine, prompt: list[int], T: int, repeats: int = 12) -> float:
    """Median ms of a verify pass of T tokens (eng.chunk) on top of the prompt and its T greedy ids, rolled back
    after each."""
    eng.prefill(prompt)
    tokens = torch.tensor([prompt[:T]], device=eng.device)
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        sync(greedy_ids(eng, eng.chunk(tokens)[0]))
        if i >= 2:  # the first calls at a new shape pick kernels (and capture a graph)
            times.append((time.perf_counter() - t) * 1e3)
        eng.rollback(len(prompt))
    return statistics.median(times)


def cpu_path() -> str:
    """The CPU kernels' instruction-set path in use (the module's isa()), or why none runs."""
    from engine.ops import ext

    status = ext.load("cpu")
    return status.module.isa() if status.module is not None else status.reason


def verify_costs(eng: Engine, prompt: list[int], ts=(1, 2, 4, 6, 9), steps: int = 32, rounds: int = 3) -> dict:
    """A decode step's median ms, and each verify pass's ms over it (T = 1 is the step through chunk()).

    Steps and passes alternate over `rounds` rounds, and each ratio is the median of the rounds' own ratios:
    on a shared machine whose memory bandwidth moves within minutes, a step and a pass timed apart could
    land in different regimes."""
    step_all, ms_all, ratios = [], {T: [] for T in ts}, {T: [] for T in ts}
    for _ in range(rounds):
        step = statistics.median(step_ms(eng, prompt, steps))
        step_all.append(step)
        for T in ts:
            ms = verify_ms(eng, prompt, T)
            ms_all[T].append(ms)
            ratios[T].append(ms / step)
    out = dict(step_ms=statistics.median(step_all), isa=cpu_path() if eng.device.type == "cpu" else None)
    for T in ts:
        out[f"verify{T}_ms"], out[f"verify{T}_over_step"] = statistics.median(ms_all[T]), statistics.median(ratios[T])
    return out


# ---- the verify cost table: python -m bench.steps [--baseline DIR] ------------------------------------------

TEXT = Path(__file__).parent / "data" / "prose.txt"
RESEARCH = Path(__file__).parent / "data" / "verify_research.md"
GOALS = {6: 1.3, 16: 2.0}  # verify(T) <= this many decode steps

# One measurement, run in this process for the tree's own kernels and, as a script, in another source tree's
# (--baseline: the kernels before a change). The script carries this tree's timing code (the functions' source),
# so both trees are timed the same way, and uses only the engine API both have.
TIMING = (sync, greedy_ids, step_ms, verify_ms, verify_costs, cpu_path)
MEASURE = """from __future__ import annotations
import json, statistics, sys, time
import engine  # noqa: F401  (sets OpenMP's wait policy before torch loads)
import torch
from engine import Engine, Tokenizer, load_model
from engine.observe.bandwidth import measure_gbs
""" + "\n\n".join(inspect.getsource(f) for f in TIMING) + """
fmt, ts, prompt_len, threads = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
model = load_model(None, weights=fmt, progress=lambda msg: None)
prompt = Tokenizer(model.path).encode(open(sys.argv[5]).read())[:prompt_len]
eng = Engine(model, max_seq_len=prompt_len + 64)
before = measure_gbs("cpu")
row = verify_costs(eng, prompt, ts, steps=24, rounds=1)
row.update(read_gb_s=max(before, measure_gbs("cpu")), weight_bytes=model.weight_bytes)
print("RESULT " + json.dumps(row))
"""


def measure_here(eng: Engine, prompt: list[int], ts: list[int]) -> dict:
    from engine.observe.bandwidth import measure_gbs

    before = measure_gbs("cpu")
    row = verify_costs(eng, prompt, ts, steps=24, rounds=1)
    row.update(read_gb_s=max(before, measure_gbs("cpu")), weight_bytes=eng.model.weight_bytes)
    return row


def measure_baseline(tree: Path, fmt: str, ts: list[int], prompt_len: int) -> dict:
    """MEASURE in another source tree, its kernels built into a cache of its own (tree/.ext-cache)."""
    env = dict(os.environ, DECODESCOPE_EXT_CACHE=str(tree / ".ext-cache"))
    return in_tree(tree, MEASURE, [fmt, ",".join(map(str, ts)), str(prompt_len), str(torch.get_num_threads()),
                                   str(TEXT)], env, what="the baseline run")


# name -> (set_isa's argument, the AMX crossover in rows: None keeps the module's)
PATHS = {"avx2": ("avx2", None), "avx512": ("avx512", None), "amx": ("amx", None), "amx tiles at every T": ("amx", 1)}


def bench(args) -> dict:
    from engine import Tokenizer, load_model
    from engine.ops import ext

    module = ext.load("cpu").module
    if module is None:
        sys.exit(f"the CPU kernels are not available, nothing to compare: {ext.load('cpu').reason}")
    best, crossover = module.isa().split()[0], module.amx_rows()
    paths = {}
    for name in args.paths:
        try:
            module.set_isa(PATHS[name][0])
            paths[name] = PATHS[name]
        except RuntimeError as e:
            print(f"skipping {name}: {e}", flush=True)
    module.set_isa(best)
    ts = list(range(1, args.max_t + 1))
    models = {fmt: load_model(None, weights=fmt, progress=lambda msg: None) for fmt in args.formats}
    tok = Tokenizer(models[args.formats[0]].path)
    prompt = tok.encode(TEXT.read_text())[: args.prompt_len]
    samples: dict[tuple, list[dict]] = {}
    for r in range(args.rounds):  # approaches alternate within a round: this box's bandwidth moves within minutes
        for fmt in args.formats:
            eng = Engine(models[fmt], max_seq_len=args.prompt_len + 64)
            for name, (isa, rows) in paths.items():
                if rows is not None and fmt != "q4":  # the tiles' crossover moves q4 (and its q8 head) only
                    continue
                module.set_isa(isa)
                module.set_amx_rows(rows or crossover)
                samples.setdefault((fmt, name), []).append(measure_here(eng, prompt, ts))
                print(r, fmt, name, round(samples[fmt, name][-1]["step_ms"], 2), flush=True)
            module.set_isa(best)
            module.set_amx_rows(crossover)
            if args.baseline:
                name = f"baseline ({args.baseline_label})"
                samples.setdefault((fmt, name), []).append(measure_baseline(Path(args.baseline), fmt, ts,
                                                                            args.prompt_len))
                print(r, fmt, name, round(samples[fmt, name][-1]["step_ms"], 2), flush=True)
    rows = [summarize(fmt, name, runs, ts) for (fmt, name), runs in samples.items()]
    return dict(model="SmolLM2-135M-Instruct (embedded default)", prompt_tokens=len(prompt), rounds=args.rounds,
                threads=torch.get_num_threads(), amx_crossover_rows=crossover, goals=GOALS, rows=rows)


def summarize(fmt: str, name: str, runs: list[dict], ts: list[int]) -> dict:
    """Per approach: the median over rounds of the step, of each verify(T) / step ratio (each round's own), and
    of the step's share of the read bandwidth measured before and after it."""
    def med(key):
        return statistics.median(r[key] for r in runs)

    pct = statistics.median(100 * r["weight_bytes"] / (r["step_ms"] * 1e6) / r["read_gb_s"] for r in runs)
    row = dict(weights=fmt, approach=name, isa=runs[-1].get("isa") or "previous kernels", step_ms=med("step_ms"),
               weight_mb=runs[-1]["weight_bytes"] / 1e6, read_gb_s=med("read_gb_s"), pct_of_read_bw=pct)
    row.update({f"v{T}": med(f"verify{T}_over_step") for T in ts if T > 1})
    row.update({f"verify{T}_ms": med(f"verify{T}_ms") for T in ts})
    return row


def markdown(result: dict) -> str:
    ts = sorted(int(k[1:]) for k in result["rows"][0] if k.startswith("v") and k[1:].isdigit())
    met = [f"{r['weights']} {r['approach']}" for r in result["rows"]
           if all(r.get(f"v{T}", float("inf")) <= g for T, g in result["goals"].items())]
    head = (f"Verify pass of T tokens over one decode step (vT = verify(T) / step), whole engine steps of "
            f"{result['model']} after a {result['prompt_tokens']}-token prompt, {result['threads']} threads, the "
            f"approaches alternating over {result['rounds']} rounds (medians of each round's own ratio). "
            f"pct_of_read_bw: the step's weight bytes over its time, against the read bandwidth measured before "
            f"and after it (the larger). The amx path runs its tiles from T >= {result['amx_crossover_rows']} rows "
            f"(VNNI below); 'amx tiles at every T' shows where they win. Goals: "
            + ", ".join(f"v{T} <= {g}" for T, g in result["goals"].items())
            + f"; met by: {', '.join(met) or 'none'}.\n\n")
    cols = ["weights", "approach", "step_ms", "read_gb_s", "pct_of_read_bw"] + [f"v{T}" for T in ts if T > 1]
    md = head + markdown_table(result["rows"], cols)
    if RESEARCH.exists():
        md += "\n" + RESEARCH.read_text()
    return md


def main(argv=None) -> None:
    import argparse

    from bench.common import Telemetry, provenance, write_results

    p = argparse.ArgumentParser(description="the verify cost table of the CPU kernels")
    p.add_argument("--formats", nargs="+", default=["fp32", "fp16", "int8", "q4"])
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    p.add_argument("--baseline", help="a source tree whose kernels to time alongside (the commit before a change)")
    p.add_argument("--baseline-label", default="previous kernels")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-t", type=int, default=17)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="verify-cpu", help="the results' file name (a CPU kind's own table beside others)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with Telemetry("cpu") as tel:
        result = bench(args)
    result["provenance"] = provenance("cpu", tel)
    md = markdown(result)
    write_results(args.out, args.name, result, md)
    print(md)


if __name__ == "__main__":
    main()
