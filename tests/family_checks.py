"""The checks every model family passes, against transformers on a small random config of that family (engine/tiny.py
writes it as a real HF folder): tests/test_models_<family>.py call them with the family's configs.

Tolerances: fp32 throughout on both sides, so logits differ by summation order only (matmuls, softmax, the
norms), ~1e-6 of their scale; 1e-4 absolute and relative leaves room for the larger logits of a few configs
(|logits| ~ 50) without hiding a wrong formula (a missing norm or a wrong window moves them by ~1e-1).
"""
from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, load_model, speculative, weights
from engine.tiny import write_tiny_model

transformers = pytest.importorskip("transformers")

PROMPT_LEN = 40  # past every tiny config's sliding window (8 or 12), so the windows shape the result
FORMATS = [f for f in weights.FORMATS if f in weights.PANEL_FORMATS]  # every format the CPU kernels run


def reference(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def prompt(cfg, n: int = PROMPT_LEN, seed: int = 0) -> list[int]:
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def ref_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


def check_logits(folder, cfg, fused: bool) -> None:
    """Prefill logits, then the cached paths (decode steps and a verify-sized chunk), against transformers."""
    ids = prompt(cfg)
    want = ref_logits(reference(folder), ids)
    eng = Engine(load_model(folder, weights="fp32", fused=fused), max_seq_len=128)
    torch.testing.assert_close(eng.logits(ids), want, atol=1e-4, rtol=1e-4)
    with torch.inference_mode():
        eng.prefill(ids[:9])
        steps = [eng.decode(torch.tensor([t]))[0] for t in ids[9:30]]
        chunk = eng.chunk(torch.tensor([ids[30:]]))[0]
    torch.testing.assert_close(torch.stack(steps)[:-1], want[9:29], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chunk, want[30:], atol=1e-4, rtol=1e-4)


def check_formats_match_their_twins(folder, cfg) -> None:
    """Every CPU format's kernels against the same format's torch twins (the same weights and the same recipe for
    the activations, so only fp32 summation order differs: 1e-4 of the logits' spread). The decode steps run
    another path than the twins' prefill (attention over the cache, one token at a time): where int8 quantizes an
    activation sitting on a rounding boundary, that ulp flips it by a step (1/127 of its block's largest), which
    moves logits by a few % of their spread: 0.1 for int8's steps. q4's 16-bit activations flip by 1/32767 of the
    block's largest, and there on every path, prefill included (the twin folds its exact integer block sums in
    float64, the kernel in fp32): 0.1 * 127 / 32767 = 4e-4 of the spread (measured up to 2.2e-4 on these configs).
    Every format on 8-bit activations (int8, q4_0, q5_0 per block of 32; the K-quants' q8_k per 256) can flip one
    the same way in a prefill too, where the twin sums the blocks in another order than the kernel's FMAs: 0.1
    there as well (measured 1.5e-2 for q5_k on llama's config, flips in q4_0 / q5_0 on qwen2's and mistral's)."""
    ids = prompt(cfg)
    for fmt in FORMATS:
        fused = load_model(folder, weights=fmt)
        if fused.ops.name != "fused":
            return  # no CPU kernels here: every path is the twins, checked against transformers above
        activations = weights.get(fmt).cpu_activations
        twin = Engine(load_model(folder, weights=fmt, fused=False), 128).logits(ids)
        got = Engine(fused, 128).logits(ids)
        prefill_bound = {"int8": 0.1, "int16": 4e-4, "q8_k": 0.1}.get(activations, 1e-4)
        assert (got - twin).abs().max().item() <= prefill_bound * twin.std().item() + 1e-5, fmt
        with torch.inference_mode():  # the native block loop's decode steps against the twins' prefill
            eng = Engine(fused, 128)
            eng.prefill(ids[:20])
            steps = torch.stack([eng.decode(torch.tensor([t]))[0] for t in ids[20:]])
        bound = {"int8": 0.1, "int16": 4e-4, "q8_k": 0.1}.get(activations, 1e-4)
        assert (steps[:-1] - twin[20:-1]).abs().max().item() <= bound * twin.std().item() + 1e-5, fmt


def check_greedy(folder, cfg, n: int = 32) -> None:
    """32 greedy tokens in fp32: ours (a decode step per token on the fused path) and transformers' argmax over
    a full forward per token."""
    ref = reference(folder)
    ids = prompt(cfg, 24, seed=5)
    want = list(ids)
    for _ in range(n):
        want.append(int(ref_logits(ref, want)[-1].argmax()))
    got, _ = Engine(load_model(folder, weights="fp32"), 128).generate(ids, n, stop_ids=[])
    assert got == want[len(ids):]


def check_speculative(folder, cfg) -> None:
    """Every speculative mode at temperature 0 gives the plain output, token for token."""
    eng = Engine(load_model(folder, weights="fp32"), 160)
    ids = prompt(cfg, 24, seed=7)
    ids = ids + ids[:12]  # a repeat, so the n-gram drafter has something to propose
    want, _ = eng.generate(ids, 40, stop_ids=[])
    half = list(range(0, cfg.n_layers, 2))
    drafters = {"ngram": speculative.NgramDrafter(), "self-draft": speculative.self_drafter(eng, "int8"),
                "layer-skip": speculative.LayerSkipDrafter(eng, layers=half),
                "layer-skip calibrated": speculative.LayerSkipDrafter(eng)}
    for name, drafter in drafters.items():
        got, _ = speculative.generate(eng, drafter, ids, k=4, max_new_tokens=40, stop_ids=[])
        assert got == want, name


def all_full(folder, into, by_layer_types: bool) -> None:
    """A copy of the folder whose config attends every key in every layer: the windows' effect, measured."""
    into.mkdir()
    for f in folder.iterdir():
        (into / f.name).write_bytes(f.read_bytes())
    config = json.loads((into / "config.json").read_text())
    if by_layer_types:
        config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    else:
        config["sliding_window"] = None
    (into / "config.json").write_text(json.dumps(config))


def check_windows_matter(folder, cfg, tmp_path, by_layer_types: bool = True) -> None:
    """The sliding windows change the logits here (so the checks above would catch a wrong or missing window).
    by_layer_types: the reference takes layer_types (Gemma, Qwen); else a config without a window (Mistral, Phi-3)."""
    ids = prompt(cfg)
    full = tmp_path / "all-full"
    all_full(folder, full, by_layer_types)
    gap = (ref_logits(reference(folder), ids) - ref_logits(reference(full), ids)).abs().max().item()
    assert gap > 1e-2, gap


def run_all(cfg, tmp_path, seed: int = 1):
    folder = write_tiny_model(tmp_path / cfg.model_type, cfg, seed=seed)
    check_logits(folder, cfg, fused=False)
    check_logits(folder, cfg, fused=True)
    return folder
