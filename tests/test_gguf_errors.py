"""GGUF files we cannot convert fail before anything is written, naming the file, the value and what to do; the
model cache keeps no half-written folder."""
import gguf
import numpy as np
import pytest

from engine import ModelLoadError, load_model
from gguf_files import family_files


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    return family_files("qwen2", root)[0]


def edited(src, dst, arch=None, set_=None):
    """A copy of a GGUF file with its architecture renamed, or keys set (existing ones keep their type; new ones
    are strings or uint32)."""
    reader = gguf.GGUFReader(src)
    old = reader.fields["general.architecture"].contents()
    arch = arch or old
    w = gguf.GGUFWriter(str(dst), arch)
    values = {name: (field.contents(), field.types) for name, field in reader.fields.items()
              if not name.startswith("GGUF.") and name != "general.architecture"}
    for key, value in (set_ or {}).items():
        kind = gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.UINT32
        values[key] = (value, values[key][1] if key in values else [kind])
    for name, (value, types) in values.items():
        key = name.replace(f"{old}.", f"{arch}.", 1)
        kw = {"sub_type": types[-1]} if types[0] == gguf.GGUFValueType.ARRAY else {}
        w.add_key_value(key, value, types[0], **kw)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def fails(path, cache, words):
    with pytest.raises(ModelLoadError, match=words):
        load_model(path, cache_dir=cache, progress=lambda s: None)
    gguf_dir = cache / "gguf"
    assert not gguf_dir.exists() or not [p for p in gguf_dir.iterdir() if p.is_dir()]  # nothing half-written


def test_the_good_file_loads(good, tmp_path):
    assert load_model(good, weights="fp32", cache_dir=tmp_path, progress=lambda s: None).config.model_type == "qwen2"


def test_an_unsupported_architecture_is_named(good, tmp_path):
    f = edited(good, tmp_path / "mamba.gguf", arch="mamba")
    fails(f, tmp_path / "cache", r"mamba.gguf holds a 'mamba' model; decodescope converts GGUF files of gemma2, "
                                 r"gemma3, llama, phi3, qwen2, qwen3\. Load its HF folder if")


@pytest.mark.parametrize("cut", [0.5, 0.97])
def test_a_truncated_file_is_named(good, tmp_path, cut):
    data = good.read_bytes()
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[: int(len(data) * cut)])
    fails(f, tmp_path / "cache", r"cut.gguf is not a readable GGUF file .*corrupt or truncated: download it again")


def test_a_corrupt_header_is_named(good, tmp_path):
    data = bytearray(good.read_bytes())
    data[:4] = b"GGXX"
    f = tmp_path / "bad.gguf"
    f.write_bytes(bytes(data))
    fails(f, tmp_path / "cache", r"bad.gguf is not a readable GGUF file")


def test_a_vocabulary_that_does_not_match_the_embeddings_is_named(good, tmp_path):
    tokens = gguf.GGUFReader(good).fields["tokenizer.ggml.tokens"].contents()
    types = gguf.GGUFReader(good).fields["tokenizer.ggml.token_type"].contents()
    f = edited(good, tmp_path / "short.gguf", set_={"tokenizer.ggml.tokens": tokens[:-9],
                                                     "tokenizer.ggml.token_type": types[:-9]})
    fails(f, tmp_path / "cache", rf"short.gguf: the tokenizer lists {len(tokens) - 9} tokens but token_embd.weight "
                                 rf"has {len(tokens)} rows; the file is inconsistent")


@pytest.mark.parametrize("key, value, words", [
    ("qwen2.rope.scaling.type", "yarn", r"uses rope scaling 'yarn'; decodescope converts none, 'linear'"),
    ("qwen2.rope.dimension_count", 32, r"rotates 32 of each head's 64 dims"),
])
def test_settings_we_do_not_run_are_named(good, tmp_path, key, value, words):
    fails(edited(good, tmp_path / "odd.gguf", set_={key: value}), tmp_path / "cache", words)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        load_model(tmp_path / "nope.gguf")
