import pytest
import torch

from engine.sampling import SamplingParams, mask_logits, probs, sample


def test_greedy_is_argmax_and_one_hot():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    params = SamplingParams(temperature=0)
    assert sample(logits, params, None)[0].tolist() == [1]
    assert probs(logits, params).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]])
    kept = torch.isfinite(mask_logits(logits, top_k=2, top_p=1.0))
    assert kept.tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_smallest_set_reaching_p():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = p.log()
    # 0.5 < 0.7 so the second token is needed; 0.5 + 0.3 >= 0.7 so the third is not
    assert torch.isfinite(mask_logits(logits, 0, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(mask_logits(logits, 0, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(mask_logits(logits, 0, 0.96)).tolist() == [[True, True, True, True]]
    # order in the vocabulary does not matter
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.isfinite(mask_logits(logits[:, perm], 0, 0.7)).tolist() == [[False, True, False, True]]


def test_probs_renormalise_after_masks():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    q = probs(logits, SamplingParams(temperature=0.7, top_k=10, top_p=0.9))
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    assert ((q > 0).sum(-1) <= 10).all()


def test_sampling_reproducible_per_seed_and_matches_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    params = SamplingParams(temperature=1.0, seed=7)

    def draw(p):
        g = p.generator("cpu")
        return [sample(logits, p, g)[0].item() for _ in range(4000)]

    a, b = draw(params), draw(params)
    assert a == b
    assert a != draw(SamplingParams(temperature=1.0, seed=8))
    freq = torch.bincount(torch.tensor(a), minlength=4).float() / len(a)
    # 4000 draws: the standard error of each frequency is below 0.008, so 0.03 is a > 3.5 sigma bound
    torch.testing.assert_close(freq, logits.softmax(-1)[0], atol=0.03, rtol=0)


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
])
def test_bad_sampling_settings_name_the_value(kw, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kw)
