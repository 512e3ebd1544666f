"""bench/kld.py: llama-perplexity's base-file format and KL-divergence formulas, transcribed; llama.cpp itself reads
a file we write and agrees with our figures where both judge the same logits."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from bench import kld, llamacpp


def logits(m: int = 6, n_vocab: int = 501, seed: int = 0, spread: float = 4) -> torch.Tensor:
    """spread 4: rows reach below the floor (max - 16); 2: every entry above it."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n_vocab, generator=g) * spread


def test_encode_decode_keeps_each_log_probability_within_half_a_step():
    x = logits()
    rows = kld.encode(x)
    assert rows.dtype == np.uint16 and rows.shape == (6, kld.row_width(501)) and kld.row_width(501) == 506
    back = kld.decode(rows, 501)
    exact = torch.log_softmax(x.double(), -1).numpy()
    scale = rows[:, :4].view(np.float32)[:, 0]
    above = exact > exact.max(1, keepdims=True) - kld.FLOOR
    err = np.abs(back - exact)
    assert (err[above] <= (scale[:, None] / 2 + 1e-5).repeat(501, 1)[above]).all()
    # below the floor every value reads as the floor's log-probability
    floor = rows[:, :4].view(np.float32)[:, 1]
    assert np.allclose(back[~above], np.broadcast_to(floor[:, None], back.shape)[~above], atol=1e-5)


def test_a_model_against_its_own_reference_is_at_zero():
    x = logits(spread=2)
    f = kld.summary([kld.figures(x, kld.encode(x), [1, 2, 3, 4, 5, 6])])
    assert f["positions"] == 6 and f["same_top"] == 1.0
    assert abs(f["kld_mean"]) < 1e-4 and abs(f["ln_ppl_ratio"]) < 1e-4 and f["rms_dp"] < 1e-4


def test_kl_divergence_and_agreement_match_their_definitions():
    """Against torch's own KL (base entries above the floor), and a top-1 swap that must count as a split."""
    p, q = logits(seed=1), logits(seed=2)
    q[0] = p[0].clone()
    top2 = p[0].topk(2).indices
    q[0, top2[1]] = p[0, top2[0]] + 1  # the second raised above the first: a split, a small KL
    targets = [7, 8, 9, 10, 11, 12]
    parts = kld.figures(q, kld.encode(p), targets)
    lp, lq = torch.log_softmax(p.double(), -1), torch.log_softmax(q.double(), -1)
    keep = lp > lp.max(-1, keepdim=True).values - kld.FLOOR
    want = torch.where(keep, lp.exp() * (lp - lq), torch.zeros(())).sum(-1).numpy()
    assert np.allclose(parts["kld"], want, rtol=2e-3, atol=2e-4)
    assert not parts["same"][0] and parts["kld"][0] > 0
    s = kld.summary([parts, parts])
    assert s["positions"] == 12
    assert s["same_top"] == pytest.approx(2 * parts["same"].sum() / 12)
    nll = -lq[torch.arange(6), targets].numpy()
    assert s["ppl"] == pytest.approx(math.exp(nll.mean()), rel=1e-6)
    assert s["kld_99"] <= s["kld_max"] == pytest.approx(want.max(), rel=2e-3, abs=2e-4)


def test_chunks_and_the_scored_rows_are_llama_perplexitys():
    ids = list(range(1000))
    c = kld.chunks(ids, 128)
    assert len(c) == 7 and c[1][0] == 128 and all(len(x) == 128 for x in c)
    assert kld.scored(128) == slice(64, 127)  # rows 64..126 predict tokens 65..127
    with pytest.raises(ValueError, match="fewer than two chunks of n_ctx=512"):
        kld.chunks(ids, 512)


def test_the_base_file_has_llama_perplexitys_layout(tmp_path):
    x = logits(3, 11)
    rows = kld.encode(x)
    path = tmp_path / "b.kld"
    kld.write_base(path, 8, 11, [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 1, 2, 3, 4, 5, 6]], [rows, rows])
    raw = path.read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw[8:20], np.int32)
    assert (n_ctx, n_vocab, n_chunk) == (8, 11, 2)
    assert np.frombuffer(raw[20:20 + 64], np.int32).tolist()[8:11] == [9, 10, 1]
    body = np.frombuffer(raw[84:], np.uint16).reshape(2, 3, kld.row_width(11))
    assert (body[1] == rows).all()


SUMMARY = """
====== Perplexity statistics ======
Mean PPL(Q)                   :  14.062745 ±   0.371201
Mean PPL(base)                :  13.948837 ±   0.367417
Cor(ln(PPL(Q)), ln(PPL(base))):  99.71%
Mean ln(PPL(Q)/PPL(base))     :   0.008133 ±   0.001976

====== KL divergence statistics ======
Mean    KLD:   0.012036 ±   0.000432
Maximum KLD:   0.632212
99.9%   KLD:   0.387720
99.0%   KLD:   0.101443
Median  KLD:   0.006182

====== Token probability statistics ======
Mean    Δp: -0.123 ± 0.025 %
RMS Δp    :  2.912 ±  0.102 %
Same top p: 95.842 ±  0.327 %
"""


def test_llama_perplexitys_summary_is_read_as_summary_names_it():
    got = kld.parse_llamacpp(SUMMARY)
    want = dict(ppl=14.062745, ppl_base=13.948837, ln_ppl_ratio=0.008133, kld_mean=0.012036, kld_99=0.101443,
                kld_max=0.632212, rms_dp=0.02912, same_top=0.95842)
    assert got == pytest.approx(want, rel=1e-12)
    with pytest.raises(RuntimeError, match="no same_top line"):
        kld.parse_llamacpp(SUMMARY.replace("Same top p", "Other"))


@pytest.mark.slow
@pytest.mark.skipif(llamacpp.perplexity_binary() is None, reason="no llama-perplexity (scripts/build_llamacpp.sh)")
def test_llama_cpp_reads_our_reference_and_agrees_with_our_figures(tmp_path):
    """Our fp32 logits written as the base; llama.cpp's Q4_1 run of the same file scored against it; then llama.cpp's
    perplexity on the base alone must be the one our figures read from the file (the same tokens, the same rows)."""
    from engine import Engine, Tokenizer, load_model
    from engine.checkpoint import embedded

    model = load_model(None, weights="fp32", progress=lambda msg: None)
    tok = Tokenizer(model.path)
    text = (os.path.dirname(kld.__file__) + "/data/prose.txt")
    chunks = kld.chunks(tok.encode(open(text).read()), 64)[:4]  # 124 positions: it summarises 100 or more
    eng = Engine(model, max_seq_len=64)
    rows = [kld.encode(eng.logits(c)[kld.scored(64)]) for c in chunks]
    path = tmp_path / "base.kld"
    kld.write_base(path, 64, model.config.vocab_size, chunks, rows)
    theirs = kld.llamacpp_stats(llamacpp.perplexity_binary(), embedded.gguf_path(embedded.SMOLLM2), path, 64, 2,
                                llamacpp.clean_env())
    targets = [c[kld.scored(64).start + 1:] for c in chunks]
    base_nll = np.concatenate([-kld.decode(r, model.config.vocab_size)[np.arange(len(t)), t]
                               for r, t in zip(rows, targets, strict=True)])
    assert theirs["ppl_base"] == pytest.approx(math.exp(base_nll.mean()), rel=1e-4)
    # the same model's blocks on 8-bit activations: close to the reference, not equal to it
    assert 0 < theirs["kld_mean"] < 0.05 and 0.85 < theirs["same_top"] <= 1
