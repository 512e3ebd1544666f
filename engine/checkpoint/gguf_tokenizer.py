"""A GGUF file's tokenizer, rebuilt from its metadata through the `tokenizers` library, as transformers' own GGUF
loader rebuilds it (integrations/gguf/gguf_tokenizer_mapping.py), so ids match the reference id for id.

    tokenizer.ggml.model = "gpt2"   byte-level BPE: the file's vocab and merges, split by the pre-tokenizer
                                    tokenizer.ggml.pre names (PRE_TOKENIZERS)
    tokenizer.ggml.model = "llama"  SentencePiece BPE with byte fallback: merges recovered from the vocabulary
                                    (by score; Gemma's by position), spaces as U+2581; Llama / Mistral prefix
                                    a space, Gemma does not, Phi-3 through a normalizer

Anything else fails before a tensor is read, naming the kind and what would load the model.
"""
from __future__ import annotations

from collections.abc import Callable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from engine.tokenizer import BYTE_TO_CHAR

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens such as <|im_end|>; added ones as <think>

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# tokenizer.ggml.pre -> how the text is split before byte-level BPE (the regex each model's merges were learned on)
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),  # GPT-2's own regex
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    # SmolLM2's tokenizer.json: every digit alone, then GPT-2's byte-level split
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "llama-v3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}
SENTENCEPIECE_ARCHS = {"gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3"}  # the rest: llama's


class TokenizerError(ValueError):
    """A GGUF tokenizer we cannot rebuild; the message names it and what would load the model."""


def kind(meta: Callable, arch: str) -> str:
    """'bpe' | 'llama' | 'gemma' | 'phi3' for the file, or a TokenizerError naming what it has."""
    model, pre = meta("tokenizer.ggml.model", None), meta("tokenizer.ggml.pre", None)
    if model == "gpt2" and pre in PRE_TOKENIZERS:
        return "bpe"
    if model == "llama":
        return SENTENCEPIECE_ARCHS.get(arch, "llama")
    known = f"model='gpt2' with pre in {sorted(PRE_TOKENIZERS)}, or model='llama' (SentencePiece)"
    raise TokenizerError(f"tokenizer model={model!r} pre={pre!r}, which decodescope cannot rebuild from GGUF "
                         f"metadata (it rebuilds {known}); load the model from its HF folder or hub id instead, "
                         "which ships tokenizer.json")


def build(meta: Callable, arch: str) -> Tokenizer:
    """The file's tokenizer; meta(key, default) reads its metadata."""
    how = kind(meta, arch)
    tokens = list(meta("tokenizer.ggml.tokens"))
    types = list(meta("tokenizer.ggml.token_type", [1] * len(tokens)))
    if how == "bpe":
        tok = byte_level(tokens, meta("tokenizer.ggml.merges", []), meta("tokenizer.ggml.pre"))
    else:
        scores = list(meta("tokenizer.ggml.scores", [0.0] * len(tokens)))
        tok = sentencepiece(tokens, scores, how)
    spelled = set(BYTE_TO_CHAR.values()) if how == "bpe" else None
    # control tokens stay whole and are special; in a byte-level vocab one spelled outside the byte alphabet is a
    # llama.cpp mislabel, and adding it would grow the vocabulary past the model's rows (as transformers skips it)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types, strict=True)
                            if k == CONTROL and (spelled is None or set(t) <= spelled)])
    vocab = tok.get_vocab()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types, strict=True)
                    if k == USER_DEFINED and t in vocab])
    return tok


def byte_level(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    alphabet = set(BYTE_TO_CHAR.values())
    vocab = {t if set(t) <= alphabet else "".join(BYTE_TO_CHAR[b] for b in t.encode()): i
             for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], fuse_unk=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # the bos, where asked, comes from Tokenizer
    return tok


def sentencepiece(tokens: list[str], scores: list[float], how: str) -> Tokenizer:
    if how == "gemma":
        # Gemma stores a token of several spaces as spaces, and looks it up as U+2581s; its scores do not follow
        # its merge order, its token order does
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-i for i in range(len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = recover_merges(vocab, dict(zip(tokens, scores, strict=True)))
    unk = {"unk_token": "<unk>"} if how == "gemma" else {}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, **unk))
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if how == "gemma":
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    elif how == "phi3":  # the prefix space from a normalizer: "  hi" -> three U+2581s, as Phi-3's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        steps.append(decoders.Strip(content=" ", left=1))
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok


def recover_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece stores no merges: every split of a token into two tokens of the vocabulary is one, ranked
    by the merged token's score, then the longer left piece (transformers' generate_merges, whose order the
    ids depend on)."""
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]
