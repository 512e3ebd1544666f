"""llama.cpp as the CPU anchor for bench/latency.py and bench/scaling.py, timed two ways on the same GGUF file:

- its Python binding's loop (llama-cpp-python, the `bench` extra, built from source for this CPU): the prompt's
  prefill plus the first greedy pick (TTFT), then one greedy step at a time (ms per token), timed like ours; the
  greedy ids read from the last row's logits after every eval, with the top-1 margin of each pick;
- its own C++ `llama-bench` (tg at a depth of the prompt's length, and pp), from scripts/build_llamacpp.sh's
  folder, <cache>/decodescope/llama.cpp-<VERSION>/bin (LLAMA_BENCH names another binary).

Both run in a process of their own with a clean environment (`clean_env`), the weights read into memory (no
mmap). The loop keeps its KV cache in f32 and flash attention off, so its F32 logits are ours up to summation
order (~2e-7 on a tiny model; the CPU flash-attention kernel rounds V to f16 even from an f32 cache, ~1e-4).
llama-bench runs as llama.cpp ships it: its default f16 cache (it takes no f32 one) and flash attention auto,
which the CPU backend turns on.

The default model's own GGUF file (Q4_1) is timed as it is, and requantized with llama.cpp's own quantizer
to F32, F16 and Q8_0 once, into the model cache: the same weights as decodescope's formats of the same bytes
per weight.
"""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

VERSION = "0.3.36"  # llama-cpp-python (pyproject's bench extra); its vendored llama.cpp builds llama-bench too
BENCH_ENV = "LLAMA_BENCH"
REPO = Path(__file__).resolve().parent.parent
# what both ways of timing llama.cpp run with, recorded beside their figures
SETTINGS = dict(use_mmap=False, loop_kv_cache="f32", loop_flash_attn="off", llama_bench_kv_cache="f16",
                llama_bench_flash_attn="auto")


def formats() -> dict[str, str]:
    """Our weight format -> llama.cpp's file type of the same bytes per weight (the formats' records name it).
    engine is imported here, not at the top: the timing child imports this module, and `import engine` would
    set OMP_WAIT_POLICY=PASSIVE in its environment before llama.cpp's OpenMP runtime reads it."""
    from engine import weights as W

    return {name: f.gguf for name, f in W.REGISTRY.items() if f.pickable and f.gguf and f.name != "bf16"}


def unavailable() -> str | None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 'llama-cpp-python is not installed (pip install -e ".[bench]" builds it, ~8 minutes on 2 cores)'
    return None


def clean_env() -> dict:
    """The environment for a llama.cpp process: the caller's, without the OpenMP default (OMP_WAIT_POLICY=PASSIVE)
    that `import engine` sets for torch (engine/__init__.py). llama.cpp's OpenMP threads spin
    between ops by design; passive, they made it ~2.5x slower (Q4_1: 44 against 111 tok/s, one run on 2 cores that
    no benchmark keeps). Values the user set before engine was imported are kept. The same environment llama-server
    gets (engine/endpoint/llamacpp.py)."""
    from engine.endpoint.llamacpp import clean_env as server_env

    return server_env()


def prefix() -> Path:
    """Where scripts/build_llamacpp.sh puts llama.cpp (its CI caller passes this folder): PREFIX/bin, PREFIX/BUILD."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "decodescope" / f"llama.cpp-{VERSION}"


def executable(path: str | Path) -> Path | None:
    """path as a Path where it is an executable file, else None."""
    path = Path(path)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def bench_binary() -> Path | None:
    """llama-bench: $LLAMA_BENCH, else the build script's folder; None if it is not an executable file."""
    return executable(os.environ.get(BENCH_ENV) or prefix() / "bin" / "llama-bench")


def server_binary() -> Path | None:
    """llama-server: $LLAMA_SERVER (as engine/endpoint/llamacpp.py reads it), else the build script's folder."""
    from engine.endpoint import llamacpp as server

    return executable(server.binary() or prefix() / "bin" / "llama-server")


def quantize_binary() -> Path | None:
    """llama-quantize, in the build script's folder (bench/random_gguf.py makes the K-quant files with it)."""
    return executable(prefix() / "bin" / "llama-quantize")


def perplexity_binary() -> Path | None:
    """llama-perplexity, in the build script's folder (bench/quality.py --kld runs its --kl-divergence)."""
    return executable(prefix() / "bin" / "llama-perplexity")


def perplexity_missing() -> str | None:
    if perplexity_binary() is not None:
        return None
    return f"no llama-perplexity in {prefix() / 'bin'} (scripts/build_llamacpp.sh {prefix()} builds it)"


def requantized(quantize: Path, source: Path, kind: str, folder: Path) -> Path:
    """`source` requantized to llama.cpp's type `kind` (F32, F16, Q8_0, ...) by llama-quantize, into folder once."""
    out = folder / f"{source.stem}.{kind}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".partial")
        done = subprocess.run([str(quantize), "--allow-requantize", str(source), str(tmp), kind], capture_output=True,
                              text=True, env=clean_env(), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"llama-quantize to {kind} failed ({done.returncode}): {done.stderr[-1500:]}")
        os.replace(tmp, out)
    return out


