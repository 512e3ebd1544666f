"""The drafters on their own: the lookup's index against a brute-force scan and its choice after an edit, the
draft model's cache after rollbacks and catch-ups and its remembered cost, the layer-skip view against a
truncated checkpoint, the checks that refuse a mismatched draft model; and greedy speculative output on the
default model."""
import json
import random
import shutil

import pytest
import torch

from engine import Engine, load_model, ops, speculative
from engine.speculative import drafters
from engine.speculative.layerskip import truncated
from engine.speculative.lookup import MATCH_CAP, MAX_CANDIDATES, NgramDrafter
from engine.speculative.lookup import context as lookup_context
from engine.sampling import SamplingParams
from engine.ops import ext
from engine.checkpoint import random_model
from engine.tiny import tiny_config, tiny_cuda_config, write_tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force(tokens, k, max_n, min_n, anchor):
    """Every earlier occurrence of the longest suffix (max_n down to min_n) that has a follower, its match
    followed back up to MATCH_CAP tokens; the copy from the longest match, then one at or after the anchor,
    nearest first, then the latest, continuing from its own output once it reaches the end."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        starts = occurrences(tokens, n)
        if not starts:
            continue

        def rank(s, n=n):
            near = (s + n >= anchor, -abs(s + n - anchor)) if anchor is not None else (False, 0)
            return match_length(tokens, s, n), *near, s

        src = max(starts, key=rank) + n
        seq = list(tokens)
        for j in range(k):
            seq.append(seq[src + j])
        return seq[len(tokens):]
    return []


def brute_force_context(tokens, max_n, min_n):
    """The schedule's context for the lookup: the longest match's length bucket, and whether the occurrences
    matching that far agree on the next token; None without a match."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        starts = occurrences(tokens, n)
        if starts:
            lengths = {s: match_length(tokens, s, n) for s in starts}
            longest = max(lengths.values())
            return lookup_context(longest, len({tokens[s + n] for s in starts if lengths[s] == longest}) == 1)
    return None


def occurrences(tokens, n):
    """The starts of the last n tokens' earlier occurrences that have a follower, the latest MAX_CANDIDATES."""
    suffix = tokens[len(tokens) - n:]
    return [s for s in range(len(tokens) - n) if tokens[s:s + n] == suffix][-MAX_CANDIDATES:]


def match_length(tokens, s, n):
    """How far the occurrence of the last n tokens at s matches the sequence's end, followed back (MATCH_CAP)."""
    length = n
    while length < MATCH_CAP and s - (length - n) > 0 and tokens[s - (length - n) - 1] == tokens[-length - 1]:
        length += 1
    return length


@pytest.mark.parametrize("max_n,min_n", [(3, 1), (4, 2), (1, 1)])
def test_ngram_index_matches_brute_force(max_n, min_n):
    rng = random.Random(max_n * 10 + min_n)
    checked = 0
    for _ in range(60):
        vocab = rng.choice([2, 4, 12])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        d = NgramDrafter(max_n, min_n)
        pos = min(5, len(tokens))
        d.begin(None, tokens[:pos])
        while True:  # tokens arrive in commits of uneven sizes
            assert d.context() == brute_force_context(tokens[:pos], max_n, min_n), tokens[:pos]
            for k in (1, 3, 8):
                assert d.lookup(k) == brute_force(tokens[:pos], k, max_n, min_n, d.anchor), (tokens[:pos], k)
                checked += 1
            if pos == len(tokens):
                break
            step = rng.randrange(1, 4)
            d.commit(0, tokens[pos:pos + step])
            pos = min(pos + step, len(tokens))
    assert checked > 1000


