"""Speculative decoding on a K-quant target (small random GGUF files in Q4_K / Q6_K, as Q4_K_M files mix them):
self-draft picks what its measurement says is cheaper (a copy in fewer bits, else the target's own blocks with
layers skipped), a draft model given as a GGUF path drafts for it, and every run gives plain decoding's tokens
at temperature 0, in Python and from the CLI."""
import pytest

from engine import Engine, cli, load_model, speculative
from engine.speculative import selfdraft
from engine.tiny import tiny_config, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

# Q4_K_M's mix: 4-bit K-quants, 6-bit for attn_v, ffn_down and the head
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"}
PROMPT = [5, 9, 14, 9, 14, 9, 14, 30, 31]
N = 14


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(the target's GGUF file, a 1-layer draft model's GGUF file of the same tokenizer, a model cache)."""
    from gguf_files import SHAPE, write_gguf

    root = tmp_path_factory.mktemp("kquant")
    out = []
    for name, layers, seed in (("target", 3, 4), ("draft", 1, 5)):
        folder = write_tiny_model(root / name, tiny_config("llama", **SHAPE | {"num_hidden_layers": layers}),
                                  seed=seed)
        write_gguf(folder, root / f"{name}.gguf", Q4_K_M)
        out.append(root / f"{name}.gguf")
    return (*out, root / "cache")


def load(path, cache, **kw):
    return load_model(path, cache_dir=cache, progress=lambda msg: None, **kw)


@pytest.fixture(scope="module")
def target(files):
    return Engine(load(files[0], files[2]), 64)


@pytest.fixture(scope="module")
def plain(target):
    return target.generate(PROMPT, N, stop_ids=[])[0]


def test_the_target_runs_the_files_k_quant_blocks(target):
    layer = target.model.layers[0]
    assert layer.mlp.w_down.weight.fmt == "q6_k" and layer.attn.wo.weight.fmt == "q4_k"
    assert 4.5 <= selfdraft.bits_per_weight(target.model) <= 6.6


def test_self_draft_skips_layers_where_no_copy_is_cheaper(target, plain):
    assert selfdraft.copy_format(target) is None  # a 4.5-bit copy reads ~the bytes of a Q4_K_M target
    drafter = speculative.self_drafter(target)
    assert isinstance(drafter, speculative.LayerSkipDrafter) and "layers skipped" in drafter.chosen
    ids, stats = speculative.generate(target, drafter, PROMPT, k=4, max_new_tokens=N, stop_ids=[], adaptive=False)
    assert ids == plain and stats.summary()["mean_k"] > 0


@pytest.mark.parametrize("cost, copy", [(0.3, True), (0.9, False)])
def test_self_draft_keeps_a_copy_only_where_its_measured_step_is_cheap(files, cost, copy):
    eng = Engine(load(files[0], files[2], weights="int8"), 64)  # an 8.5-bit target: q4 is a candidate
    assert selfdraft.copy_format(eng) == "q4"
    measured = []

    def measure(t, d):
        measured.append((t, d.model.weight_format))
        return cost

    drafter = speculative.self_drafter(eng, measure=measure)
    assert measured == [(eng, "q4")]
    assert isinstance(drafter, speculative.LayerSkipDrafter) != copy
    assert ("q4 copy" in drafter.chosen) and (("0.30" in drafter.chosen) == copy)
    want = eng.generate(PROMPT, N, stop_ids=[])[0]
    ids, _ = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=N, stop_ids=[], adaptive=False)
    assert ids == want


def test_the_measured_cost_is_a_step_ratio(target):
    draft = Engine(target.model.view(range(1)), 64)
    assert 0 < selfdraft.copy_cost(target, draft, rounds=1) < 10
    assert target.cache.length == 0


def test_a_gguf_draft_model_drafts_for_a_k_quant_target(files, target, plain):
    draft = Engine(load(files[1], files[2]), 64)
    assert draft.model.layers[0].mlp.w_down.weight.fmt == "q6_k" and draft.config.n_layers == 1
    ids, stats = speculative.generate(target, speculative.ModelDrafter(draft), PROMPT, k=4, max_new_tokens=N,
                                      stop_ids=[], adaptive=False)
    assert ids == plain and stats.summary()["mean_k"] > 0


@pytest.mark.parametrize("flags", [["--mode", "self-draft"], ["--mode", "draft model", "--draft-model", "DRAFT"]])
def test_the_cli_runs_both_on_a_gguf_target(files, capsys, monkeypatch, flags):
    monkeypatch.setenv("DECODESCOPE_CACHE", str(files[2]))
    base = [str(files[0]), "-p", "ab ab ab ab ab", "-n", "12", "--seed", "0", "--max-seq-len", "64"]
    assert cli.main(base) == 0
    want = capsys.readouterr().out
    assert cli.main([*base, *[str(files[1]) if f == "DRAFT" else f for f in flags]]) == 0
    out = capsys.readouterr()
    assert out.out == want and "mean k" in out.err
    if flags[1] == "self-draft":
        assert "[self-draft: the target's blocks with layers skipped" in out.err


def test_an_explicit_copy_format_is_loaded_as_asked(target, plain, monkeypatch):
    """The copy drafts over the target's KV cache: no cache, prefill or catch-up of its own."""
    drafter = speculative.self_drafter(target, "q4")
    assert type(drafter) is speculative.ModelDrafter and drafter.engine.model.weight_format == "q4"
    assert drafter.engine.cache.source is target.cache
    calls = []
    monkeypatch.setattr(drafter.engine, "prefill", lambda *a: calls.append("prefill"))
    monkeypatch.setattr(drafter.engine, "chunk", lambda *a: calls.append("chunk"))
    ids, stats = speculative.generate(target, drafter, PROMPT, k=4, max_new_tokens=N, stop_ids=[], adaptive=False)
    assert ids == plain and stats.summary()["mean_k"] > 0 and calls == []
    own = target.model.weight_format  # a K-quant: the file's own blocks
    assert own in ("q4_k", "q6_k")
    with pytest.raises(ValueError, match=f"already runs {own} weights"):
        speculative.self_drafter(target, own)