def binaries_missing() -> str | None:
    """Which of llama-server, llama-bench and llama-quantize the llama.cpp benchmarks cannot find, or None."""
    found = {"llama-server": server_binary(), "llama-bench": bench_binary(), "llama-quantize": quantize_binary()}
    missing = [name for name, path in found.items() if path is None]
    if not missing:
        return None
    return (f"no {', '.join(missing)} (scripts/build_llamacpp.sh {prefix()} builds them; LLAMA_SERVER and "
            "LLAMA_BENCH name others)")


def bench_missing() -> str:
    path = os.environ.get(BENCH_ENV)
    if path:
        return f"{BENCH_ENV}={path} is not an executable file"
    return (f"no llama-bench in {prefix() / 'bin'} (scripts/build_llamacpp.sh {prefix()} builds it, or set "
            f"{BENCH_ENV} to one)")


def describe() -> dict:
    """What a result records about llama.cpp: the binding's version and system_info, llama-bench's build."""
    out = dict(settings=SETTINGS)
    if unavailable() is None:
        import llama_cpp

        out.update(python=f"llama-cpp-python {llama_cpp.__version__}",
                   system_info=llama_cpp.llama_print_system_info().decode().strip())
    else:
        out["python"] = unavailable()
    exe = bench_binary()
    if exe is None:
        out["llama_bench"] = bench_missing()
        return out
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, env=clean_env(), timeout=30)
    stamp = exe.parent.parent / "BUILD"  # the build script's record of the version and the cmake flags
    out.update(llama_bench=str(exe), llama_bench_version=(version.stdout + version.stderr).strip(),
               llama_bench_build=stamp.read_text().strip() if stamp.is_file() else "not recorded")
    return out