def test_ngram_proposals():
    d = NgramDrafter(max_n=3)
    d.begin(None, [1, 2, 3, 9, 1, 2])
    assert d.lookup(4) == [3, 9, 1, 2]  # "1 2" was followed by "3 9 1 2 ..."
    d.begin(None, [5, 6, 5, 6])
    assert d.lookup(5) == [5, 6, 5, 6, 5]  # a loop continues periodically
    d.begin(None, [7])
    assert d.lookup(3) == [] and d.propose(3).ids.shape == (0,) and d.context() is None  # nothing seen: plain
    d = NgramDrafter(max_n=2)
    d.begin(None, [4, 1, 2, 3, 8, 0, 2, 3, 9, 5, 1, 2, 3])
    assert d.lookup(1) == [8]  # "2 3" occurs twice: "1 2 3" runs back further than the latest, "0 2 3"
    assert d.context() == (3, True)  # a 3-token match, the only one that long
    d.begin(None, [1, 2, 8, 1, 2, 9, 1, 2])
    assert d.lookup(1) == [9] and d.context() == (2, False)  # equally long matches that disagree: the latest
    with pytest.raises(ValueError, match="min_n=3, max_n=2"):
        NgramDrafter(max_n=2, min_n=3)


def test_ngram_resumes_the_copy_where_the_edit_left_it():
    """An answer copying a passage edits one token (40 for 5), then goes on with the passage. Its last token, 5,
    occurs three times before; the one in the passage, where the copy broke, is not the latest: the drafter
    proposes the passage's continuation, a latest-match lookup would propose 31."""
    prompt = [1, 5, 9, 20, 21, 22, 23, 5, 24, 25, 26, 30, 5, 31]
    d = NgramDrafter(max_n=3)
    d.begin(None, prompt)
    d.commit(0, [20])
    for tok in (21, 22, 23, 40, 5):  # the answer: 20 21 22 23 copied, 40 in place of the passage's 5, then 5
        d.context()
        d.commit(0, [tok])
    assert d.anchor == 7 and d.since == 2  # the copy broke at the passage's 5 (position 7), two tokens ago
    d.context()
    assert d.lookup(3) == [24, 25, 26]
    assert brute_force(d.tokens, 3, 3, 1, None) == [31, 20, 21]  # the latest occurrence


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return load_model(write_tiny_model(root / "a", tiny_config(), seed=1)), root


def test_model_drafter_cache_follows_rollbacks_and_catch_ups(tiny):
    """A drafter on a cache of its own (another checkpoint): after any pattern of accepted counts, and after plain
    rounds that never asked it for drafts, its next distribution is what a fresh prefill of the whole committed
    sequence gives."""
    target, _ = tiny
    target = Engine(target, 128)
    model = random_model(tiny_config(), weights="fp32", seed=4)  # not the target's checkpoint
    d = speculative.ModelDrafter(Engine(model, 128))
    sp, rng = SamplingParams(1.0), random.Random(0)
    seq = [10, 20, 30, 40, 50]
    d.begin(target, seq, sp, 60)
    assert d.engine.cache.source is None and d.engine.length == len(seq)
    n, emitted = 0, [7]
    for k in (1, 4, 4, 2, 3, 3, 1):
        d.commit(n, emitted)
        seq += emitted
        d.prepare()
        draft = d.propose(k, sp, sp.generator("cpu").at(len(seq)))
        want = torch.softmax(Engine(model, 128).logits(seq)[-1], -1)
        torch.testing.assert_close(draft.probs[0], want, atol=1e-5, rtol=1e-4)
        n = rng.randint(0, k)  # accept n drafts, then one token of the target's
        emitted = draft.ids[:n].tolist() + [rng.randrange(model.config.vocab_size)]
    d.commit(n, emitted)
    seq += emitted
    for _ in range(11):  # plain rounds the schedule chose: the drafter is not asked, its pending tokens pile up
        d.commit(0, [t := rng.randrange(model.config.vocab_size)])
        seq.append(t)
    d.prepare()
    assert len(d.pending) == 2  # the catch-up fed all but the last two, which the proposal feeds as one chunk
    draft = d.propose(2, sp, sp.generator("cpu"))
    want = torch.softmax(Engine(model, 128).logits(seq)[-1], -1)
    torch.testing.assert_close(draft.probs[0], want, atol=1e-5, rtol=1e-4)


