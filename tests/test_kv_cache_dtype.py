"""The KV cache's dtype: load_model's kv_cache (the app's and the CLI's --kv-cache), fp16 on the CPU kernels by
default in the app and the CLI. Speculative output over an fp16 cache is plain decoding's over the same cache."""
import pytest
import torch

from engine import Engine, ModelLoadError, load_model, speculative
from engine.checkpoint.load import pick_kv_dtype
from engine.tiny import tiny_config, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 44, 32, 104, 101, 108, 108, 111, 32] * 2
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), tiny_config(), seed=2)


def test_auto_is_fp16_on_the_cpu_kernels_and_the_activations_dtype_elsewhere():
    assert pick_kv_dtype("auto", CPU, torch.float32, fused=True) == torch.float16
    assert pick_kv_dtype("auto", CPU, torch.float32, fused=False) is None  # the twins widen a whole cache a call
    assert pick_kv_dtype("auto", CPU, torch.bfloat16, fused=True) is None
    assert pick_kv_dtype("auto", torch.device("cuda"), torch.bfloat16, fused=True) is None
    assert pick_kv_dtype(None, CPU, torch.float32, fused=True) is None
    assert pick_kv_dtype("fp32", CPU, torch.float32, fused=True) == torch.float32
    with pytest.raises(ModelLoadError, match="kv_cache='fp8' is not one of"):
        pick_kv_dtype("fp8", CPU, torch.float32, fused=True)
    with pytest.raises(ModelLoadError, match=r"kv_cache='fp16' on CUDA: .* activations' dtype \(bfloat16\)"):
        pick_kv_dtype("fp16", torch.device("cuda"), torch.bfloat16, fused=True)


def test_a_model_loaded_with_an_fp16_cache_gives_its_engines_one(folder):
    model = load_model(folder, kv_cache="fp16", progress=lambda s: None)
    eng = Engine(model, 64)
    assert model.kv_dtype == torch.float16 and eng.cache.k.dtype == eng.cache.v.dtype == torch.float16
    assert any(n.startswith("KV cache in float16") for n in model.load_notes)
    assert eng.cache.bytes_per_token == 2 * 2 * model.config.n_layers * model.config.n_kv_heads * model.config.head_dim
    assert Engine(model, 64, kv_dtype=torch.float32).cache.k.dtype == torch.float32  # an engine may ask otherwise
    plain = load_model(folder, progress=lambda s: None)
    assert plain.kv_dtype is None and Engine(plain, 64).cache.k.dtype == torch.float32
    assert not any("KV cache" in n for n in plain.load_notes)
    with pytest.raises(ModelLoadError, match="kv_cache='half' is not one of"):
        load_model(folder, kv_cache="half", progress=lambda s: None)


def test_speculative_output_over_an_fp16_cache_is_plain_decodings(folder):
    """Greedy: n-gram lookup, calibrated layer skip and the first-N-layers view, token for token; the layer-skip views
    read and write the target's fp16 cache."""
    model = load_model(folder, kv_cache="fp16", weights="q4", progress=lambda s: None)
    eng = Engine(model, 256)
    want, _ = eng.generate(PROMPT, 40, stop_ids=[])
    drafters = speculative.NgramDrafter(), speculative.LayerSkipDrafter(eng), speculative.LayerSkipDrafter(eng, 2)
    for drafter in drafters:
        got, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=40, stop_ids=[], adaptive=False)
        assert got == want, drafter.name
        assert sum(r.n_drafted for r in stats.rounds) > 0, drafter.name
    assert eng.cache.k.dtype == torch.float16
