"""bench/gemma.py's comparison machinery on a tiny random GGUF (bench/random_gguf.py), so no test needs the 270M
download: the head/rest byte split read from the file, the head-format experiment, our greedy ids against
llama.cpp's with the teacher-forced agreement (which must fall when llama.cpp's ids are tampered with), the
per-round ratios and the tables. The prompts are checked on the real tokenizer where it is in the cache.
"""
from __future__ import annotations

import math

import pytest
import torch

from bench import gemma, llamacpp, random_gguf, reference
from engine import Engine
from engine.checkpoint import default_model, embedded, store

TINY = dict(hidden=64, intermediate=96, layers=2, heads=4, kv_heads=2, tied=False, rope_theta=10000.0)
TINY_VOCAB = 512
PROMPT = [5, 300, 17, 42, 99, 256, 8, 77]
needs_binding = pytest.mark.skipif(llamacpp.unavailable() is not None, reason=str(llamacpp.unavailable()))


def tiny_load(tiny_files, kind: str, fmt: str):
    """gemma.load on a tiny file, with a model cache of the test's own (a user's cache keeps no test files)."""
    return gemma.load(str(random_gguf.path(tiny_files, "tiny", kind)), fmt, tiny_files / "cache")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    tok = random_gguf.tokenizer_fields(default_model.gguf_path(progress=lambda msg: None), vocab=TINY_VOCAB)
    random_gguf.write(folder, "tiny", TINY, tok, kinds=("F32", "Q4_1"), progress=lambda msg: None)
    return folder


def test_gguf_split_names_the_head_and_its_bytes(tiny_files):
    split = gemma.gguf_split(random_gguf.path(tiny_files, "tiny", "Q4_1"))
    head_bytes = TINY_VOCAB * TINY["hidden"] // 32 * 34  # the untied head, Q8_0 as in the default model's file
    assert split["head_type"] == "Q8_0"
    assert split["head_mb"] == pytest.approx(head_bytes / 1e6)
    assert split["head_share"] == pytest.approx(head_bytes / 1e6 / split["weight_mb"])
    assert 0 < split["head_share"] < 1


def test_head_experiment_requantizes_only_the_head(tiny_files):
    base, variant = tiny_load(tiny_files, "Q4_1", "q4"), tiny_load(tiny_files, "Q4_1", "q4+head-q4")
    a, b = gemma.our_split(base), gemma.our_split(variant)
    assert (a["head_type"], b["head_type"]) == ("q8", "q4")
    assert b["head_mb"] < a["head_mb"] and b["weight_mb"] - b["head_mb"] == pytest.approx(a["weight_mb"] - a["head_mb"])
    assert "head re-quantized from q8 to q4" in variant.load_notes[-1]
    ea, eb = Engine(base, max_seq_len=32), Engine(variant, max_seq_len=32)
    la, lb = ea.logits(PROMPT), eb.logits(PROMPT)
    assert not (la == lb).all()  # the head really changed, and runs in its new format
    # a 4-bit rounding of the head moves the logits ~12% of their spread (step/sqrt(12) of weights spread over ~6
    # sigma in 15 steps): cosine ~0.99; another matrix, or rows out of order, would be near 0
    assert torch.nn.functional.cosine_similarity(la.flatten(), lb.flatten(), dim=0) > 0.95


@pytest.mark.slow
@needs_binding
def test_compare_finds_agreement_and_a_tampered_divergence(tiny_files):
    path = random_gguf.path(tiny_files, "tiny", "F32")
    eng = Engine(tiny_load(tiny_files, "F32", "fp32"), max_seq_len=64)
    theirs = llamacpp.time_decode(path, PROMPT, 12, threads=1, repeats=1)
    same = gemma.compare(eng, PROMPT, theirs, 12)
    assert same["ids_match"] and same["ids_vs_llamacpp"] == "same" and same["top1_agreement"] == 1.0
    tampered = dict(theirs, ids=list(theirs["ids"]))
    tampered["ids"][5] = (tampered["ids"][5] + 1) % TINY_VOCAB
    parted = gemma.compare(eng, PROMPT, tampered, 12)
    assert parted["first_divergence"] == 5 and parted["ids_vs_llamacpp"].startswith("part at 5")
    assert parted["our_margin"] > 0 and parted["top1_agreement"] <= 11 / 12


