"""Tokenizers rebuilt from GGUF metadata (engine/checkpoint/gguf_tokenizer.py) against transformers' own rebuild of
the same metadata (integrations/gguf/gguf_tokenizer_mapping.py): byte-level BPE under each pre-tokenizer we
know, SentencePiece vocabularies as Llama / Mistral, Gemma and Phi-3 files hold them (merges recovered from the
scores, or Gemma's from the token order), control and user-defined tokens; and kinds we cannot rebuild refused
by name. The embedded Gemma 3 file's own tokenizer: tests/test_gguf_gemma3_270m.py."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from engine.checkpoint import gguf_tokenizer
from engine.tokenizer import BYTE_TO_CHAR

mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.",
    "def add(a, b):\n    return a + b  # 12345 + 678\n\n\tindented\ttabs",
    "I'm sure you're right, they've said we'll see. DON'T SHOUT!",
    "Café, naïve, résumé: accents. 日本語のテキスト。 Emoji 🎉 and 👍🏽.",
]
TEXTS = CORPUS + ["  leading spaces and trailing  ", "new\n\nlines\r\nand\u00a0nbsp", "<|im_start|>user hi<|im_end|>",
                  "numbers 2024-11-29 3.14159 1,234,567", "the theory thereof", ""]


def meta(d: dict):
    def get(key, default=KeyError):
        if key in d:
            return d[key]
        if default is KeyError:
            raise KeyError(key)
        return default
    return get


def bpe_vocab():
    """A small byte-level BPE trained here: its vocab (spelled in the byte alphabet) and merges, as a GGUF holds
    them, with two control tokens and a user-defined one."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=420, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer)
    m = json.loads(tok.to_str())["model"]
    tokens = sorted(m["vocab"], key=m["vocab"].get) + ["<|im_start|>", "<|im_end|>", "<think>"]
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": types}


def sentencepiece_vocab(gemma: bool):
    """A SentencePiece-style vocabulary: specials, the 256 byte tokens, then pieces with U+2581 for a space (and,
    as Gemma files store them, runs of spaces spelled as spaces), scored best first."""
    words = sorted({w for text in CORPUS for w in text.replace("\n", " ").split(" ") if w})
    pieces = []
    for w in words:
        for piece in ("\u2581" + w, w):
            for i in range(2, len(piece) + 1):
                if piece[:i] not in pieces:
                    pieces.append(piece[:i])
    chars = sorted({c for text in CORPUS for c in text} - {" ", "\n", "\t"}) + ["\u2581"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    spaces = ["  ", "   "] if gemma else ["\u2581\u2581", "\u2581\u2581\u2581"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + chars + spaces + pieces
    types = [3] * len(specials) + [6] * 256 + [1] * (len(tokens) - len(specials) - 256)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(tokens) - len(specials) - 256)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types}


def theirs(arch: str, d: dict):
    tokenizer_dict = {"tokenizer_type": d["tokenizer.ggml.model"], "tokens": d["tokenizer.ggml.tokens"],
                      "token_type": d["tokenizer.ggml.token_type"]}
    for ours, key in (("tokenizer.ggml.merges", "merges"), ("tokenizer.ggml.scores", "scores"),
                      ("tokenizer.ggml.pre", "pre_tokenizer_type")):
        if ours in d:
            tokenizer_dict[key] = d[ours]
    return mapping.convert_gguf_tokenizer(arch, tokenizer_dict)[0]


def assert_same(ours, ref, tokens):
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ids) == ref.decode(ids), text
    # every token of the file at its id, and no more (transformers' classes add a default special of their own
    # past the file's vocabulary; the model has no row for it)
    assert ours.get_vocab_size() == len(tokens)
    spelled = [t for t in tokens if not (" " in t and not t.strip())]  # Gemma's spaces are respelled
    assert all(ours.token_to_id(t) == tokens.index(t) for t in spelled if tokens.count(t) == 1)


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2"])
def test_byte_level_bpe(pre):
    d = bpe_vocab() | {"tokenizer.ggml.pre": pre}
    assert_same(gguf_tokenizer.build(meta(d), "llama"), theirs("llama", d), d["tokenizer.ggml.tokens"])


@pytest.mark.parametrize("arch, gemma", [("llama", False), ("gemma3", True), ("gemma2", True), ("phi3", False)])
def test_sentencepiece(arch, gemma):
    d = sentencepiece_vocab(gemma)
    ours = gguf_tokenizer.build(meta(d), arch)
    assert_same(ours, theirs(arch, d), d["tokenizer.ggml.tokens"])
    ids = ours.encode("ж", add_special_tokens=False).ids  # a character the vocabulary lacks: its bytes
    assert [ours.id_to_token(i) for i in ids][-2:] == ["<0xD0>", "<0xB6>"] and ours.decode(ids).strip() == "ж"


def test_control_tokens_stay_whole():
    d = bpe_vocab() | {"tokenizer.ggml.pre": "default"}
    tok = gguf_tokenizer.build(meta(d), "qwen2")
    ids = tok.encode("a<|im_end|>b<think>", add_special_tokens=False).ids
    assert d["tokenizer.ggml.tokens"].index("<|im_end|>") in ids and d["tokenizer.ggml.tokens"].index("<think>") in ids
    assert len(BYTE_TO_CHAR) == 256


@pytest.mark.parametrize("model, pre", [("gpt2", "deepseek-coder"), ("t5", None), ("rwkv", None)])
def test_kinds_we_cannot_rebuild_are_named(model, pre):
    d = {"tokenizer.ggml.model": model, "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(gguf_tokenizer.TokenizerError, match=f"tokenizer model='{model}' pre={pre!r}.*HF folder"):
        gguf_tokenizer.build(meta(d), "llama")
