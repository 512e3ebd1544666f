"""What a load holds at its peak (engine/checkpoint/memory.py, load.py): memory.release hands freed heap pages
back to the OS, and the loader calls it once the tokenizer it checks is gone and after every tensor it packs, so
the buffers freed between kept weights never add up in RSS (~50 MB of a 1.5B model's 1.2 GB peak)."""
import subprocess
import sys
from pathlib import Path

import pytest

from engine import load_model
from engine.checkpoint import formats, memory

# a heap with holes: 1 MiB blocks, every other one freed, the kept ones pinning the heap's top so glibc's own trim
# cannot return the freed ones. MALLOC_MMAP_THRESHOLD_ keeps blocks of this size on the heap (glibc would mmap
# them on a fresh start, and its threshold moves as a process frees); RssAnon is read before and after release.
HOLES = """
import sys
from engine.checkpoint import memory

def anon():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon")) << 10

blocks = [bytes([i % 256]) * (1 << 20) for i in range(64)]
del blocks[::2]
before = anon()
if sys.argv[1] == "release":
    memory.release()
print(before - anon())
"""


def freed_by(step: str) -> int:
    env = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", HOLES, step], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).parents[1], check=True)
    return int(done.stdout.split()[-1])


def test_release_returns_the_holes_of_the_heap():
    if memory._malloc_trim() is None or not sys.platform.startswith("linux"):
        pytest.skip("needs glibc's malloc_trim and /proc/self/status (Linux)")
    assert freed_by("nothing") < 4 << 20  # the holes stay resident without it: what this test would miss
    assert freed_by("release") > 24 << 20  # 32 MiB of holes, less what the allocator keeps at their edges


def test_the_loader_releases_before_and_between_the_tensors_it_packs(tmp_path, monkeypatch):
    from gguf_files import family_files

    gguf_file, _ = family_files("llama", tmp_path)
    load_model(gguf_file, cache_dir=tmp_path / "cache", progress=lambda s: None)  # indexed: the next load only loads
    events, weight = [], formats.FormatPlan.weight

    def packed(self, ours, names, n_in):
        events.append("weight")
        return weight(self, ours, names, n_in)

    monkeypatch.setattr(memory, "release", lambda: events.append("release"))
    monkeypatch.setattr(formats.FormatPlan, "weight", packed)
    load_model(gguf_file, cache_dir=tmp_path / "cache", progress=lambda s: None)
    assert events.count("weight") > 2
    assert events[0] == "release"  # the tokenizer's parse, before any weight
    assert "weight, weight" not in ", ".join(events)  # never two tensors' buffers without a release between them
    assert events[-1] == "release"


# modules a GGUF load and decode on token ids has no use for: each held ~1-5 MB of every such process's RSS
# (cpp_extension brings setuptools; jinja renders chat templates; safetensors reads HF folders)
UNUSED = ("torch.utils.cpp_extension", "setuptools", "jinja2", "safetensors")
LOAD = """
import sys
from engine import Engine, load_model
model = load_model(sys.argv[1], cache_dir=sys.argv[2], progress=lambda s: None)
Engine(model, max_seq_len=16).generate([1, 2, 3], 2)
print(" ".join(m for m in sys.argv[3:] if m in sys.modules))
"""


def test_a_gguf_load_imports_only_what_it_runs(tmp_path):
    from gguf_files import family_files

    gguf_file, _ = family_files("llama", tmp_path)
    load_model(gguf_file, cache_dir=tmp_path / "cache", progress=lambda s: None)  # indexed, kernels built
    done = subprocess.run([sys.executable, "-c", LOAD, str(gguf_file), str(tmp_path / "cache"), *UNUSED],
                          capture_output=True, text=True, cwd=Path(__file__).parents[1], check=True)
    assert done.stdout.split() == []


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8", "q4", "q4_0", "q4_k", "q6_k"])
def test_an_hf_folders_values_are_read_and_packed_a_few_rows_at_a_time(fmt, tmp_path, monkeypatch):
    """A safetensors weight is read from the file and packed for the CPU kernels a chunk of whole panels of rows at
    a time (sources.dense_chunks, panels.pack_runs), never whole in its dtype or in fp32 (a 0.5B's tied head took
    1.8 GB of transients in q8): read 1 KB at a time, no chunk is more than 16 rows, and every weight holds the
    values of the same tensor quantized whole (the torch twins' load, which packs the whole tensor's Blocks)."""
    import torch

    from engine import weights
    from engine.checkpoint import sources
    from engine.tiny import write_tiny_model

    folder = write_tiny_model(tmp_path / "model")
    want = load_model(folder, weights=fmt, fused=False, progress=lambda s: None)
    dense_chunks = sources.SafetensorsSource.dense_chunks
    for chunk_bytes, rows in ((1024, 16), (8192, 32)):  # one panel a run, and two (fp32 rows of 64 or 160 inputs)
        seen = []

        def small(self, name, _=0, chunk_bytes=chunk_bytes, seen=seen):
            for chunk in dense_chunks(self, name, chunk_bytes):
                seen.append(len(chunk))
                yield chunk

        monkeypatch.setattr(sources.SafetensorsSource, "dense_chunks", small)
        got = load_model(folder, weights=fmt, progress=lambda s: None)
        if got.ops.layout != "cpu":
            pytest.skip("the CPU kernels do not run here")
        assert max(seen) == rows and len(seen) > 4 * got.config.n_layers  # each of several chunks
        for a, b in zip(want.linears(), got.linears(), strict=True):
            for s, t in zip(a.weight.segments, b.weight.segments, strict=True):
                assert (s.fmt, t.layout) == (t.fmt, "cpu") and all(x.is_contiguous() for x in t.tensors)
                assert torch.equal(weights.dequantize(weights.unpack(s)), weights.dequantize(weights.unpack(t)))
