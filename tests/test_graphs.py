"""CUDA graphs: CPU fallback in CI, and warm-up and capture near the cache's end on a CPU with the graph API faked;
graphed == eager token for token on a GPU."""
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace

import pytest
import torch

from engine import Engine, graphs, load_model
from engine.kv_cache import KVCache
from engine.tiny import tiny_config, write_tiny_model


def needs_cuda(test):
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    cfg = tiny_config(num_attention_heads=8, num_key_value_heads=2, hidden_size=512, intermediate_size=1024)
    return write_tiny_model(tmp_path_factory.mktemp("m"), cfg)


def test_graphs_on_cpu_stay_off_with_the_reason(folder):
    eng = Engine(load_model(folder), max_seq_len=64)
    assert eng.use_graphs(True) == eng.graph_status
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


class CpuGraphs:
    """torch.cuda's stream and graph API on a CPU: streams are no-ops and a capture runs its forward (a real one
    only records it, so this writes more than a GPU would, never less); replay does nothing."""

    class CUDAGraph:
        def replay(self):
            pass

    @staticmethod
    @contextmanager
    def graph(graph, pool=None):
        yield

    stream = staticmethod(lambda s: nullcontext())
    Stream = current_stream = staticmethod(lambda: SimpleNamespace(wait_stream=lambda other: None))
    graph_pool_handle = synchronize = staticmethod(lambda: None)


def test_warm_up_and_capture_never_write_past_the_cache(folder, monkeypatch):
    """A capture mid-run finds the cache's length already advanced, up to max_seq_len: a recapture after a toggle
    at a full cache, a new verify size whose tokens fill it. Warm-up runs the step for real; it must write into a
    scratch cache, never past the live cache's end (on a GPU an out-of-bounds index_put kills the context), and
    the live entries stay as they were."""
    for name in ("CUDAGraph", "graph", "stream", "Stream", "current_stream", "graph_pool_handle", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(CpuGraphs, name))
    eng = Engine(load_model(folder), max_seq_len=64)
    write = KVCache.write
    writes = []

    def checked_write(cache, layer, k, v, positions, start=None):
        last = int(positions.max()) if start is None else start + k.shape[1] - 1
        assert last < cache.max_seq_len, f"K/V written at position {last} of a {cache.max_seq_len}-position cache"
        writes.append(cache is eng.cache)
        write(cache, layer, k, v, positions, start)

    monkeypatch.setattr(KVCache, "write", checked_write)
    with torch.inference_mode():
        eng.prefill(list(range(1, 65)))  # the cache is full
        live = eng.cache.k[..., :58, :].clone(), eng.cache.v[..., :58, :].clone()
        writes.clear()
        eng.graph = graphs.DecodeGraphs(eng)  # a recapture at a full cache (a window or kernel toggle)
        layers = eng.config.n_layers
        assert writes.count(False) == graphs.WARMUP_ITERS * layers  # the warm-up, on its scratch cache
        eng.rollback(58)
        eng.chunk(torch.tensor([[1, 2, 3, 4, 5, 6]]))  # a new verify size: its 6 tokens fill the cache
    assert "verify6" in eng.graph.capture_ms and writes.count(False) == 2 * graphs.WARMUP_ITERS * layers
    assert eng.cache.length == 64 and eng.cache.seq_lens.tolist() == [64]
    assert torch.equal(eng.cache.k[..., :58, :], live[0]) and torch.equal(eng.cache.v[..., :58, :], live[1])


def test_scratch_cache_is_its_own():
    cfg = tiny_config()
    cache = KVCache(cfg, 2, 16, torch.float32, "cpu")
    scratch = cache.scratch(5)
    assert scratch.k.shape == (cfg.n_layers, 2, cfg.n_kv_heads, 5, cfg.head_dim) and scratch.length == 5
    assert scratch.seq_lens.tolist() == [5, 5] and scratch.k.data_ptr() != cache.k.data_ptr()
    assert cache.length == 0


