"""Our quantizers against llama.cpp's on the same weights: a random-weight K-quant file (bench/random_gguf.py
kquant_file: llama-quantize from a random F16 file) holds llama.cpp's blocks, and its random weights can be made
again tensor by tensor (random_tensor, rounded to F16 as the file was). Each of the file's quantized tensors in the
layers asked for is dequantized as stored and quantized again by our format of the same GGUF type; the table gives
each type's error relative to the weights' size, plain and weighted by |w| (the weighting llama.cpp's Q2_K to
Q5_K quantizers fit to without an importance matrix).

    python -m bench.quantizer_error --kind Q2_K --name quantizer-error-q2k

Gaussian weights are not a trained model's: this compares the two quantizers' choices on one distribution;
bench/quality.py measures what a format does to a model.
"""
from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench import random_gguf
from bench.common import markdown_table, provenance, write_results
from engine import weights


def tensor_errors(file: Path, shape: str, layers: list[int]) -> list[dict]:
    """Per quantized tensor of `layers`: its GGUF type and the squared errors of llama.cpp's blocks and ours."""
    from gguf import GGUFReader

    s = {**random_gguf.SHAPES, **random_gguf.BIG_SHAPES}[shape]
    made = {name: (i, dims, role, heads) for i, (name, dims, role, heads)
            in enumerate(random_gguf.hf_tensors(s, s.get("vocab", random_gguf.VOCAB)))}
    prefixes = tuple(f"blk.{i}." for i in layers)
    rows = []
    for t in GGUFReader(file).tensors:
        fmt = weights.BY_GGUF.get(t.tensor_type.name)
        if fmt is None or not t.name.startswith(prefixes):
            continue
        w = random_gguf.file_tensor(*made[t.name])
        w = torch.from_numpy(w.astype(np.float16).astype(np.float32))  # the F16 file's values
        out, n_in = w.shape
        raw = torch.from_numpy(np.array(t.data)).view(torch.uint8).reshape(out, -1)
        theirs = weights.dequantize(weights.get(fmt).from_gguf(raw, out, n_in))
        ours = weights.dequantize(weights.quantize(w, fmt))
        a = w.abs()
        rows.append(dict(tensor=t.name, type=t.tensor_type.name, format=fmt, size=(w * w).sum().item(),
                         weighted_size=(a * w * w).sum().item(),
                         llamacpp=((theirs - w) ** 2).sum().item(), ours=((ours - w) ** 2).sum().item(),
                         llamacpp_weighted=(a * (theirs - w) ** 2).sum().item(),
                         ours_weighted=(a * (ours - w) ** 2).sum().item()))
    return rows


def by_type(rows: list[dict]) -> list[dict]:
    sums = defaultdict(lambda: defaultdict(float))
    for r in rows:
        t = sums[r["type"]]
        t["tensors"] += 1
        for k in ("size", "weighted_size", "llamacpp", "ours", "llamacpp_weighted", "ours_weighted"):
            t[k] += r[k]
    out = []
    for name, t in sums.items():
        ours, theirs = (t["ours"] / t["size"]) ** 0.5, (t["llamacpp"] / t["size"]) ** 0.5
        ours_w, theirs_w = (t["ours_weighted"] / t["weighted_size"]) ** 0.5, \
            (t["llamacpp_weighted"] / t["weighted_size"]) ** 0.5
        out.append(dict(type=name, format=weights.BY_GGUF[name], tensors=int(t["tensors"]), ours_rel_rms=ours,
                        llamacpp_rel_rms=theirs, ours_over_llamacpp=ours / theirs, ours_weighted_rel_rms=ours_w,
                        llamacpp_weighted_rel_rms=theirs_w, ours_over_llamacpp_weighted=ours_w / theirs_w))
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="Q2_K", choices=random_gguf.KQUANT_KINDS)
    p.add_argument("--shape", default="1.5B", choices=sorted(random_gguf.BIG_SHAPES))
    p.add_argument("--layers", type=int, nargs="+", default=[0, 1, 13, 27])
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-kquant"),
                   help="where the random file is (made there if missing, as bench.paired_decode's)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    file = random_gguf.kquant_file(args.shape, Path(args.folder), kind=args.kind)
    rows = tensor_errors(file, args.shape, args.layers)
    table = by_type(rows)
    result = dict(file=file.name, shape=args.shape, kind=args.kind, layers=args.layers, types=table, tensors=rows,
                  provenance=provenance("cpu"))
    md = (f"Our quantizers against llama.cpp's (llama-quantize, no importance matrix) on the same weights: the "
          f"quantized tensors of layers {', '.join(map(str, args.layers))} of {file.name} (random Gaussian "
          f"weights, std {random_gguf.STD}), each type's error relative to the weights' size, plain and weighted "
          "by |w|; below 1 in ours_over_llamacpp: ours closer.\n\n")
    md += markdown_table(table, list(table[0]) if table else ["type"])
    write_results(args.out, args.name or f"quantizer-error-{args.kind.lower()}", result, md)
    print(md)
    return result


if __name__ == "__main__":
    main()
