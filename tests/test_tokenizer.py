"""engine/tokenizer.py on a tiny byte-level BPE trained here, checked against transformers."""
import json
import re

import jinja2
import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors, trainers

from engine.tokenizer import Tokenizer

SPECIALS = ["<|endoftext|>", "<s>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Streaming text must never show half a character.",
    "Café, naïve, résumé: accents are two bytes in UTF-8.",
    "日本語と中文は三バイトです。",
    "Emoji take four bytes: 🎉 🚀 👍🏽 and families 👨‍👩‍👧.",
    "def add(a, b):\n    return a + b  # 123 + 456\n",
]
# Messages exercise bos_token, trim/lstrip_blocks, loop controls, tojson (no HTML escaping) and raise_exception.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% if loop.index > 4 %}{% break %}{% endif %}\n"
    "  <|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['meta'] is defined %} {{ m['meta'] | tojson }}{% endif %}<|im_end|>\n"
    "{% endfor %}\n"
    "    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "Be brief.", "meta": {"q": "<a & b>", "é": [1, 2]}},
    {"role": "user", "content": "Héllo 🎉 世界", "name": None},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "More?"},
    {"role": "assistant", "content": "cut by the loop's break"},
]
STREAM_TEXTS = ["Héllo wörld, ça va?", "日本語のテキスト", "🎉🚀 ok 👨‍👩‍👧 done", "mixed é 世 🎉 a\n"]


def make_folder(folder, bos_in_post_processor=False, **config):
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Small vocabulary: common words merge, rare multi-byte characters stay split across byte tokens.
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if bos_in_post_processor:  # how Llama 2 / 3 tokenizer.json files add their bos
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "chat_template": TEMPLATE, **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path)


def reference(folder):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def test_encode_decode_round_trip(folder):
    tok = Tokenizer(folder)
    for text in CORPUS + STREAM_TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.encode("<|im_end|>") == [SPECIALS.index("<|im_end|>")]
    assert tok.decode(tok.encode("a<|im_end|>b"), skip_special_tokens=True) == "ab"
    assert tok.vocab_size == 330


@pytest.mark.parametrize("flags", [{}, {"add_bos_token": False}, {"bos_in_post_processor": True},
                                   {"bos_in_post_processor": True, "add_bos_token": True}])
def test_bos_rule_matches_transformers(tmp_path, flags):
    folder = make_folder(tmp_path, **flags)
    tok, ref = Tokenizer(folder), reference(folder)
    for text in ["hello world", "🎉 ok", "<s>"]:
        assert tok.encode(text) == ref.encode(text), flags
    assert tok.add_bos == (tok.encode("x")[0] == tok.bos_id) == ("bos_in_post_processor" in flags)
    assert tok.encode("x", add_special_tokens=False)[0] != tok.bos_id


def test_add_bos_token_adds_a_missing_bos(tmp_path):
    # transformers 5 ignores the flag once a tokenizer.json exists; 4.x's LlamaTokenizerFast honoured it
    tok = Tokenizer(make_folder(tmp_path, add_bos_token=True))
    assert tok.add_bos
    assert tok.encode("hello") == [tok.bos_id] + tok.encode("hello", add_special_tokens=False)


def test_eos_and_bos_ids(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    tok = Tokenizer(folder)
    assert tok.bos_id == SPECIALS.index("<s>")
    assert tok.eos_ids == {SPECIALS.index("<|endoftext|>"), SPECIALS.index("<|im_end|>"), 7, 8}


def test_token_text_shows_specials_and_byte_fragments(folder):
    tok = Tokenizer(folder)
    assert tok.token_text(SPECIALS.index("<|im_end|>")) == "<|im_end|>"
    assert "".join(tok.token_text(i) for i in tok.encode("The quick brown fox")) == "The quick brown fox"
    pieces = [tok.token_text(i) for i in tok.encode("🪐")]  # not in the corpus: one token per byte
    assert "".join(pieces) == "<0xF0><0x9F><0xAA><0x90>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_text(10_000)


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_decoder_matches_full_decode_at_every_prefix(folder, text):
    tok = Tokenizer(folder)
    ids = tok.encode(text)
    assert any("<0x" in tok.token_text(i) for i in ids), "the test needs characters split across tokens"
    for n in range(len(ids) + 1):
        stream, shown = tok.stream_decoder(), ""
        for i in ids[:n]:
            chunk = stream.push(i)
            assert "\ufffd" not in chunk, f"half a character emitted at prefix {n}: {chunk!r}"
            shown += chunk
        full = tok.decode(ids[:n])
        assert full.startswith(shown)
        # only an unfinished character is ever held back, and flush gives exactly that
        assert shown == full or full.endswith("\ufffd")
        assert shown + stream.flush() == full


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(folder, add_generation_prompt):
    tok, ref = Tokenizer(folder), reference(folder)
    ours = tok.apply_chat_template(MESSAGES, add_generation_prompt=add_generation_prompt)
    theirs = ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert '"<a & b>"' in ours and "cut by" not in ours  # tojson left HTML alone; {% break %} ran


def test_chat_template_errors_like_transformers(folder):
    bad = [{"role": "robot", "content": "beep"}]
    with pytest.raises(jinja2.TemplateError, match="unknown role robot"):
        Tokenizer(folder).apply_chat_template(bad)
    with pytest.raises(jinja2.TemplateError, match="unknown role robot"):
        reference(folder).apply_chat_template(bad, tokenize=False)


def test_encode_chat(folder):
    tok = Tokenizer(folder)
    ids = tok.encode_chat("Héllo", system="Be brief.")
    assert ids[0] == tok.bos_id  # written by the template, not added by encode
    assert tok.decode(ids) == tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo"}])


def test_chat_template_from_jinja_file_wins(folder):
    (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert Tokenizer(folder).apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"


def test_missing_chat_template_is_a_clear_error(tmp_path):
    folder = make_folder(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match="has no chat template"):
        Tokenizer(folder).encode_chat("hi")


def test_missing_tokenizer_json_names_the_folder(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"no tokenizer.json in {tmp_path}")):
        Tokenizer(tmp_path)
