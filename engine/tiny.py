"""Tiny random-weight models of every family written as real HF folders: for tests, smoke runs and the app's `--tiny`.

The folder goes through the same loader as any model, and transformers can read it too, so tests compare
our engine and the reference on identical weights."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine import families
from engine.checkpoint.hf import expected_shapes
from engine.config import ModelConfig

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tiny_config(model_type: str = "llama", **overrides) -> ModelConfig:
    """A config of the family `model_type` small enough to run a few hundred steps in a second on a CPU: the
    shape below, then the family's own tiny settings (its recipe's `tiny`: small sliding windows, say, so a short
    prompt crosses them), then `overrides` (config.json keys).

    The vocabulary is the 256 byte tokens plus three specials, so the byte-level tokenizer below fits it."""
    d = dict(model_type=model_type, vocab_size=256 + len(SPECIALS), hidden_size=64, intermediate_size=160,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=256,
             eos_token_id=258)
    family = families.get(model_type)
    d.update(family.tiny if family else {})
    d.update(overrides)
    return ModelConfig.from_dict(d)


def tiny_cuda_config(**overrides) -> ModelConfig:
    """tiny_config with head_dim 64 (hidden 256 over 4 heads): a size the fused CUDA decode attention is built for
    (engine.ops.FUSED_HEAD_DIMS), so the CUDA tests run the kernels, and the graphs over them, where tiny_config's
    head_dim 16 would fall back to the torch twins."""
    return tiny_config(**{"hidden_size": 256, "intermediate_size": 640, **overrides})


def random_weights(cfg: ModelConfig, seed: int = 0, std: float = 0.1) -> dict[str, torch.Tensor]:
    """HF-named fp32 tensors. A larger std than training init keeps logits peaked, so greedy choices are
    not near-ties that fp32 rounding could flip between two correct attention paths."""
    g = torch.Generator().manual_seed(seed)
    return {name: random_tensor(cfg, name, shape, g, std) for name, shape in expected_shapes(cfg).items()}


def random_tensor(cfg: ModelConfig, name: str, shape, g: torch.Generator, std: float) -> torch.Tensor:
    """HF tensor `name`'s random values in `shape` (all of it, or a chunk of its rows), fp32."""
    x = torch.randn(shape, generator=g)
    if name.endswith("norm.weight"):  # ~1 as the model runs it ((1 + w) norms store w)
        return 1 - cfg.norm_offset + 0.1 * x
    return x if name == "model.embed_tokens.weight" else std * x


def byte_tokenizer_json(vocab_size: int = 256 + len(SPECIALS)) -> str:
    """A byte-level BPE tokenizer with no merges: token i < 256 is byte i, then the specials.

    A smaller vocab_size (the distribution tests' 8 tokens) keeps only bytes 0..vocab_size-1 and no specials, so the
    tokenizer never names an id the model has no embedding for (the loader refuses such a pair)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from engine.tokenizer import BYTE_TO_CHAR

    full = vocab_size >= 256 + len(SPECIALS)
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256 if full else vocab_size)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if full:
        tok.add_special_tokens(SPECIALS)
    return tok.to_str()


def write_tiny_model(folder: str | Path, cfg: ModelConfig | None = None, seed: int = 0, std: float = 0.1,
                     dtype: torch.dtype = torch.float32) -> Path:
    """An HF folder of random weights (random_weights, stored in `dtype`) and the byte-level tokenizer."""
    cfg = cfg or tiny_config()
    folder = write_model_files(folder, cfg)
    save_file({k: v.to(dtype) for k, v in random_weights(cfg, seed, std).items()}, folder / "model.safetensors")
    return folder


def write_model_files(folder: str | Path, cfg: ModelConfig) -> Path:
    """An HF folder's files but its weights: config.json and the byte-level tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
    (folder / "tokenizer.json").write_text(byte_tokenizer_json(cfg.vocab_size))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        chat_template=CHAT_TEMPLATE, bos_token="<|endoftext|>", eos_token="<|im_end|>", add_bos_token=False)))
    return folder
