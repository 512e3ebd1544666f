"""The math ops the model runs, and the one place the kernel-or-twin choice is made.

`select(device, fused=True)` returns an OpSet, the fused kernels or their twins (ref.py); the model holds it from
construction on (and packs its weights into the OpSet's layout), so every call and every captured CUDA graph runs
one fixed path.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import torch

from engine import weights
from engine.ops import ref


@dataclass(frozen=True)
class OpSet:
    name: str  # "fused", or "torch" for the twins (the name exports and the Profile tab show)
    reason: str  # why this path: "fused CUDA kernels" or why they are not in use
    rmsnorm: Callable
    add_rmsnorm: Callable
    rope_: Callable
    silu_mul: Callable
    attention: Callable  # T queries per row against the cache, ref.attention's signature
    layout: str  # the weight layout its matmuls stream (engine/weights.py LAYOUTS)
    linear: dict[str, Callable]  # weight format -> matmul(x [N, in], *packed tensors) -> [N, out]
    # every block of a cached forward in one native call, (model, x, h, ForwardContext) -> x; None: the
    # blocks run one by one in Python (engine/model.py)
    blocks: Callable | None = None
    block_fields: tuple[str, ...] = ()  # the layer record's fields `blocks` reads (engine/model.py LayerRecord)
    # the ops only some families run (Gemma's GeGLU, Qwen3's and Gemma 3's q/k norms): the twins unless a
    # module has the kernel
    gelu_tanh_mul: Callable = ref.gelu_tanh_mul
    rmsnorm_heads_: Callable = ref.rmsnorm_heads_
    logsumexp: Callable = ref.logsumexp  # [R, V] -> [R]: the greedy pick's shown probability (engine/sampling.py)
    greedy: Callable = ref.greedy  # [R, V] -> R (argmax, max, logsumexp): greedy picks on the host
    # (x [N, in], the head's Packed weight) -> (logits [N, V], greedy's picks of them), made by the matmul as it
    # writes each stretch of logits (engine/sampling.py HeadPicks); None: the head is a plain matmul
    head_greedy: Callable | None = None
    # (x [R, V], temperature, top_k, top_p) -> [R, V]: a sampled pick's distribution (engine/sampling.py probs)
    softmax: Callable = ref.softmax
    # (weights [R, V], R position keys) -> [R] long: a sampled draw with the keys' noise made on the fly (twin:
    # ref.race); None: sampling.Noise races over the rows exp_noise makes, in torch
    race: Callable | None = None
    exp_noise: Callable = ref.exp_noise  # (out [V], key) -> out: a position's sampling noise (engine/sampling.py)

    def matmul(self, w: weights.Packed | weights.Stacked) -> Callable:
        """The matmul of weight w: its format's, or for a Stacked weight each segment's, their outputs side by side
        (the native block loop writes each segment's straight into its slice instead: csrc/cpu/ops_blocks.cpp)."""
        if isinstance(w, weights.Packed):
            return self.linear[w.fmt]
        products = [self.linear[s.fmt] for s in w.segments]
        return lambda x, w: torch.cat([mm(x, s) for mm, s in zip(products, w.segments, strict=True)], dim=-1)


# The torch twins' matmul by what a format's CPU kernel does with the activations (WeightFormat.cpu_activations)
TWIN_MATMULS = {"exact": ref.matmul_dequantized, "int8": ref.matmul_int8_a8, "int16": ref.matmul_int16_a16,
                "q8_k": ref.matmul_q8_k}


def twin_matmul(fmt: weights.WeightFormat, device: torch.device) -> Callable:
    """The torch twin of a format's matmul: dense weights as stored, block formats dequantized; on a CPU the
    activations as the SIMD kernel treats them (int8: quantized per block, llama.cpp's Q8_0 recipe; int16: 16
    bits per block, the q4 and q8 kernels'), on a GPU left as they are (the CUDA GEMV's recipe)."""
    if not fmt.quantized:
        return ref.matmul_t
    return TWIN_MATMULS[fmt.cpu_activations if device.type == "cpu" else "exact"]


def twin_ops(reason: str, device: torch.device | str = "cpu") -> OpSet:
    """The twins: every format's weights dequantized, the activations as each format's kernel treats them."""
    device = torch.device(device)
    linear = {name: twin_matmul(f, device) for name, f in weights.REGISTRY.items()}
    return OpSet(name="torch", reason=reason, rmsnorm=ref.rmsnorm, add_rmsnorm=ref.add_rmsnorm, rope_=ref.rope_,
                 silu_mul=ref.silu_mul, attention=ref.attention, layout="torch", linear=linear)


# the head sizes the decode-attention kernel is instantiated for (csrc/cuda/kernels.cu)
FUSED_HEAD_DIMS = (64, 128)


def select(device: torch.device | str, fused: bool = True, head_dim: int | None = None,
           dtype: torch.dtype = torch.float32) -> OpSet:
    """Fused kernels where they can run, else the torch twins with the reason recorded."""
    device = torch.device(device)
    if not fused:
        return twin_ops("fused kernels switched off", device)
    if device.type == "cpu":
        if dtype != torch.float32:
            return twin_ops(f"the CPU kernels compute in float32; this model's activations are {dtype}", device)
        return cpu_ops()
    if device.type != "cuda":
        return twin_ops(f"no fused kernels for {device.type} devices", device)
    if head_dim is not None and head_dim not in FUSED_HEAD_DIMS:
        return twin_ops(f"the fused decode attention is built for head_dim {FUSED_HEAD_DIMS}; "
                         f"this model has {head_dim}", device)
    from engine.ops import ext

    status = ext.load("cuda")
    if status.module is None:
        return twin_ops(status.reason, device)
    return cuda_ops(status.module, status.reason)


def cuda_ops(module, reason: str) -> OpSet:
    """The fused OpSet over the CUDA module (csrc/cuda/bindings.cpp), or over a stand-in with its functions: the tests
    run a model's CUDA path on the CPU emulation of the kernels this way."""
    from engine.ops import cuda

    check_formats("cuda", module.format_facts())
    kernels = cuda.ops(module)
    products = {name: kernels.pop(name) for name in {f.cuda_kernel for f in weights.REGISTRY.values()} - {None}}
    # the format's kernel (int8 and q8 alike, activations in their dtype): the GEMV up to 17 rows and cuBLAS beyond
    # (engine/ops/cuda.py); fp32 weights: cuBLAS through torch
    linear = {name: ref.matmul_t if f.cuda_kernel is None else cuda_matmul(products[f.cuda_kernel])
              for name, f in weights.REGISTRY.items() if "cuda" in f.layouts}
    kernels.pop("decode_attention")  # the one-query form of attention, for the kernel tests
    return OpSet(name="fused", reason=reason, layout="cuda", linear=linear, **kernels)


def cpu_ops() -> OpSet:
    """The SIMD kernels of csrc/cpu/ where they build and this CPU runs them, else the twins with the reason."""
    from engine.ops import ext

    status = ext.load("cpu")
    if status.module is None:
        return twin_ops(status.reason, "cpu")
    from engine.ops import cpu

    check_formats("cpu", status.module.format_facts())
    return OpSet(name="fused", reason=status.reason, **cpu.ops(status.module))


def check_formats(target: str, facts: dict[str, dict]) -> None:
    """Refuse a module whose list of formats (csrc/format_list.h, as its format_facts() reports each row by
    WeightFormat field) disagrees with engine/weights' records: a format the records say the target's kernels run
    (cpu: a "cpu" layout; cuda: a cuda_kernel) and the module does not, or the other way, or a fact both hold that
    differs."""
    runs = {"cpu": lambda f: "cpu" in f.layouts, "cuda": lambda f: f.cuda_kernel is not None}[target]
    want = {name for name, f in weights.REGISTRY.items() if runs(f)}
    problems = [f"{name} is in csrc/format_list.h only" for name in facts if name not in want]
    problems += [f"{name} is in engine/weights only" for name in want if name not in facts]
    problems += [f"{name}.{key} is {value!r} in csrc/format_list.h, {getattr(weights.REGISTRY[name], key)!r} in "
                 "engine/weights" for name in facts if name in want for key, value in facts[name].items()
                 if getattr(weights.REGISTRY[name], key) != value]
    if problems:
        raise RuntimeError(f"the {target.upper()} kernels' formats disagree with engine/weights' records: "
                           + "; ".join(problems) + ". Make the row in csrc/format_list.h and the WeightFormat "
                           "record say the same, then rebuild (python -m engine.ops.ext build).")


def cuda_matmul(kernel: Callable) -> Callable:
    return lambda x, w: kernel(x, *w.tensors)
