"""Quality of each weight format against fp32 on the same model, measured, never assumed.

Per format, on the embedded default model: the largest |logit difference| from fp32 and top-1 agreement with
fp32 at every position of a fixed text (bench/data/prose.txt, ~1000 tokens of plain English prose written
for this benchmark, one prefill pass each), the text's perplexity, and whether greedy decoding gives fp32's
tokens for 3 chat prompts x 128 tokens (and where it first parts if not).

    python -m bench.quality [--formats fp32 fp16 int8 q4] [--out bench/results] [--exact-activations]

--exact-activations adds, per quantized format, a row of the same blocks against fp32 activations (the torch twin
that dequantizes them): the difference between the two rows is what the kernels' activation recipe costs.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import markdown_table, provenance, write_results
from engine import Engine, Tokenizer, load_model, weights
from engine.ops import ref
import torch

TEXT = Path(__file__).parent / "data" / "prose.txt"
PROMPTS = ["Write a short paragraph about why the sky is blue.",
           "Write a Python function that checks whether a string is a palindrome.",
           "Explain in three sentences how a bicycle stays upright."]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


@torch.inference_mode()
def measure(fmt: str, ids: list[int], prompts: list[list[int]], new_tokens: int,
            exact: bool = False) -> tuple[torch.Tensor, list, dict]:
    model = load_model(None, weights=fmt, fused=not exact, progress=lambda msg: None)
    if exact:  # the same blocks dequantized, against fp32 activations
        linear = {f: ref.matmul_dequantized if weights.get(f).quantized else m for f, m in model.ops.linear.items()}
        model.use_ops(dataclasses.replace(model.ops, linear=linear))
    eng = Engine(model, max_seq_len=max(len(ids), max(map(len, prompts)) + new_tokens) + 8)
    logits = eng.logits(ids)  # [n, V]
    greedy = [eng.generate(p, new_tokens, stop_ids=[])[0] for p in prompts]
    nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    info = dict(weights=f"{fmt} (fp32 activations)" if exact else fmt, head=model.lm_head.weight.fmt,
                weight_mb=model.weight_bytes / 1e6,
                bits_per_weight=weights.BITS[fmt], perplexity=math.exp(nll.item()), kernels=eng.kernel_status)
    return logits, greedy, info


def bench(args) -> dict:
    tok = Tokenizer(load_model(None, weights="fp32", progress=lambda msg: None).path)
    ids = tok.encode(TEXT.read_text())
    prompts = [tok.encode_chat(p) for p in PROMPTS]
    base_logits, base_greedy, _ = measure("fp32", ids, prompts, args.new_tokens)
    rows = []
    runs = [(f, exact) for f in args.formats for exact in (False, True)
            if not exact or (args.exact_activations and weights.get(f).quantized)]
    for fmt, exact in runs:
        logits, greedy, info = measure(fmt, ids, prompts, args.new_tokens, exact)
        parts = [first_difference(g, b) for g, b in zip(greedy, base_greedy, strict=True)]
        rows.append(dict(**info, max_abs_logit_diff=(logits - base_logits).abs().max().item(),
                         top1_agreement=(logits.argmax(-1) == base_logits.argmax(-1)).float().mean().item(),
                         greedy_equal=f"{sum(p is None for p in parts)}/{len(parts)}",
                         greedy_first_difference=", ".join("-" if p is None else str(p) for p in parts)))
        print(rows[-1], flush=True)
    return dict(model="SmolLM2-135M-Instruct (embedded default)", text=TEXT.name, text_tokens=len(ids),
                greedy_prompts=PROMPTS, new_tokens=args.new_tokens, rows=rows)


def markdown(result: dict) -> str:
    head = (f"Weight formats against fp32 on {result['model']}: logits over {result['text']} "
            f"({result['text_tokens']} tokens, teacher-forced), greedy decoding of {len(result['greedy_prompts'])} "
            f"chat prompts x {result['new_tokens']} tokens (first differing position per prompt, - if none).\n\n")
    cols = ["weights", "head", "bits_per_weight", "weight_mb", "max_abs_logit_diff", "top1_agreement", "perplexity",
            "greedy_equal", "greedy_first_difference"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=["fp32", "fp16", "int8", "q4"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--exact-activations", action="store_true", help="also each quantized format on fp32 activations")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    result = bench(args)
    result["provenance"] = provenance("cpu")
    md = markdown(result)
    write_results(args.out, "quality-cpu", result, md)
    print(md)


if __name__ == "__main__":
    main()