@pytest.mark.slow
@pytest.mark.skipif(reference.reference_missing() is not None, reason=str(reference.reference_missing()))
def test_llamacpp_reference_gives_our_ids_on_f32_weights(tiny_files):
    """llama.cpp (llama-server, else the binding) on the F32 file: the same greedy ids as ours, a margin a pick."""
    path = random_gguf.path(tiny_files, "tiny", "F32")
    eng = Engine(tiny_load(tiny_files, "F32", "fp32"), max_seq_len=64)
    with reference.reference(path, threads=1) as greedy:
        theirs = greedy(PROMPT, 12)
    assert len(theirs["ids"]) == len(theirs["margins"]) == 12 and all(m >= 0 for m in theirs["margins"])
    cmp = gemma.compare(eng, PROMPT, theirs, 12)
    assert cmp["ids_match"] and cmp["top1_agreement"] == 1.0


def test_summarize_takes_ratios_round_by_round(tiny_files):
    model = tiny_load(tiny_files, "Q4_1", "q4")
    split = gemma.our_split(model)
    out = dict(formats={"q4": dict(split)}, llamacpp_split=dict(split))
    timed = {"ours q4": [dict(tok_s=100.0, ms_per_token=10.0, bandwidth_gbs=50.0, head_ms=6.0),
                         dict(tok_s=60.0, ms_per_token=1e3 / 60, bandwidth_gbs=40.0, head_ms=9.0)],
             "llama.cpp loop": [dict(tok_s=50.0, ms_per_token=20.0, bandwidth_gbs=50.0),
                                dict(tok_s=60.0, ms_per_token=1e3 / 60, bandwidth_gbs=40.0)]}
    rows = {r["engine"]: r for r in gemma.summarize(timed, out)}
    ours = rows["ours q4"]
    assert ours["tok_s"] == 100.0 and ours["rounds_tok_s"] == [100.0, 60.0]
    assert ours["over_llamacpp"] == pytest.approx(1.5)  # the median of 2.0 and 1.0
    assert ours["best_over_llamacpp"] == pytest.approx(100 / 60)
    gb_s = split["weight_mb"] * 1e6 / 10e-3 / 1e9  # bytes per step over 10 ms, in GB/s
    assert ours["gb_s"] == pytest.approx(gb_s) and ours["pct_of_ceiling"] == pytest.approx(100 * gb_s / 50.0)
    assert ours["head_ms"] == 6.0 and ours["head_time_share"] == pytest.approx(0.6)  # the best round's own
    assert "over_llamacpp" not in rows["llama.cpp loop"]
    result = dict(model="tiny", new_tokens=4, prompts=[dict(text="x", tokens=3)], threads=1, isa="avx2", rounds=2,
                  formats={"q4": dict(split, loaded_as="q4", notes=[])}, rows=list(rows.values()),
                  bandwidth_range_gbs=[40.0, 50.0],
                  ids=[dict(prompt=0, weights="q4", ids_vs_llamacpp="same", top1_agreement=1.0, ours_ids=[1])])
    md = gemma.markdown(result)
    assert "| 0 | q4 | same | 1 |" in md and "| ours q4 | 100 | [100.0, 60.0] |" in md and "40-50 GB/s" in md