def test_a_measured_draft_cost_is_remembered_for_a_while(tiny, monkeypatch):
    """The schedule's measured ratio serves the next runs against the same target, until it is COST_TTL_S old:
    then it is unknown again and the next run measures it (the machine's load may have moved)."""
    model, _ = tiny
    d = speculative.ModelDrafter(Engine(model, 64))
    clock = [1000.0]
    monkeypatch.setattr(drafters.time, "monotonic", lambda: clock[0])
    assert d.draft_cost is None
    d.remember_cost(0.3)
    clock[0] += drafters.COST_TTL_S - 1
    assert d.draft_cost == 0.3
    clock[0] += 2
    assert d.draft_cost is None


def test_layer_skip_shares_weights_and_matches_a_truncated_checkpoint(tiny):
    """The view equals the same checkpoint loaded with num_hidden_layers=2 (the loader reads the first two
    layers' tensors, the final norm and the head), without copying a weight."""
    model, root = tiny
    eng = Engine(model, 64)
    view = truncated(model, 2)
    assert view.config.n_layers == 2 and view.embed is model.embed and view.lm_head is model.lm_head
    assert all(a.attn.wqkv is b.attn.wqkv and a.mlp is b.mlp and a.attn_norm is b.attn_norm
               for a, b in zip(view.layers, model.layers[:2], strict=True))
    config = json.loads((root / "a" / "config.json").read_text())
    (root / "a2").mkdir(exist_ok=True)
    for name in ("model.safetensors", "tokenizer.json"):
        shutil.copy(root / "a" / name, root / "a2" / name)
    (root / "a2" / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 2}))
    ids = [5, 6, 7, 8, 9, 10]
    want = Engine(load_model(root / "a2"), 64).logits(ids)
    torch.testing.assert_close(Engine(view, 64).logits(ids), want)
    for bad in (0, model.config.n_layers, 1.5):
        with pytest.raises(ValueError, match=f"n_layers={bad} must be in 1..{model.config.n_layers - 1}"):
            speculative.LayerSkipDrafter(eng, n_layers=bad)


def test_a_view_shares_the_target_and_has_hooks_of_its_own():
    """Transformer.view(keep): the target's modules, ops and tables, its kept layers renumbered into the view's
    own cache (the target's untouched), and a hook on the target (a profiler's) that the view does not run."""
    model = random_model(tiny_config(), weights="fp32", seed=2)
    model.ensure_rope(16)
    view = model.view([0, 2])
    assert view.config.n_layers == 2 and model.config.n_layers == 4
    assert [b.attn.layer for b in view.layers] == [0, 1] and [b.attn.layer for b in model.layers] == [0, 1, 2, 3]
    assert view.layers[1].mlp is model.layers[2].mlp and view.layers[1].attn.wqkv is model.layers[2].attn.wqkv
    assert view.lm_head is model.lm_head and view.norm is model.norm and view.ops is model.ops
    assert view.rope_tables is model.rope_tables and view.version == model.version and view.path == model.path
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        Engine(view, 16).logits([1, 2, 3])
        assert calls == []
        Engine(model, 16).logits([1, 2, 3])
        assert calls
    finally:
        handle.remove()


def test_model_drafter_refuses_another_vocabulary_or_tokenizer(tiny):
    model, root = tiny
    eng = Engine(model, 64)
    other = load_model(write_tiny_model(root / "v300", tiny_config(vocab_size=300), seed=2))
    with pytest.raises(ValueError, match="vocab_size=300 .* vocab_size=259"):
        speculative.generate(eng, speculative.ModelDrafter(Engine(other, 128)), [1, 2, 3], k=2, max_new_tokens=8)
    folder = write_tiny_model(root / "swapped", tiny_config(), seed=2)
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="tokenizer .* differs"):
        speculative.generate(eng, speculative.ModelDrafter(Engine(load_model(folder), 64)), [1, 2, 3], k=2,
                             max_new_tokens=8)


