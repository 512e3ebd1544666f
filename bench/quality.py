"""Quality of each weight format against fp32 on the same model, measured, never assumed.

Per format, on the embedded default model: the largest |logit difference| from fp32 and top-1 agreement with
fp32 at every position of a fixed text (bench/data/prose.txt, ~1000 tokens of plain English prose written
for this benchmark, one prefill pass each), the text's perplexity, and whether greedy decoding gives fp32's
tokens for 3 chat prompts x 128 tokens (and where it first parts if not).

    python -m bench.quality [--formats fp32 fp16 int8 q4] [--out bench/results] [--exact-activations]

--exact-activations adds, per quantized format, a row of the same blocks against fp32 activations (the torch twin
that dequantizes them): the difference between the two rows is what the kernels' activation recipe costs.

--llamacpp adds llama.cpp's own numerics as a second reference: its greedy ids on the model's GGUF file (Q4_1, the
blocks q4 and q4_a8 run; llama-server with an f32 KV cache and flash attention off, bench/reference.py) for
the same chat prompts, and per format our teacher-forced top-1 on those ids, each split with both sides' top-1
margins (a near-tie either engine may break either way), and where our free-running greedy ids first part from
llama.cpp's.

--kld adds the distributions' distance from the exact model, llama.cpp's way (bench/kld.py): over chunks of
bench/data/prose.txt (n_ctx 128) and long.txt (n_ctx 512), the second half of each chunk scored, per format our
KL divergence from fp32, perplexity and top-1 agreement, and llama.cpp's on the same tokens against the same
reference file (llama-perplexity --kl-divergence; the model's Q4_1 file, which it runs against 8-bit activation
blocks, and the same file requantized to F32 by llama-quantize: the reference's own floor). --mixes Q5_K_M ...
adds the model's weights in llama.cpp's own mixes (llama-quantize --allow-requantize from the model's file), each
file run by both engines as it is: ours loaded as the app loads a file (each tensor in its own blocks; SmolLM2's
576-wide rows are not whole super-blocks, so a Q5_K mix stores most of them as Q5_1, a Q4_K mix as Q5_0).
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
KLD_TEXTS = [(TEXT, 128), (Path(__file__).parent / "data" / "long.txt", 512)]  # (text, n_ctx): prose, docs + code
PROMPTS = ["Write a short paragraph about why the sky is blue.",
           "Write a Python function that checks whether a string is a palindrome.",
           "Explain in three sentences how a bicycle stays upright."]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


@torch.inference_mode()
def measure(fmt: str, ids: list[int], prompts: list[list[int]], new_tokens: int,
            exact: bool = False, theirs: list[dict] | None = None) -> tuple[torch.Tensor, list, dict]:
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
    if theirs is not None:
        info.update(versus_llamacpp(eng, prompts, greedy, theirs))
    return logits, greedy, info


def versus_llamacpp(eng: Engine, prompts: list[list[int]], greedy: list[list[int]], theirs: list[dict]) -> dict:
    """Our teacher-forced top-1 on llama.cpp's greedy ids over every prompt, the splits that are not near-ties,
    and where our own greedy ids first part from llama.cpp's."""
    from bench import reference

    splits, tokens = [], 0
    for prompt, ref_ids in zip(prompts, theirs, strict=True):
        _, s = reference.agreement(eng, prompt, ref_ids)
        splits += s
        tokens += len(ref_ids["ids"])
    parts = [first_difference(g, t["ids"]) for g, t in zip(greedy, theirs, strict=True)]
    return dict(llamacpp_top1=1 - len(splits) / tokens, llamacpp_splits=len(splits),
                llamacpp_unexplained=sum(not reference.near_tie(x) for x in splits),
                llamacpp_greedy_first_difference=", ".join("-" if p is None else str(p) for p in parts))


def llamacpp_ids(prompts: list[list[int]], new_tokens: int) -> list[dict]:
    """llama.cpp's greedy ids (and top-1 margins) for each prompt, on the default model's own GGUF file."""
    from bench import reference
    from engine.checkpoint import embedded

    gguf_file = embedded.gguf_path(embedded.SMOLLM2, progress=lambda msg: None)
    with reference.reference(gguf_file, torch.get_num_threads()) as greedy:
        return [greedy(p, new_tokens) for p in prompts]


