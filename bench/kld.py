"""How far a format's next-token distributions sit from the exact model's, llama.cpp's way
(`llama-perplexity --kl-divergence`), for ours and for llama.cpp on the same tokens against the same reference.

A text is cut into chunks of n_ctx tokens, each run from an empty cache; the second half of each chunk is scored
(positions n_ctx/2 .. n_ctx-2 predict the next token), as llama-perplexity does. The reference's log-probabilities
are written in llama-perplexity's own base-file format (uint16 steps between the row's floor, max - 16, and its
max), from our fp32 logits: llama.cpp then reads that file and reports its KL divergence, and ours are computed
from the same file by the same formulas (`figures`, `summary`: a transcription of perplexity.cpp's log_softmax), so both
engines are judged against one reference on one set of tokens.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import torch

FLOOR = 16.0  # a row keeps log-probabilities down to max - 16; llama.cpp's KL sum skips the base's below -16


def chunks(ids: list[int], n_ctx: int) -> list[list[int]]:
    """The text's whole chunks of n_ctx tokens; llama-perplexity asks for at least two."""
    if len(ids) < 2 * n_ctx:
        raise ValueError(f"{len(ids)} tokens make fewer than two chunks of n_ctx={n_ctx}; give a longer text or a "
                         "smaller n_ctx")
    return [ids[i * n_ctx:(i + 1) * n_ctx] for i in range(len(ids) // n_ctx)]


def scored(n_ctx: int) -> slice:
    """The rows of a chunk's logits that are scored: n_ctx/2 .. n_ctx-2 (each predicts the token after it)."""
    return slice(n_ctx // 2, n_ctx - 1)


def row_width(n_vocab: int) -> int:
    """uint16s per row in the base file: two floats (scale, the floor's log-probability), then the vocabulary,
    padded to an even count."""
    return 2 * ((n_vocab + 1) // 2) + 4


def encode(logits: torch.Tensor) -> np.ndarray:
    """Rows of logits [m, V] -> the base file's rows [m, row_width(V)] uint16 (perplexity.cpp log_softmax)."""
    x = logits.float().numpy()
    m, n_vocab = x.shape
    hi = x.max(1)
    lo = np.maximum(x.min(1), hi - np.float32(FLOOR))
    lse = np.log(np.exp((x - hi[:, None]).astype(np.float64)).sum(1)).astype(np.float32)
    scale = ((hi - lo) / np.float32(65535)).astype(np.float32)
    out = np.zeros((m, row_width(n_vocab)), np.uint16)
    head = out[:, :4].view(np.float32)
    head[:, 0], head[:, 1] = scale, lo - hi - lse
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.rint((np.float32(1) / scale)[:, None] * (x - lo[:, None]))
    out[:, 4:4 + n_vocab] = np.where((x > lo[:, None]) & (scale[:, None] > 0), steps, 0).astype(np.uint16)
    return out


def decode(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """The base file's rows -> log-probabilities [m, V] float32, as llama.cpp reads them."""
    head = rows[:, :4].view(np.float32)
    return head[:, :1] * rows[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]


def write_base(path: Path, n_ctx: int, n_vocab: int, tokens: list[list[int]], rows: list[np.ndarray]) -> None:
    """llama-perplexity's --kl-divergence-base file: "_logits_", n_ctx, n_vocab, n_chunk, the chunks' tokens
    (int32), then each chunk's scored rows."""
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(np.array([n_ctx], np.uint32).tobytes())
        f.write(np.array([n_vocab, len(tokens)], np.int32).tobytes())
        f.write(np.asarray(tokens, np.int32).tobytes())
        for r in rows:
            f.write(np.ascontiguousarray(r).tobytes())


def figures(logits: torch.Tensor, base: np.ndarray, targets: list[int]) -> dict:
    """Per scored position, against the base rows (decoded): the KL divergence (perplexity.cpp's sum, which skips
    base log-probabilities at or below -16), both negative log-likelihoods of the target token, whether the
    top-1 tokens agree, and the target token's probability difference."""
    q = torch.log_softmax(logits.double(), -1).numpy()
    p_log = decode(base, logits.shape[1]).astype(np.float64)
    t = np.asarray(targets)
    rows = np.arange(len(t))
    nll, nll_base = -q[rows, t], -p_log[rows, t]
    kld = np.where(p_log > -FLOOR, np.exp(p_log) * (p_log - q), 0.0).sum(1)
    return dict(nll=nll, nll_base=nll_base, kld=kld, same=q.argmax(1) == p_log.argmax(1),
                p_diff=np.exp(-nll) - np.exp(-nll_base))


def summary(parts: list[dict]) -> dict:
    """figures() of several chunks -> llama-perplexity's summary lines: the perplexities, their log ratio, mean,
    99th percentile and largest KL divergence, the top-1 agreement ("same top p") and the RMS of Δp."""
    f = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return dict(positions=len(f["kld"]), ppl=float(np.exp(f["nll"].mean())),
                ppl_base=float(np.exp(f["nll_base"].mean())),
                ln_ppl_ratio=float(f["nll"].mean() - f["nll_base"].mean()), kld_mean=float(f["kld"].mean()),
                kld_99=float(np.percentile(f["kld"], 99)), kld_max=float(f["kld"].max()),
                same_top=float(f["same"].mean()), rms_dp=float(np.sqrt((f["p_diff"] ** 2).mean())))


LLAMACPP_LINES = {"ppl": r"Mean PPL\(Q\)\s*:\s*([-\d.]+)", "ppl_base": r"Mean PPL\(base\)\s*:\s*([-\d.]+)",
                  "ln_ppl_ratio": r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*([-\d.]+)",
                  "kld_mean": r"Mean\s+KLD:\s*([-\d.]+)", "kld_99": r"99\.0%\s+KLD:\s*([-\d.]+)",
                  "kld_max": r"Maximum KLD:\s*([-\d.]+)", "rms_dp": r"RMS Δp\s*:\s*([-\d.]+)",
                  "same_top": r"Same top p:\s*([-\d.]+)"}


def parse_llamacpp(text: str) -> dict:
    """llama-perplexity --kl-divergence's summary as summary() names it (its percentages as fractions)."""
    out = {}
    for name, pattern in LLAMACPP_LINES.items():
        found = re.search(pattern, text)
        if found is None:
            raise RuntimeError(f"llama-perplexity printed no {name} line ({pattern}); its output ends:\n{text[-2000:]}")
        out[name] = float(found.group(1)) / (100 if name in ("rms_dp", "same_top") else 1)
    return out


def llamacpp_stats(exe: Path, model: Path, base_file: Path, n_ctx: int, threads: int, env: dict) -> dict:
    """llama.cpp on `model` against the base file: f32 KV cache and flash attention off (its numerics as the
    weights and activations make them, as bench/reference.py runs it), one chunk a batch."""
    cmd = [str(exe), "-m", str(model), "--kl-divergence-base", str(base_file), "--kl-divergence", "-c", str(n_ctx),
           "-b", str(n_ctx), "-t", str(threads), "-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return parse_llamacpp(done.stdout + done.stderr)