def test_agreement_names_each_split_with_both_margins(tiny_files):
    """Our own greedy ids stand in for llama.cpp's: full agreement; the last id changed is one split, at its place,
    with our margin against that id (an earlier one would change the prefixes after it), and it is a near-tie or
    not by the margins alone."""
    eng = Engine(tiny_load(tiny_files, "F32", "fp32"), max_seq_len=64)
    ours, _ = eng.generate(PROMPT, 12, temperature=0.0, stop_ids=[])
    theirs = dict(ids=list(ours), margins=[5.0] * 12)
    same = gemma.compare(eng, PROMPT, theirs, 12)
    assert same["top1_agreement"] == 1.0 and same["splits"] == [] and same["ids_vs_llamacpp"] == "same"
    theirs["ids"][11] = (ours[11] + 1) % TINY_VOCAB
    parted = gemma.compare(eng, PROMPT, theirs, 12)
    (split,) = parted["splits"]
    assert split["at"] == 11 and split["ours"] == ours[11] and split["theirs"] == theirs["ids"][11]
    logits = eng.logits(PROMPT + ours[:11])[-1]
    assert split["our_margin"] == pytest.approx(float(logits.max() - logits[theirs["ids"][11]]), rel=1e-4)
    assert parted["top1_agreement"] == pytest.approx(11 / 12) and parted["first_divergence"] == 11
    assert reference.near_tie(dict(split, llamacpp_margin=0.1)) and not reference.near_tie(dict(split, our_margin=3.0))
    assert parted["unexplained"] == (0 if reference.near_tie(split) else 1)


def test_agreement_leaves_out_the_end_tokens_a_reference_banned(tiny_files):
    """llama-server's greedy ids come with ignore_eos, which bans the end tokens: where our top-1 is an end token
    and its pick the best of the rest, that is agreement for such a reference and a split for any other."""
    eng = Engine(tiny_load(tiny_files, "F32", "fp32"), max_seq_len=64)
    ours, _ = eng.generate(PROMPT, 6, temperature=0.0, stop_ids=[])
    logits = eng.logits(PROMPT + ours[:5])[-1]
    second = int(logits.topk(2).indices[1])
    eng.model.eos_ids = (ours[5],)  # our top-1 at the last place becomes an end token
    theirs = dict(ids=[*ours[:5], second], margins=[5.0] * 6)
    _, splits = reference.agreement(eng, PROMPT, theirs)
    assert [s["at"] for s in splits] == [5]
    _, splits = reference.agreement(eng, PROMPT, dict(theirs, eos_banned=True))
    # banned everywhere: only a place whose own top-1 was that token may part now, never the last one
    assert all(ours[s["at"]] == ours[5] for s in splits) and 5 not in [s["at"] for s in splits]


def test_server_margins_read_either_response_shape():
    new = dict(id=5, top_logprobs=[dict(id=5, logprob=-0.1), dict(id=9, logprob=-2.6)])
    old = dict(id=5, probs=[dict(tok_str="a", prob=0.5), dict(tok_str="b", prob=0.125)])
    assert reference.top_margin(new) == pytest.approx(2.5) and reference.top_margin(old) == pytest.approx(math.log(4))
    assert reference.top_margin(dict(id=5, top_logprobs=[dict(id=5, logprob=0.0)])) is None


def test_server_ids_come_from_its_tokens_with_each_margin_where_it_has_one(monkeypatch):
    """llama-server leaves out the probability entry of a token that ends inside a UTF-8 character: the ids are its
    `tokens`, every one, and the margins are matched to them in order (None at a gap), not read off the entries."""
    def entry(i, lp1, lp2):
        return {"id": i, "top_logprobs": [{"id": i, "logprob": lp1}, {"id": 0, "logprob": lp2}]}

    body = {"tokens": [5, 7, 7, 9], "completion_probabilities": [entry(5, -1.0, -3.0), entry(7, -2.0, -2.5),
                                                                  entry(9, -0.5, -4.0)]}

    class Reply:
        def raise_for_status(self):
            pass

        def json(self):
            return body

    monkeypatch.setattr("httpx.post", lambda *a, **k: Reply())
    got = reference.server_greedy("http://x", [1, 2], 4)
    assert got["ids"] == [5, 7, 7, 9] and got["margins"] == [2.0, 0.5, None, 3.5]
    del body["tokens"]  # an older server: the entries are all there is
    assert reference.server_greedy("http://x", [1, 2], 4)["ids"] == [5, 7, 9]