# ---- the default model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol(default_model_dir):
    from engine import Tokenizer

    model = load_model(default_model_dir, weights="fp32")  # fp32, so q4 can draft for it
    tok = Tokenizer(default_model_dir)
    prompts = [tok.encode("The capital of France is Paris. The capital of Germany is"),
               tok.encode("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
                          "def fib2(n):\n")]
    return model, prompts


@pytest.mark.slow
def test_default_model_greedy_matches_plain(smol):
    model, prompts = smol
    eng = Engine(model, 256)
    cases = [(speculative.NgramDrafter(), 1), (speculative.NgramDrafter(), 8),
             (speculative.LayerSkipDrafter(eng, n_layers=8), 2), (speculative.LayerSkipDrafter(eng, n_layers=26), 5),
             (speculative.LayerSkipDrafter(eng), 4), (speculative.ModelDrafter(Engine(model, 256)), 4),
             (speculative.self_drafter(eng, "q4"), 4)]
    for prompt in prompts:
        want, _ = eng.generate(prompt, max_new_tokens=16, stop_ids=[])
        for drafter, k in cases:
            for adaptive in (False, True):
                got, stats = speculative.generate(eng, drafter, prompt, k=k, max_new_tokens=16, stop_ids=[],
                                                  adaptive=adaptive)
                assert got == want, (drafter.describe(), k, adaptive)
                if drafter.name == "draft_model" and not adaptive:
                    # the model drafting for itself, in fp32 or from its own lossless q4 blocks, agrees everywhere
                    assert stats.summary()["acceptance_rate"] == 1.0


# The CUDA cases' model: head_dim 64, which the fused decode attention is built for (tiny_config's 16 runs the
# twins, and graphed speculation over the kernels would go untested)
CUDA_CONFIG = tiny_cuda_config()


def test_the_cuda_cases_run_a_head_dim_the_kernels_take(monkeypatch):
    monkeypatch.setattr(ext, "load", lambda target: ext.ExtStatus(None, "not built in this test"))
    assert ops.select("cuda", head_dim=CUDA_CONFIG.head_dim).reason == "not built in this test"


@pytest.fixture(scope="module")
def kernel_sized(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("drafters_cuda"), CUDA_CONFIG, seed=1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights", [None, "q4"])
def test_graphed_speculative_matches_plain_on_cuda(kernel_sized, weights):
    """Graph replays of the draft steps, the catch-ups and the verify passes (their outputs are overwritten by the
    next replay) over the fused kernels give the plain greedy output; fp32, so the decode and chunk paths cannot
    flip a near-tie. q4: verify passes of up to 16 rows run the GEMV, k = 16's 17 rows the dequantize route."""
    model = load_model(kernel_sized, device="cuda", dtype="fp32", weights=weights)
    assert model.ops.name == "fused", model.ops.reason
    eng, draft = Engine(model, 256), Engine(model, 256)
    eng.use_graphs(True), draft.use_graphs(True)
    assert eng.graph is not None, eng.graph_status
    prompt = [72, 101, 108, 108, 111, 32, 72, 101, 108, 108, 111]
    want, _ = eng.generate(prompt, max_new_tokens=48, stop_ids=[])
    for drafter in (speculative.NgramDrafter(), speculative.LayerSkipDrafter(eng, n_layers=2),
                    speculative.ModelDrafter(draft)):
        for k, adaptive in ((1, True), (4, True), (16, False)):  # fixed k = 16: 17-row verify passes
            got, _ = speculative.generate(eng, drafter, prompt, k=k, max_new_tokens=48, stop_ids=[],
                                          adaptive=adaptive)
            assert got == want, (drafter.name, k)
        ids, stats = speculative.generate(eng, drafter, prompt, k=3, max_new_tokens=48, temperature=1.0,
                                          stop_ids=[])
        assert len(ids) == 48 and ids == stats.ids
    assert "verify17" in eng.graph.capture_ms
