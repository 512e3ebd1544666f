"""What a load holds at its peak, as a user starts one: `load_model(path, weights=...)` in a fresh process per run,
its peak RSS (VmHWM, the load's transients included) and its RSS once loaded, against the bytes of the files it
read and the RSS of a process that only imported engine and loaded its CPU kernels (`bare`); the load's time
beside them. For GGUF files and HF folders alike; --random makes an HF folder of a real model's shape with random
bf16 weights (safetensors, as the Hub ships them) and the byte tokenizer of engine/tiny.py.

The runs go format by format, rotated each repeat, so a box whose state drifts weighs on all of them alike.

    python -m bench.load_memory --random 0.5B --formats q4 int8 fp32 --name load-memory-cpu
    python -m bench.load_memory --paths gemma-3-270m-q4_k_m.gguf --formats default --name load-memory-cpu
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
}


def status_mb(key: str) -> float:
    """This process's /proc/self/status figure in MB (1e6 bytes, as the files' sizes)."""
    return proc_status(key) / 1e6


def child(path: str, fmt: str) -> dict:
    import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
    from engine import load_model, ops

    ops.select("cpu", True, 128)  # the kernels built or loaded before the clock starts
    bare = status_mb("VmHWM")
    start = time.perf_counter()
    model = load_model(path, weights=None if fmt == "default" else fmt, progress=lambda s: None)
    load_s = time.perf_counter() - start
    return dict(bare_mb=bare, peak_mb=status_mb("VmHWM"), after_mb=status_mb("VmRSS"), load_s=load_s,
                weights=sorted({s.fmt for m in model.linears() for s in m.weight.segments}),
                kernels=model.ops.name, notes=model.load_notes)


def in_child(path: Path, fmt: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.load_memory", "--child", str(path), fmt],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.load_memory child {path} {fmt} failed (exit {done.returncode}): "
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def random_folder(shape: str, folder: Path) -> Path:
    """An HF folder of `shape` with random bf16 weights (made once in `folder`)."""
    out = folder / f"random-{shape}-bf16"
    if (out / "model.safetensors").is_file():
        return out
    import torch

    from engine.tiny import tiny_config, write_tiny_model

    keys = {k: v for k, v in RANDOM[shape].items() if k not in ("model_type", "like")}
    return write_tiny_model(out, tiny_config(RANDOM[shape]["model_type"], **keys), std=0.02, dtype=torch.bfloat16)


def file_bytes(path: Path) -> int:
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def rows(targets: list[tuple[str, Path]], formats: list[str], repeats: int) -> list[dict]:
    runs: dict[tuple[int, int], list[dict]] = {}
    for rep in range(repeats):
        for t in range(len(targets)):
            order = [*formats[rep % len(formats):], *formats[:rep % len(formats)]]
            for fmt in order:
                runs.setdefault((t, formats.index(fmt)), []).append(in_child(targets[t][1], fmt))
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
    return out


def markdown(result: dict) -> str:
    from bench.common import markdown_table

    head = ("What a load holds at its peak: `load_model(path, weights=format)` in a fresh process per run, "
            f"{result['repeats']} runs of each (formats rotated each repeat); peak: VmHWM after the load (the "
            "largest of the runs), after: RSS once loaded (median), bare: a process that imported engine and loaded "
            "its CPU kernels, transient: peak - after; peak_over_file: (peak - bare) over the bytes of the files "
            "read. load_s: the median load. Random folders: bf16 safetensors of the shape named, random values.\n\n")
    cols = ["model", "format", "weights", "file_mb", "bare_mb", "peak_mb", "after_mb", "transient_mb",
            "peak_over_file", "load_s"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:4])))
        return
    from bench.common import run_and_save

    p = argparse.ArgumentParser(description="peak RSS and time of a load, GGUF files and HF folders")
    p.add_argument("--random", nargs="*", default=[], choices=list(RANDOM), help="random bf16 HF folders to make")
    p.add_argument("--paths", nargs="*", default=[], type=Path, help="GGUF files or HF folders to load as they are")
    p.add_argument("--formats", nargs="+", default=["default"], help="weights= of each load ('default': none asked)")
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-load-memory"),
                   help="where --random folders are made")
    p.add_argument("--repeats", type=int, default=2)
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
        out = dict(repeats=args.repeats, formats=args.formats, rows=rows(targets, args.formats, args.repeats))
        save(out)
        return out

    run_and_save(args.out, args.name, "cpu", run, markdown)


if __name__ == "__main__":
    main()
