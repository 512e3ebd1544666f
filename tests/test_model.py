"""Our transformer against transformers on identical tiny random weights, and our three attention paths
against each other."""
import pytest
import torch

from engine import Engine, load_model
from engine.tiny import tiny_config, write_tiny_model

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)
CASES = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa3-tied": dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96, tie_word_embeddings=True),
    "gqa4-llama3-rope": dict(num_attention_heads=8, num_key_value_heads=2, rope_scaling=LLAMA3_ROPE),
    "head-dim-explicit-linear-rope": dict(head_dim=32, rope_scaling=dict(rope_type="linear", factor=2.0)),
    "qwen2-bias": dict(model_type="qwen2", num_attention_heads=6, num_key_value_heads=2, hidden_size=96,
                       tie_word_embeddings=True),
}


def reference(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(tmp_path, case):
    cfg = tiny_config(**CASES[case])
    folder = write_tiny_model(tmp_path, cfg, seed=1)
    ids = torch.randint(0, cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(folder)(ids).logits[0]
    got = Engine(load_model(folder), max_seq_len=128).logits(ids[0].tolist())
    # fp32 throughout; differences are summation order in matmuls and softmax (~1e-6 relative)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_qwen2_biases_are_loaded(tmp_path):
    cfg = tiny_config(model_type="qwen2")
    model = load_model(write_tiny_model(tmp_path, cfg))
    assert model.layers[0].attn.wqkv.bias is not None and model.layers[0].attn.wqkv.bias.abs().sum() > 0


def test_decode_and_chunk_paths_match_prefill(tmp_path):
    """64 cached decode steps and chunked appends give the logits a full prefill gives."""
    cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2, hidden_size=96)
    eng = Engine(load_model(write_tiny_model(tmp_path, cfg)), max_seq_len=200)
    ids = torch.randint(0, cfg.vocab_size, (80,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        full = eng.prefill(ids, all_logits=True)
        eng.rollback(0)
        eng.prefill(ids[:16])
        steps = [eng.decode(torch.tensor([t]))[0] for t in ids[16:]]
        eng.prefill(ids[:16])
        chunks = [eng.chunk(torch.tensor([ids[i:i + 8]]))[0] for i in range(16, 80, 8)]
    torch.testing.assert_close(torch.stack(steps)[:-1], full[16:-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(chunks), full[16:], atol=1e-4, rtol=1e-4)


def test_batch_rows_give_their_single_row_logits(tmp_path):
    """Rows of one batch (equal lengths, as the batched CUDA benchmark runs them) each get the logits they
    would get alone."""
    from engine.kv_cache import KVCache

    cfg = tiny_config()
    model = load_model(write_tiny_model(tmp_path, cfg))
    model.ensure_rope(64)
    n = 9
    rows = torch.randint(0, cfg.vocab_size, (3, n + 4), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        cache = KVCache(cfg, 3, 64, model.dtype, "cpu")
        cache.set_length(n)
        batch = [model(rows[:, :n], cache, "prefill", last_only=True)]
        for t in range(4):
            cache.advance(1)
            batch.append(model(rows[:, n + t, None], cache, "cached", last_only=True))
        for i in range(3):
            want = Engine(model, max_seq_len=64).prefill(rows[i].tolist(), all_logits=True)[n - 1:]
            torch.testing.assert_close(torch.stack([b[i] for b in batch]), want, atol=1e-4, rtol=1e-4)


def test_the_cache_owns_the_length(tmp_path):
    """Prefill, steps, verify passes and rollbacks move seq_lens (device) and length (host) together."""
    eng = Engine(load_model(write_tiny_model(tmp_path)), max_seq_len=64)
    with torch.inference_mode():
        eng.prefill([1, 2, 3])
        eng.decode(torch.tensor([4]))
        eng.chunk(torch.tensor([[5, 6, 7]]))
        assert eng.length == eng.cache.length == 7 and eng.cache.seq_lens.tolist() == [7]
        eng.rollback(5)
        assert eng.cache.length == 5 and eng.cache.seq_lens.tolist() == [5]
        assert eng.cache.scratch(4).length == 4  # graph warm-up's cache of its own: this one does not move
        assert eng.cache.length == 5 and eng.cache.seq_lens.tolist() == [5]
