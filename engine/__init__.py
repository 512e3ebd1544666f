"""decodescope's runtime: a llama-family engine with a static KV cache, fused kernels, CUDA graphs and
speculative decoding. Public API (docs/ARCHITECTURE.md): load_model, Tokenizer, Engine, graphs, speculative."""
import os

# By default idle OpenMP threads spin. A CPU decode step on the twins alternates MKL's matmuls with
# ATen's elementwise ops, two thread pools on the same cores, so each spins while the other needs the core
# (on 2 cores a step took several times longer spinning); with the kernels, a torch op over a row of logits (a
# top-p or top-k mask's) left torch's thread spinning into the next step, 1.7 ms longer (4.4 -> 6.1 ms, the
# default model). It only takes effect when engine is imported before torch, which is why the entry points
# import engine first (a script that imported torch first paid that 1.7 ms). A child process inherits it: start
# another engine's process (llama.cpp's OpenMP threads spin by design) with the user's own environment
# (engine/endpoint/llamacpp.py clean_env).
OPENMP_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
USER_OPENMP = {name: os.environ.get(name) for name in OPENMP_DEFAULTS}  # what the user set, if anything
for _name, _value in OPENMP_DEFAULTS.items():
    os.environ.setdefault(_name, _value)
# Tensors of 2 MB and more on transparent huge pages (torch's CPU allocator reads this): a decode step
# streams every weight once, and with 4 KB pages each page costs a TLB miss and restarts the hardware
# prefetcher.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from engine import graphs, speculative  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.checkpoint import ModelLoadError, load_model  # noqa: E402
from engine.tokenizer import Tokenizer  # noqa: E402

__all__ = ["Engine", "ModelLoadError", "load_model", "Tokenizer", "graphs", "speculative"]
