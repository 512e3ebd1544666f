"""What a load holds at its peak, as a user starts one: `load_model(path, weights=...)` in a fresh process per run,
its peak RSS (VmHWM, the load's transients included) and its RSS once loaded, against the bytes of the files it
read and the RSS of a process that only imported engine and loaded its CPU kernels (`bare`); the load's time
beside them. For GGUF files and HF folders alike; --random makes an HF folder of a real model's shape with random
bf16 weights (safetensors, as the Hub ships them) and the byte tokenizer of engine/tiny.py.

The runs go format by format, rotated each repeat, so a box whose state drifts weighs on all of them alike.

    python -m bench.load_memory --random 0.5B --formats q4 int8 fp32 --name load-memory-cpu
    python -m bench.load_memory --paths gemma-3-270m-q4_k_m.gguf --formats default --name load-memory-cpu
    python -m bench.load_memory --random 7B --formats default --decode 8 --repeats 1   # a 15 GB bf16 folder

--decode N also times N greedy steps after the load (decode tok/s), so a row says the model runs, not just loads.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.timing import proc_status

RANDOM = {  # HF config.json keys of the shapes --random makes
    "0.5B": dict(model_type="qwen2", like="Qwen2.5-0.5B", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                 num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "7B": dict(model_type="qwen2", like="Qwen2.5-7B", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
               num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}
CHUNK_BYTES = 64 << 20  # a random tensor is made and written this many fp32 bytes of rows at a time


def status_mb(key: str) -> float:
    """This process's /proc/self/status figure in MB (1e6 bytes, as the files' sizes)."""
    return proc_status(key) / 1e6


def child(path: str, fmt: str, decode: int = 0) -> dict:
    import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
    from engine import Engine, load_model, ops

    ops.select("cpu", True, 128)  # the kernels built or loaded before the clock starts
    bare = status_mb("VmHWM")
    start = time.perf_counter()
    model = load_model(path, weights=None if fmt == "default" else fmt, progress=lambda s: None)
    load_s = time.perf_counter() - start
    out = dict(bare_mb=bare, peak_mb=status_mb("VmHWM"), after_mb=status_mb("VmRSS"), load_s=load_s,
               weights=sorted({s.fmt for m in model.linears() for s in m.weight.segments}),
               kernels=model.ops.name, notes=model.load_notes)
    if decode:  # greedy steps after a 16-token prompt: the steps after the first token, over their time
        _, stats = Engine(model, max_seq_len=64 + decode).generate(list(range(3, 19)), decode, stop_ids=[])
        out.update(decode_tok_s=stats.summary()["decode_tok_s"], peak_after_decode_mb=status_mb("VmHWM"))
    return out


def in_child(path: Path, fmt: str, decode: int = 0) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.load_memory", "--child", str(path), fmt, str(decode)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.load_memory child {path} {fmt} failed (exit {done.returncode}): "
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def random_folder(shape: str, folder: Path) -> Path:
    """An HF folder of `shape` with random bf16 weights (made once in `folder`), written a chunk of rows at a time:
    a 7B's is 15 GB, more than this machine could hold in fp32 to write it whole."""
    out = folder / f"random-{shape}-bf16"
    if (out / "model.safetensors").is_file():
        return out
    from engine.tiny import tiny_config, write_model_files

    keys = {k: v for k, v in RANDOM[shape].items() if k not in ("model_type", "like")}
    cfg = tiny_config(RANDOM[shape]["model_type"], **keys)
    write_model_files(out, cfg)
    part = out / "model.safetensors.partial"
    write_random_safetensors(part, cfg)
    part.rename(out / "model.safetensors")
    return out