@needs_cuda
def test_graphs_captured_at_the_end_of_the_cache_match_eager(folder):
    """The decode graph captured at a full cache (as after a toggle), a verify graph first captured by a pass
    that fills it: both warm-ups would have written past the cache. Their replays give the eager logits."""
    eng = Engine(load_model(folder, device="cuda", dtype="fp32"), max_seq_len=64)
    ids = torch.arange(1, 65, device="cuda")
    with torch.inference_mode():
        eng.prefill(ids[:58].tolist())
        want_verify = eng.chunk(ids[None, 58:]).clone()
        eng.prefill(ids[:63].tolist())
        want_step = eng.decode(ids[63:]).clone()
        eng.use_graphs(True)  # at a full cache
        assert eng.graph is not None, eng.graph_status
        eng.prefill(ids[:58].tolist())
        # captures the 6-token graph with the cache full; its logits are a buffer the graphs' next replay reuses
        got_verify = eng.chunk(ids[None, 58:]).clone()
        eng.prefill(ids[:63].tolist())
        got_step = eng.decode(ids[63:])
        torch.cuda.synchronize()  # an out-of-bounds write would surface here
    assert "verify6" in eng.graph.capture_ms
    torch.testing.assert_close(got_verify, want_verify, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_step, want_step, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_a_graph_is_recaptured_when_its_inputs_are_replaced(folder):
    model = load_model(folder, device="cuda", dtype="fp32")
    eng = Engine(model, max_seq_len=64)
    eng.use_graphs(True)
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
    eng.use_graphs(True)
    assert eng.graph is not None, eng.graph_status
    graphed, _ = eng.generate([1, 2, 3, 4], max_new_tokens=100)
    assert graphed == eager


@needs_cuda
def test_graph_captured_short_replays_across_split_boundaries(folder):
    """Captured right after a 3-token prompt, the same graph must serve lengths past 256, 512, 768."""
    eng = Engine(load_model(folder, device="cuda", dtype="fp32"), max_seq_len=1024)
    eng.use_graphs(True)
    prompt = [5, 6, 7]
    graphed, _ = eng.generate(prompt, max_new_tokens=900)
    eng.use_graphs(False)
    eager, _ = eng.generate(prompt, max_new_tokens=900)
    assert graphed == eager


@needs_cuda
def test_verify_graph_matches_eager_chunk(folder):
    eng = Engine(load_model(folder, device="cuda", dtype="fp32"), max_seq_len=256)
    ids = list(range(1, 40))
    with torch.inference_mode():
        eng.prefill(ids[:20])
        want = eng.chunk(torch.tensor([ids[20:26]], device="cuda")).clone()
        eng.use_graphs(True)
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
    eng.use_graphs(True)
    assert eng.graph is None and "capture failed" in eng.graph_status and "not permitted" in eng.graph_status
    assert eng.generate([1, 2], max_new_tokens=4)[0]


class LaunchedError(AssertionError):
    pass


def launched(tokens):
    raise LaunchedError("a step past the cache reached the graph")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_step_past_max_seq_len_fails_before_any_launch(folder, mode):
    """Graphed, the K/V write is an index_put at positions only the device knows: one past the cache is a
    device-side assert that kills the CUDA context, so the host refuses the step first, in both modes."""
    eng = Engine(load_model(folder), max_seq_len=8)
    with torch.inference_mode():
        eng.prefill([1, 2, 3, 4, 5, 6])
        eng.decode(torch.tensor([7]))  # 7 of 8: fits
        if mode == "graph":
            eng.graph = SimpleNamespace(run=launched)
        with pytest.raises(ValueError, match=r"2 more position\(s\) after 7 exceed max_seq_len=8"):
            eng.chunk(torch.tensor([[8, 9]]))
        assert eng.cache.length == 7 and eng.cache.seq_lens.tolist() == [7]
        if mode == "eager":
            eng.decode(torch.tensor([8]))  # the last position
        else:
            eng.cache.advance(1)
        with pytest.raises(ValueError, match="after 8 exceed max_seq_len=8"):
            eng.decode(torch.tensor([9]))
    assert eng.cache.length == 8


def test_layer_skip_captures_its_graph_once_per_layer_set(folder, monkeypatch):
    """A run's begin() follows the target's kernels; handing the view the same ops again would bump its version
    and recapture its graph on every run."""
    from engine.speculative.layerskip import LayerSkipDrafter
    from engine.sampling import SamplingParams

    captures = []
    monkeypatch.setattr(graphs, "capture", lambda e: (captures.append(e) or SimpleNamespace(run=launched), "on"))
    eng = Engine(load_model(folder), max_seq_len=64)
    eng.use_graphs(True)
    drafter = LayerSkipDrafter(eng, layers=[0])
    with torch.inference_mode():
        drafter.begin(eng, [1, 2, 3], SamplingParams(), 8)
        version = drafter.engine.model.version
        drafter.begin(eng, [4, 5, 6], SamplingParams(), 8)
        assert drafter.engine.model.version == version and captures == [eng, drafter.engine]
        eng.use_fused(not eng.model.ops.name == "fused")  # other kernels: the view follows and recaptures
        drafter.begin(eng, [4, 5, 6], SamplingParams(), 8)
    assert drafter.engine.model.ops is eng.model.ops and captures == [eng, drafter.engine, drafter.engine]