@contextmanager
def quiet_stderr():
    """llama.cpp's C code logs every tensor to fd 2; keep the benchmark's output readable."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def model_file(q4_file: Path, fmt: str) -> Path:
    """The GGUF file of llama.cpp's type matching `fmt`, made from the Q4_1 file once (next to it)."""
    import llama_cpp

    kind = formats()[fmt]
    if kind == "Q4_1":
        return q4_file
    out = q4_file.with_name(q4_file.stem.replace("Q4_1", kind) + ".llamacpp.gguf")
    if not out.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, {"F32": "LLAMA_FTYPE_ALL_F32", "F16": "LLAMA_FTYPE_MOSTLY_F16",
                                           "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}[kind])
        params.allow_requantize = True
        tmp = out.with_suffix(".partial")
        with quiet_stderr():
            rc = llama_cpp.llama_model_quantize(str(q4_file).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize to {kind} failed with {rc}")
        os.replace(tmp, out)
    return out


def time_decode(path: Path, prompt: list[int], new_tokens: int, threads: int, repeats: int = 3) -> dict:
    """The binding's loop in a process of its own (clean_env): best-of-repeats TTFT and median ms per greedy
    step, the greedy ids and the top-1 margin of each pick."""
    job = json.dumps(dict(path=str(path), prompt=prompt, new_tokens=new_tokens, threads=threads, repeats=repeats))
    done = subprocess.run([sys.executable, "-m", "bench.llamacpp"], input=job, capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"timing {path.name} with llama.cpp failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def margin(logits: np.ndarray) -> float:
    """Top-1 logit minus top-2: how far a greedy pick was from flipping."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def last_logits(llm) -> np.ndarray:
    """The logits of the last token the context evaluated. Llama.eval copies logits into llm.scores only when
    the model was made with logits_all=True (otherwise scores stays an uninitialized array), which also
    computes the head for every prompt token: read the context's last output row (llama_get_logits_ith(-1))."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def open_model(path: Path, n_ctx: int, threads: int):
    import llama_cpp

    with quiet_stderr():
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                               n_batch=512, use_mmap=SETTINGS["use_mmap"], verbose=False,
                               flash_attn=SETTINGS["loop_flash_attn"] == "on",
                               type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)


def greedy(llm, prompt: list[int], new_tokens: int) -> tuple[float, list[float], list[int], list[float]]:
    """One greedy run from an empty cache: TTFT ms, each step's ms, the ids and each pick's margin. The
    timed span is eval + argmax, what our step times (forward + pick); the margins are taken outside it."""
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    logits = last_logits(llm)
    tok = int(np.argmax(logits))
    ttft = (time.perf_counter() - t) * 1e3
    ids, margins, times = [tok], [margin(logits)], []
    for _ in range(new_tokens - 1):
        t = time.perf_counter()
        llm.eval([tok])
        logits = last_logits(llm)
        tok = int(np.argmax(logits))
        times.append((time.perf_counter() - t) * 1e3)
        ids.append(tok)
        margins.append(margin(logits))
    return ttft, times, ids, margins


def _time_here(path: Path, prompt: list[int], new_tokens: int, threads: int, repeats: int) -> dict:
    llm = open_model(path, len(prompt) + new_tokens + 8, threads)
    ttfts, steps = [], []
    for r in range(repeats + 1):  # the first run warms up
        ttft, times, ids, margins = greedy(llm, prompt, new_tokens)
        if r:
            ttfts.append(ttft)
            steps.append(statistics.median(times))
    del llm
    ms = min(steps)
    return dict(ttft_ms=min(ttfts), ms_per_token=ms, tok_s=1e3 / ms, ids=ids, margins=margins,
                file=f"{path.name} ({path.stat().st_size / 1e6:.0f} MB)")


def bench_command(path: Path, threads: int, repetitions: int, test: list[str]) -> list[str]:
    """A llama-bench run of one test (`tg_test`, or pp's flags), the weights read into memory (-lm none), its
    flash attention as SETTINGS records, JSON out."""
    exe = bench_binary()
    if exe is None:
        raise FileNotFoundError(bench_missing())
    return [str(exe), "-m", str(path), "-t", str(threads), "-r", str(repetitions), "-o", "json", "-lm", "none",
            "-fa", SETTINGS["llama_bench_flash_attn"], *test]


def tg_test(n_gen: int, depth: int) -> list[str]:
    """llama-bench's tg{n_gen} after {depth} tokens of context, and no pp test."""
    return ["-p", "0", "-n", str(n_gen), "-d", str(depth)]


def bench_result(done: subprocess.CompletedProcess) -> dict:
    """The one test a bench_command run reported (its JSON record), or the failure with llama-bench's stderr."""
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(done.args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    (test,) = json.loads(done.stdout)
    return test


def llama_bench(path: Path, threads: int, n_gen: int = 128, depth: int = 128, n_prompt: int = 128,
                repetitions: int = 3) -> dict:
    """llama-bench's tg{n_gen} after {depth} tokens of context (our loop's steps run after the prompt) and
    pp{n_prompt}, in tokens/s (mean and stddev over its repetitions). Each is one llama-bench process with
    the clean environment and the weights read into memory (-lm none)."""
    out = {}
    for name, args in (("tg", tg_test(n_gen, depth)), ("pp", ["-p", str(n_prompt), "-n", "0"])):
        cmd = bench_command(path, threads, repetitions, args)
        test = bench_result(subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=REPO,
                                           check=False))
        out[f"{name}_tok_s"], out[f"{name}_stddev"] = test["avg_ts"], test["stddev_ts"]
        out[f"{name}_test"] = f"{name}{n_gen if name == 'tg' else n_prompt}" + (f"@d{depth}" if name == "tg" else "")
    out["model_type"], out["load_mode"], out["type_k"] = test["model_type"], test["load_mode"], test["type_k"]
    return out


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    """The first position where two greedy runs pick different tokens (None: the same ids)."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def compare_ids(eng, prompt: list[int], ours: list[int], theirs: dict) -> dict:
    """Our greedy ids against llama.cpp's on the same weights: where they part, and the top-1 margin each
    engine had there (ours from the same prefix through eng.logits, llama.cpp's as its loop recorded it).
    A margin near 0 at the split is a near-tie both engines may break either way; a large one is a bug."""
    at = first_divergence(ours, theirs["ids"])
    if at is None:
        return dict(ids_match=True, first_divergence=None, our_margin=None, llamacpp_margin=None)
    logits = eng.logits(prompt + ours[:at])[-1].float().numpy()
    return dict(ids_match=False, first_divergence=at, our_margin=margin(logits),
                llamacpp_margin=theirs["margins"][at] if at < len(theirs["margins"]) else None)


def check_same_f32(kind: str, where: str, cmp: dict) -> None:
    """F32 weights, f32 caches on both sides: the ids must be the same; anything else is a bug to look at."""
    if kind == "F32" and not cmp["ids_match"]:
        raise AssertionError(f"{where}: llama.cpp's F32 greedy ids part from ours at token {cmp['first_divergence']}"
                             f" (top-1 margin ours {cmp['our_margin']:.3g}, llama.cpp {cmp['llamacpp_margin']})")


def ids_cell(cmp: dict) -> str:
    """A table cell: 'same', or where the ids part and both margins there."""
    if cmp["ids_match"]:
        return "same"
    theirs = cmp["llamacpp_margin"]
    return (f"part at {cmp['first_divergence']} (margins {cmp['our_margin']:.2g} / "
            f"{'-' if theirs is None else f'{theirs:.2g}'})")


def child_conditions() -> dict:
    """What the timing child ran under, recorded with its figures: OpenMP's wait policy as llama.cpp's runtime
    reads it, and whether decodescope's engine (which sets it) was imported into the process."""
    return dict(omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), engine_imported="engine" in sys.modules)


if __name__ == "__main__":  # the child of time_decode: one job as JSON on stdin, the result as JSON on stdout
    job = json.loads(sys.stdin.read())
    result = _time_here(Path(job["path"]), job["prompt"], job["new_tokens"], job["threads"], job["repeats"])
    print(json.dumps(dict(result, child=child_conditions())))