def write_random_safetensors(path: Path, cfg, std: float = 0.02, seed: int = 0) -> None:
    """safetensors of every tensor cfg needs, bf16, random as engine/tiny.py random_weights makes them (norms ~1,
    the embedding ~N(0, 1), the rest ~N(0, std)): the header, then each tensor made and written CHUNK_BYTES of rows
    at a time."""
    import math

    import torch

    from engine.checkpoint.hf import expected_shapes
    from engine.tiny import random_tensor

    shapes = expected_shapes(cfg)
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 2 * math.prod(shape)
        header[name] = dict(dtype="BF16", shape=list(shape), data_offsets=[at, at + n])
        at += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    g = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name, shape in shapes.items():
            row = math.prod(shape[1:])
            step = max(1, CHUNK_BYTES // (4 * row))
            for r0 in range(0, shape[0], step):
                x = random_tensor(cfg, name, (min(step, shape[0] - r0), *shape[1:]), g, std)
                f.write(x.to(torch.bfloat16).view(torch.int16).numpy().tobytes())


def file_bytes(path: Path) -> int:
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def rows(targets: list[tuple[str, Path]], formats: list[str], repeats: int, decode: int = 0) -> list[dict]:
    runs: dict[tuple[int, int], list[dict]] = {}
    for rep in range(repeats):
        for t in range(len(targets)):
            order = [*formats[rep % len(formats):], *formats[:rep % len(formats)]]
            for fmt in order:
                runs.setdefault((t, formats.index(fmt)), []).append(in_child(targets[t][1], fmt, decode))
    out = []
    for (t, f), got in sorted(runs.items()):
        name, path = targets[t]
        size, med = file_bytes(path), statistics.median
        peak, after = max(r["peak_mb"] for r in got), med(r["after_mb"] for r in got)
        bare = med(r["bare_mb"] for r in got)
        out.append(dict(model=name, format=formats[f], weights=" ".join(got[0]["weights"]),
                        kernels=got[0]["kernels"], file_mb=size / 1e6, bare_mb=bare, peak_mb=peak, after_mb=after,
                        transient_mb=peak - after, peak_over_file=(peak - bare) * 1e6 / size,
                        load_s=med(r["load_s"] for r in got), load_s_runs=[r["load_s"] for r in got],
                        peak_mb_runs=[r["peak_mb"] for r in got], notes=got[0]["notes"]))
        if decode:
            out[-1].update(decode_tok_s=med(r["decode_tok_s"] for r in got),
                           peak_after_decode_mb=max(r["peak_after_decode_mb"] for r in got))
    return out


def markdown(result: dict) -> str:
    from bench.common import markdown_table

    head = ("What a load holds at its peak: `load_model(path, weights=format)` in a fresh process per run, "
            f"{result['repeats']} runs of each (formats rotated each repeat); peak: VmHWM after the load (the "
            "largest of the runs), after: RSS once loaded (median), bare: a process that imported engine and loaded "
            "its CPU kernels, transient: peak - after; peak_over_file: (peak - bare) over the bytes of the files "
            "read. load_s: the median load. Random folders: bf16 safetensors of the shape named, random values.")
    cols = ["model", "format", "weights", "file_mb", "bare_mb", "peak_mb", "after_mb", "transient_mb",
            "peak_over_file", "load_s"]
    if result.get("decode"):
        head += (f" decode_tok_s: {result['decode']} greedy steps after each load (the median run), and the peak "
                 "RSS once they ran.")
        cols += ["decode_tok_s", "peak_after_decode_mb"]
    head += "\n\n"
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        path, fmt, decode = sys.argv[2:5]
        print(json.dumps(child(path, fmt, int(decode))))
        return
    from bench.common import run_and_save

    p = argparse.ArgumentParser(description="peak RSS and time of a load, GGUF files and HF folders")
    p.add_argument("--random", nargs="*", default=[], choices=list(RANDOM), help="random bf16 HF folders to make")
    p.add_argument("--paths", nargs="*", default=[], type=Path, help="GGUF files or HF folders to load as they are")
    p.add_argument("--formats", nargs="+", default=["default"], help="weights= of each load ('default': none asked)")
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-load-memory"),
                   help="where --random folders are made")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--decode", type=int, default=0, help="also time this many greedy steps after each load")
    p.add_argument("--name", default="load-memory-cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    targets = [(f"random {s} ({RANDOM[s]['like']}'s shape)", random_folder(s, Path(args.folder)))
               for s in args.random]
    targets += [(path.name, path) for path in args.paths]
    if not targets:
        p.error("nothing to load: give --random SHAPE or --paths PATH")

    def run(save):
        out = dict(repeats=args.repeats, formats=args.formats, decode=args.decode,
                   rows=rows(targets, args.formats, args.repeats, args.decode))
        save(out)
        return out

    run_and_save(args.out, args.name, "cpu", run, markdown)


if __name__ == "__main__":
    main()
