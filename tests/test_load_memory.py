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
