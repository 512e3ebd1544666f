"""Tokenizer: tokenizer.json through the `tokenizers` library, the chat template, streaming detokenization.

Everything here behaves as transformers does for the same folder (special tokens, the bos rule, the
chat template environment), so prompts and outputs match the reference implementation id for id.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import tokenizers

if TYPE_CHECKING:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

# End-of-turn tokens of the chat formats we run (ChatML, Llama 3, GPT-2 style, Gemma, Phi-3), when the vocab has them.
CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>")
# the named special tokens transformers hands a chat template as variables
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")  # sentencepiece byte-fallback tokens


class Tokenizer:
    def __init__(self, path: str | Path, built: tokenizers.Tokenizer | None = None):
        """The folder's tokenizer; `built` is its tokenizer.json already in memory (the one just saved there)."""
        self.path = Path(path)
        file = self.path / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"no tokenizer.json in {self.path}: a model folder needs the tokenizer.json that "
                             "transformers' save_pretrained() writes; copy it there or pick another folder")
        self._tok = built if built is not None else tokenizers.Tokenizer.from_file(str(file))
        self.config = _read_json(self.path / "tokenizer_config.json")
        self._generation = _read_json(self.path / "generation_config.json")
        self.bos_token = _token_content(self.config.get("bos_token"))
        self.eos_token = _token_content(self.config.get("eos_token"))
        self.bos_id = (self._tok.token_to_id(self.bos_token) if self.bos_token
                       else self._generation.get("bos_token_id"))
        # tokenizer.json's post-processor decides, as in transformers (Llama 3 adds its bos there);
        # add_bos_token in tokenizer_config.json also asks for one when that post-processor adds none.
        post_bos = self._tok.encode("", add_special_tokens=True).ids[:1] == [self.bos_id]
        self._prepend_bos = bool(self.config.get("add_bos_token")) and self.bos_id is not None and not post_bos
        self.add_bos = post_bos or self._prepend_bos  # encode() output starts with bos_id
        self._added_ids = set(self._tok.get_added_tokens_decoder())  # spelled as plain text, not bytes
        self._byte_level = isinstance(self._tok.decoder, tokenizers.decoders.ByteLevel)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @cached_property
    def eos_ids(self) -> set[int]:
        """Every id that ends a reply (the one definition; load_model gives the model a copy): eos_token, the
        chat end tokens in the vocab, and the eos ids of config.json and generation_config.json."""
        names = [self.eos_token, *CHAT_END_TOKENS]
        ids = {self._tok.token_to_id(name) for name in names if name}
        for config in (_read_json(self.path / "config.json"), self._generation):
            eos = config.get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos])
        return {i for i in ids if i is not None}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; with add_special_tokens, the bos the model's files ask for."""
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return [self.bos_id] + ids if add_special_tokens and self._prepend_bos else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """Display text of one token: added tokens literally, a byte that is part of a character as '<0xE2>'."""
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        if token_id in self._added_ids or _BYTE_PIECE.match(piece):
            return piece
        if self._byte_level:
            return _show_bytes(bytes(_BYTE_DECODER[c] for c in piece))
        return piece.replace("\u2581", " ")  # sentencepiece writes a space as U+2581

    # ---- chat template ------------------------------------------------------------------------------

    @cached_property
    def chat_template(self) -> str | None:
        """chat_template.jinja if present (newer transformers saves it there), else tokenizer_config's."""
        jinja_file = self.path / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text()
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            template = {t["name"]: t["template"] for t in template}.get("default")
        return template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ValueError(f"{self.path} has no chat template (no chat_template.jinja and none in "
                             "tokenizer_config.json); encode plain text instead, or pick an instruct model")
        # transformers drops keys whose value is None before rendering
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        specials = {name: _token_content(self.config.get(name)) for name in _SPECIAL_NAMES}
        return self._compiled_template.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **{name: value for name, value in specials.items() if value is not None},
        )

    def encode_chat(self, user_text: str, system: str | None = None) -> list[int]:
        """Ids of a one-turn chat ready for the reply; the template writes any bos itself."""
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        messages.append({"role": "user", "content": user_text})
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        return _chat_environment().from_string(self.chat_template)

    # ---- streaming ----------------------------------------------------------------------------------

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """Incremental detokenization through tokenizers' DecodeStream, which decodes a short window of ids
    (the TGI / vLLM scheme) and holds back a character whose bytes span tokens until it is whole.
    flush() gives what it still holds when the stream ends, as the full decode has it."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tok, self._skip = tokenizer, skip_special_tokens
        self._stream = tokenizers.decoders.DecodeStream(skip_special_tokens=skip_special_tokens)
        self.ids: list[int] = []
        self._shown = 0  # characters emitted so far

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self._stream.step(self._tok._tok, token_id) or ""
        self._shown += len(text)
        return text

    def flush(self) -> str:
        return self._tok.decode(self.ids, self._skip)[self._shown:]


def _chat_environment() -> ImmutableSandboxedEnvironment:
    """The jinja environment transformers renders chat templates in (utils/chat_template_utils.py). jinja is
    imported here, at the first template: ~2 MB of RSS that a process running on token ids never holds."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' tojson: jinja's own escapes HTML characters, which would change the prompt
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level vocabularies are spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
_BYTE_DECODER = {c: b for b, c in BYTE_TO_CHAR.items()}


