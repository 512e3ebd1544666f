"""llama.cpp as the CPU anchor for bench/latency.py, through llama-cpp-python (an optional bench extra:
`pip install -e ".[bench]"`, which builds llama.cpp from source for this CPU).

The default model's own GGUF file (Q4_1) is timed as it is, and requantized with llama.cpp's own quantizer
to F32, F16 and Q8_0 once, into the model cache: the same weights as decodescope's formats of the same bytes
per weight. Timing matches bench/latency.py's for our engine: the prompt's prefill plus the first greedy
token (TTFT), then greedy steps one token at a time (ms per token), same prompt, same threads.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from engine import weights as W

# our weight format -> llama.cpp's file type of the same bytes per weight (the formats' records name it)
FORMATS = {name: f.gguf for name, f in W.REGISTRY.items() if f.pickable and f.gguf and f.name != "bf16"}


def unavailable() -> str | None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 'llama-cpp-python is not installed (pip install -e ".[bench]" builds it, ~8 minutes on 2 cores)'
    return None


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

    kind = FORMATS[fmt]
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
    """Best-of-repeats TTFT and the median ms per greedy step, and the greedy ids, timed in a process of its
    own. llama.cpp's OpenMP threads spin between ops; importing decodescope sets OMP_WAIT_POLICY=PASSIVE for
    torch (engine/__init__.py), and in the same process that made llama.cpp 2.5x slower (Q4_1: 44 against
    111 tok/s on the 2-core box). The child gets the environment the caller had before that default."""
    from engine import USER_OMP_WAIT_POLICY

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if USER_OMP_WAIT_POLICY is not None:
        env["OMP_WAIT_POLICY"] = USER_OMP_WAIT_POLICY
    job = json.dumps(dict(path=str(path), prompt=prompt, new_tokens=new_tokens, threads=threads, repeats=repeats))
    done = subprocess.run([sys.executable, "-m", "bench.llamacpp"], input=job, capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parent.parent, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"timing {path.name} with llama.cpp failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _time_here(path: Path, prompt: list[int], new_tokens: int, threads: int, repeats: int) -> dict:
    import llama_cpp

    with quiet_stderr():
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt) + new_tokens + 8, n_threads=threads,
                              n_threads_batch=threads, n_batch=512, verbose=False)
    ttfts, steps, ids = [], [], []
    for r in range(repeats + 1):  # the first run warms up
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ttft = (time.perf_counter() - t) * 1e3
        ids, times = [tok], []
        for _ in range(new_tokens - 1):
            t = time.perf_counter()
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            times.append((time.perf_counter() - t) * 1e3)
            ids.append(tok)
        if r:
            ttfts.append(ttft)
            steps.append(statistics.median(times))
    del llm
    ms = min(steps)
    return dict(ttft_ms=min(ttfts), ms_per_token=ms, tok_s=1e3 / ms, ids=ids,
                file=f"{path.name} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":  # the child of time_decode: one job as JSON on stdin, the result as JSON on stdout
    job = json.loads(sys.stdin.read())
    print(json.dumps(_time_here(Path(job["path"]), job["prompt"], job["new_tokens"], job["threads"], job["repeats"])))