def test_markdown_shows_agreement_splits_and_facts():
    split = dict(at=3, ours=10, theirs=11, our_margin=0.2, llamacpp_margin=0.3)
    result = dict(model="tiny", new_tokens=4, prompts=[dict(text="x", tokens=3)], threads=1, isa="avx2", rounds=0,
                  formats={}, rows=[], llamacpp_reference="llama-server",
                  ids=[dict(prompt=0, weights="default", ids_vs_llamacpp="part at 3 (margins 0.2 / 0.3)",
                            top1_agreement=0.75, unexplained=0, splits=[split], ours_ids=[1])],
                  agreement={"default": dict(top1=0.75, tokens=4, splits=1, near_ties=1)},
                  facts=[dict(prompt="The capital of France is", weights="default", ours=" Paris.",
                              llamacpp=" Paris.")])
    md = gemma.markdown(result)
    assert "llama.cpp (llama-server)" in md and "| default | 0.75 | 4 | 1 | 1 |" in md
    assert "| 0 | default | 3 | 10 | 11 | 0.2 | 0.3 |" in md
    assert "| The capital of France is | default | ' Paris.' | ' Paris.' |" in md


def test_the_prompts_start_with_bos_and_continue_text():
    folder = store.cache_dir(None) / embedded.GEMMA3_270M.folder
    if not embedded.ready(folder):
        pytest.skip(f"Gemma 3 270M is not converted in {folder}")
    from engine import Tokenizer

    tok = Tokenizer(folder)
    assert tok.chat_template is None  # the base model: prompts are text to continue, no turn markers
    for text in gemma.PROMPTS:
        ids = tok.encode(text)
        assert ids[0] == tok.bos_id == 2 and ids.count(2) == 1 and tok.decode(ids[1:]) == text


def test_geglu_fp16_reads_the_gate_through_fp16_as_llamacpp_does():
    """ggml-cpu's f32 GeGLU: the gate rounded to fp16, gelu from a table of fp16 values, +-10 and past as x or 0."""
    gate = torch.linspace(-12, 12, 4801)
    up = torch.full_like(gate, 3.0)
    y = gemma.geglu_fp16(torch.cat([gate, up])[None])[0]
    exact = torch.nn.functional.gelu(gate, approximate="tanh") * up
    inside = gate.abs() < 10
    table = y[inside] / 3.0
    assert torch.equal(table.half().float(), table)  # every gelu value inside is an fp16 value
    # two fp16 roundings (the gate, then gelu's value): within ~1e-3 of the value, never beyond
    assert torch.allclose(y, exact, rtol=2e-3, atol=1e-4) and not torch.equal(y, exact)
    assert torch.equal(y[gate >= 10], gate[gate >= 10] * 3.0) and (y[gate <= -10] == 0).all()
    out = torch.empty(1, gate.numel())
    assert gemma.geglu_fp16(torch.cat([gate, up])[None], out) is out and torch.equal(out[0], y)


def test_geglu_experiment_runs_the_blocks_one_by_one_with_llamacpps_gate(tiny_files):
    model = tiny_load(tiny_files, "Q4_1", "q4+geglu-fp16")
    assert model.ops.blocks is None and model.ops.gelu_tanh_mul is gemma.geglu_fp16
    assert "GeGLU as llama.cpp" in model.load_notes[-1]


@pytest.mark.slow
def test_reference_gives_our_fp32_logits_and_greedy_ids(tiny_files):
    """transformers on the tiny F32 file, through the two calls compare() makes: the same logits as our fp32 (to
    float rounding) and the same greedy ids; compare() scores it as it scores an engine."""
    pytest.importorskip("transformers")
    path = random_gguf.path(tiny_files, "tiny", "F32")
    eng = Engine(tiny_load(tiny_files, "F32", "fp32"), max_seq_len=64)
    ref = gemma.Reference(path, eng.model.eos_ids)
    assert gemma.logit_distance(ref, eng, PROMPT) < 1e-3
    ours, _ = eng.generate(PROMPT, 12, temperature=0.0, stop_ids=[])
    theirs, _ = ref.generate(PROMPT, 12)
    assert theirs == ours
    cmp = gemma.compare(ref, PROMPT, dict(ids=ours, margins=[5.0] * 12), 12)
    assert cmp["ids_match"] and cmp["top1_agreement"] == 1.0


def test_the_reference_format_without_transformers_says_what_to_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(reference, "reference_missing", lambda: None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else find_spec(name, *a))
    with pytest.raises(SystemExit, match="pip install transformers"):
        gemma.main(["--formats", "default", "transformers", "--rounds", "0"])