def _show_bytes(raw: bytes) -> str:
    """UTF-8 text, with each byte that is not part of a whole character written as <0xNN>."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = "".join(f"<0x{b:02X}>" for b in raw[e.start:e.end])
        return raw[:e.start].decode("utf-8") + bad + _show_bytes(raw[e.end:])


def _token_content(value) -> str | None:
    """tokenizer_config.json writes a special token as a string or as a serialized AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


# What loading a model needs of its tokenizer (the vocabulary's size, the end ids), kept by a converter that
# wrote the folder: a 150k-token tokenizer.json takes ~0.25 s to parse, and the app parses it once more anyway.
FACTS_FILE = "tokenizer_facts.json"
_FACT_SOURCES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


def _stamp(path: Path) -> dict[str, list[int]]:
    """Size and mtime of each file the facts come from: facts are only used while these match."""
    out = {}
    for name in _FACT_SOURCES:
        file = path / name
        if file.is_file():
            st = file.stat()
            out[name] = [st.st_size, st.st_mtime_ns]
    return out


def _parsed_facts(path: Path, built: tokenizers.Tokenizer | None = None) -> tuple[int, tuple[int, ...]]:
    tok = Tokenizer(path, built)
    return tok.vocab_size, tuple(sorted(tok.eos_ids))


def write_facts(path: str | Path, built: tokenizers.Tokenizer | None = None) -> None:
    """Keep the facts of the folder's tokenizer beside it (for folders we write: the model cache); `built` is
    its tokenizer.json in memory, else the file is parsed (a 262k-token one: ~2 s and 300 MB)."""
    path = Path(path)
    vocab_size, eos_ids = _parsed_facts(path, built)
    facts = {"vocab_size": vocab_size, "eos_ids": list(eos_ids), "stamp": _stamp(path)}
    (path / FACTS_FILE).write_text(json.dumps(facts) + "\n")


def facts(path: str | Path) -> tuple[int, tuple[int, ...]]:
    """(vocab_size, sorted eos_ids) of the folder's tokenizer: from FACTS_FILE while the files it was made
    from are unchanged, else parsed (a folder of the user's, or one edited since)."""
    path = Path(path)
    kept = _read_json(path / FACTS_FILE)
    if kept and kept.get("stamp") == _stamp(path):
        return int(kept["vocab_size"]), tuple(kept["eos_ids"])
    return _parsed_facts(path)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or remove it") from None