def bench(args) -> dict:
    tok = Tokenizer(load_model(None, weights="fp32", progress=lambda msg: None).path)
    ids = tok.encode(TEXT.read_text())
    prompts = [tok.encode_chat(p) for p in PROMPTS]
    theirs = llamacpp_ids(prompts, args.new_tokens) if args.llamacpp else None
    base_logits, base_greedy, _ = measure("fp32", ids, prompts, args.new_tokens)
    rows = []
    runs = [(f, exact) for f in args.formats for exact in (False, True)
            if not exact or (args.exact_activations and weights.get(f).quantized)]
    for fmt, exact in runs:
        logits, greedy, info = measure(fmt, ids, prompts, args.new_tokens, exact, theirs)
        parts = [first_difference(g, b) for g, b in zip(greedy, base_greedy, strict=True)]
        rows.append(dict(**info, max_abs_logit_diff=(logits - base_logits).abs().max().item(),
                         top1_agreement=(logits.argmax(-1) == base_logits.argmax(-1)).float().mean().item(),
                         greedy_equal=f"{sum(p is None for p in parts)}/{len(parts)}",
                         greedy_first_difference=", ".join("-" if p is None else str(p) for p in parts)))
        print(rows[-1], flush=True)
    return dict(model="SmolLM2-135M-Instruct (embedded default)", text=TEXT.name, text_tokens=len(ids),
                greedy_prompts=PROMPTS, new_tokens=args.new_tokens, rows=rows,
                llamacpp=None if theirs is None else dict(reference="llama-server on the model's Q4_1 GGUF file, f32 "
                                                          "KV cache, flash attention off", ids=theirs),
                kld=kld_table(tok, args.formats, args.work, args.mixes) if args.kld else None)


def kld_table(tok: Tokenizer, formats: list[str], work: Path, mixes: list[str] = ()) -> dict:
    """Per text and format, ours and llama.cpp's distance from the exact model on the same chunks (bench/kld.py).
    The reference is our fp32 (the file's exact values); fp32's own row is the base file's rounding."""
    from bench import kld, llamacpp
    from engine.checkpoint import embedded

    work.mkdir(parents=True, exist_ok=True)
    gguf_file = embedded.gguf_path(embedded.SMOLLM2, progress=lambda msg: None)
    texts = []
    for path, n_ctx in KLD_TEXTS:
        texts.append(dict(text=path.name, n_ctx=n_ctx, chunks=kld.chunks(tok.encode(path.read_text()), n_ctx),
                          base=work / f"{path.stem}-{n_ctx}.kld"))
    exe, quantize = llamacpp.perplexity_binary(), llamacpp.quantize_binary()
    if mixes and quantize is None:
        raise SystemExit(f"--mixes needs llama-quantize ({llamacpp.prefix() / 'bin'}): scripts/build_llamacpp.sh "
                         "builds it")
    files = {mix: llamacpp.requantized(quantize, gguf_file, mix, work) for mix in mixes}
    base_rows = {}
    runs = [("fp32", None), *((f, None) for f in formats if f != "fp32"), *((None, m) for m in mixes)]
    for fmt, mix in runs:
        model = load_model(files[mix] if mix else None, weights=fmt, progress=lambda msg: None)
        fmt = fmt or f"{mix} file, its own blocks ({model_mix(model)})"
        eng = Engine(model, max_seq_len=max(n for _, n in KLD_TEXTS))
        for t in texts:
            rows = [eng.logits(c)[kld.scored(t["n_ctx"])] for c in t["chunks"]]
            if fmt == "fp32":
                base_rows[t["text"]] = [kld.encode(r) for r in rows]
                kld.write_base(t["base"], t["n_ctx"], rows[0].shape[1], t["chunks"], base_rows[t["text"]])
            parts = [kld.figures(r, b, c[kld.scored(t["n_ctx"]).start + 1:])
                     for r, b, c in zip(rows, base_rows[t["text"]], t["chunks"], strict=True)]
            t.setdefault("rows", []).append(dict(engine="ours", weights=fmt, **kld.summary(parts)))
            print(t["text"], t["rows"][-1], flush=True)
    theirs = [] if exe is None else [("Q4_1 (the file)", gguf_file)]
    if exe is not None and quantize is not None:
        theirs.append(("F32 (llama-quantize from the file)", llamacpp.requantized(quantize, gguf_file, "F32", work)))
    theirs += [] if exe is None else [(f"{mix} file", path) for mix, path in files.items()]
    for t in texts:
        for name, model in theirs:
            t["rows"].append(dict(engine="llama.cpp", weights=name, **kld.llamacpp_stats(
                exe, model, t["base"], t["n_ctx"], torch.get_num_threads(), llamacpp.clean_env())))
            print(t["text"], t["rows"][-1], flush=True)
    return dict(reference="our fp32 logits (the file's exact values)", llamacpp_missing=llamacpp.perplexity_missing(),
                texts=[{k: v for k, v in t.items() if k not in ("chunks", "base")} | dict(tokens=len(t["chunks"]) *
                                                                                         t["n_ctx"]) for t in texts])


