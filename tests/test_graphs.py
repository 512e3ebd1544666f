"""CUDA graphs: CPU fallback in CI; graphed == eager token for token on a GPU."""
import pytest
import torch

from engine import Engine, graphs, load_model
from engine.tiny import tiny_config, write_tiny_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = tiny_config(num_attention_heads=8, num_key_value_heads=2, hidden_size=512, intermediate_size=1024)
    return write_tiny_model(tmp_path_factory.mktemp("m"), cfg)


def test_enable_on_cpu_returns_engine_with_reason(folder):
    eng = Engine(load_model(folder), max_seq_len=64)
    assert graphs.enable(eng) is eng
    assert eng.graph is None and "CUDA device" in eng.graph_status and "cpu" in eng.graph_status


def test_what_a_graph_reads_by_address_bumps_the_model_version(folder):
    """A captured graph is captured again when the model's version moved: a larger Engine on the same model
    grows the rope table, and switching kernels replaces the ops (and their workspaces)."""
    model = load_model(folder)
    eng = Engine(model, max_seq_len=64)
    v = model.version
    Engine(model, max_seq_len=32)  # fits the table: nothing replaced
    assert model.version == v
    Engine(model, max_seq_len=128)
    assert model.version == v + 1 and model.cos.shape[0] == 128
    eng.use_fused(False)
    assert model.version == v + 2


@needs_cuda
def test_a_graph_is_recaptured_when_its_inputs_are_replaced(folder):
    model = load_model(folder, device="cuda", dtype="fp32")
    eng = graphs.enable(Engine(model, max_seq_len=64))
    want, _ = eng.generate([1, 2, 3], max_new_tokens=40)
    old = eng.graph.graphs[1]
    Engine(model, max_seq_len=2048)  # replaces model.cos / model.sin
    got, _ = eng.generate([1, 2, 3], max_new_tokens=40)
    assert got == want and eng.graph.graphs[1] is not old


@needs_cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_graphed_greedy_matches_eager(folder, dtype):
    eng = Engine(load_model(folder, device="cuda", dtype=dtype), max_seq_len=1024)
    eager, _ = eng.generate([1, 2, 3, 4], max_new_tokens=100)
    graphs.enable(eng)
    assert eng.graph is not None, eng.graph_status
    graphed, _ = eng.generate([1, 2, 3, 4], max_new_tokens=100)
    assert graphed == eager


@needs_cuda
def test_graph_captured_short_replays_across_split_boundaries(folder):
    """Captured right after a 3-token prompt, the same graph must serve lengths past 256, 512, 768."""
    eng = Engine(load_model(folder, device="cuda", dtype="fp32"), max_seq_len=1024)
    graphs.enable(eng)
    prompt = [5, 6, 7]
    graphed, _ = eng.generate(prompt, max_new_tokens=900)
    graphs.disable(eng)
    eager, _ = eng.generate(prompt, max_new_tokens=900)
    assert graphed == eager


@needs_cuda
def test_verify_graph_matches_eager_chunk(folder):
    eng = Engine(load_model(folder, device="cuda", dtype="fp32"), max_seq_len=256)
    ids = list(range(1, 40))
    with torch.inference_mode():
        eng.prefill(ids[:20])
        want = eng.chunk(torch.tensor([ids[20:26]], device="cuda")).clone()
        graphs.enable(eng)
        eng.prefill(ids[:20])
        got = eng.chunk(torch.tensor([ids[20:26]], device="cuda"))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert "verify6" in eng.graph.capture_ms


@needs_cuda
def test_capture_failure_falls_back_to_eager_with_reason(folder, monkeypatch):
    eng = Engine(load_model(folder, device="cuda"), max_seq_len=64)

    def broken(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", broken)
    graphs.enable(eng)
    assert eng.graph is None and "capture failed" in eng.graph_status and "not permitted" in eng.graph_status
    assert eng.generate([1, 2], max_new_tokens=4)[0]