def model_mix(model) -> str:
    """What a loaded file's tensors run in, as its load note says: "Q5_1 as q5_1 (166); Q8_0 as int8 (15); ..."."""
    note = next((n for n in model.load_notes if "runs the file's own blocks" in n), "")
    return note.split(": ", 2)[-1] if note else model.weight_format


def markdown(result: dict) -> str:
    head = (f"Weight formats against fp32 on {result['model']}: logits over {result['text']} "
            f"({result['text_tokens']} tokens, teacher-forced), greedy decoding of {len(result['greedy_prompts'])} "
            f"chat prompts x {result['new_tokens']} tokens (first differing position per prompt, - if none).\n\n")
    cols = ["weights", "head", "bits_per_weight", "weight_mb", "max_abs_logit_diff", "top1_agreement", "perplexity",
            "greedy_equal", "greedy_first_difference"]
    md = head + markdown_table(result["rows"], cols)
    if result.get("llamacpp"):
        md += (f"\nAgainst llama.cpp's own numerics ({result['llamacpp']['reference']}): teacher-forced top-1 on its "
               f"greedy ids for the same prompts, the splits (of them, not near-ties: both sides' top-1 margins >= "
               f"1 logit), and where our greedy ids first part from its.\n\n")
        md += markdown_table(result["rows"], ["weights", "head", "llamacpp_top1", "llamacpp_splits",
                                               "llamacpp_unexplained", "llamacpp_greedy_first_difference"])
    if result.get("kld"):
        k = result["kld"]
        md += ("\nDistance from the exact model, llama.cpp's way (bench/kld.py; reference: " + k["reference"] +
               "): chunks of n_ctx tokens from an empty cache, the second half of each scored; KL divergence of each "
               "next-token distribution from the reference's, perplexity on the text, top-1 agreement (llama.cpp's "
               "\"same top p\") and the RMS of the text token's probability difference (Δp). llama.cpp: "
               "llama-perplexity --kl-divergence on the same tokens against the same reference file, f32 KV cache, "
               "flash attention off" + (f" (not run: {k['llamacpp_missing']})" if k.get("llamacpp_missing") else "")
               + ".\n\n")
        for t in k["texts"]:
            md += f"{t['text']}, n_ctx {t['n_ctx']}, {t['rows'][0]['positions']} positions scored:\n\n"
            md += markdown_table(t["rows"], ["engine", "weights", "kld_mean", "kld_99", "kld_max", "same_top", "ppl",
                                             "ln_ppl_ratio", "rms_dp"]) + "\n"
    return md


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=["fp32", "fp16", "int8", "q4"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--exact-activations", action="store_true", help="also each quantized format on fp32 activations")
    p.add_argument("--llamacpp", action="store_true", help="also top-1 on llama.cpp's greedy ids (llama-server)")
    p.add_argument("--kld", action="store_true",
                   help="also each format's KL divergence from fp32, and llama.cpp's on the same tokens")
    p.add_argument("--mixes", nargs="*", default=[], metavar="TYPE",
                   help="with --kld, also the model requantized by llama-quantize to these file types (Q5_K_M ...), "
                        "each file run as it is by both engines")
    p.add_argument("--work", type=Path, default=Path("/tmp/decodescope-kld"),
                   help="where --kld writes its reference files and llama.cpp's F32 file")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="quality-cpu")
    args = p.parse_args(argv)
    result = bench(args)
    result["provenance"] = provenance("cpu")
    md = markdown(result)
    write_results(args.out, args.name, result, md)
    print(md)


if __name__ == "__main__":
    main()
