"""The app on a ZeroGPU Space, with a stand-in `spaces` package (no GPU needed): spaces imported before torch,
no CUDA touched at launch, every engine-side measurement inside the decorated function, a duration that follows
the request."""
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from ui.models import Runtimes
from ui import callbacks, startup
from ui import run as ui_run
from engine.request import Request
from ui.testing import tiny_settings

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "one two three, one two three, one two"


def fake_spaces(tmp_path: Path, body: str) -> Path:
    pkg = tmp_path / "spaces"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    (pkg / "config.py").write_text("class Config:\n    zero_gpu = True\n")
    return tmp_path


def run_python(path: Path, code: str) -> str:
    env = dict(os.environ, PYTHONPATH=f"{path}{os.pathsep}{ROOT}")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_app_imports_spaces_before_torch(tmp_path):
    """On ZeroGPU, spaces patches torch at import (torch.cuda.is_available() turns True in the main process);
    only if that happens before the app asks, does --device auto pick CUDA."""
    path = fake_spaces(tmp_path, """
        import sys
        TORCH_FIRST = "torch" in sys.modules  # the real package refuses when CUDA was initialised before it
        import torch
        torch.cuda.is_available = lambda: True
        def GPU(fn=None, duration=None):
            return fn if fn is not None else (lambda f: f)
    """)
    out = run_python(path, """
        import app  # the Space's entry point
        import spaces
        from ui.startup import pick_device
        print(spaces.TORCH_FIRST, pick_device("auto"))
    """)
    assert out == "False cuda"


class Fake:
    """A stand-in for spaces: GPU(duration=...) records the duration and marks the calls it wraps."""

    def __init__(self):
        self.inside = 0
        self.durations = []

    def GPU(self, fn=None, duration=None):
        def wrap(f):
            def gpu_call(*args, **kwargs):
                self.durations.append(duration(*args, **kwargs) if callable(duration) else duration)
                self.inside += 1
                try:
                    yield from f(*args, **kwargs)
                finally:
                    self.inside -= 1
            return gpu_call
        return wrap(fn) if fn is not None else wrap


@pytest.fixture
def zero(monkeypatch):
    fake = Fake()
    spaces = types.ModuleType("spaces")
    spaces.GPU = fake.GPU
    config = types.ModuleType("spaces.config")
    config.Config = types.SimpleNamespace(zero_gpu=True)
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    monkeypatch.setitem(sys.modules, "spaces.config", config)
    return fake


def test_no_cuda_touch_outside_the_gpu_function(zero, monkeypatch):
    import torch

    from engine import graphs
    from engine.observe import bandwidth

    def refuse(what):
        def f(*a, **k):
            raise AssertionError(f"{what} outside a GPU call")
        return f

    def inside_only(what, real):
        def f(*a, **k):
            assert zero.inside, f"{what} outside a GPU call"
            return real(*a, **k)
        return f

    monkeypatch.setattr(torch.cuda, "get_device_name", refuse("get_device_name"))
    monkeypatch.setattr(graphs, "capture", inside_only("a graph capture", graphs.capture))
    monkeypatch.setattr(bandwidth, "measure_gbs", inside_only("a bandwidth probe", lambda *a, **k: 12.5))
    rt = startup.build_runtime(tiny=True, device="cpu", bandwidth=True, progress=lambda *a: None)
    try:
        assert rt.fused_reason == startup.ZERO_GPU_KERNELS  # no JIT build in the main process, the reason shown
        assert rt.env["ZeroGPU"] == "yes" and "attached for each run" in rt.env["device"]
        clock = rt.engine.clock
        monkeypatch.setattr(clock, "peak_memory_mb", inside_only("the peak memory read", clock.peak_memory_mb))
        session = ui_run.Session()
        outs = list(callbacks.generate(Runtimes(rt), session, PROMPT, **tiny_settings(max_new_tokens=12)))
        assert "done" in outs[-1][2] and zero.inside == 0
        stats = session.last[0]
        assert stats.bandwidth_gbs == 12.5 and stats.peak_memory_mb > 0  # measured in the call, handed back
        assert zero.durations == [startup.zero_gpu_duration(Request(max_new_tokens=12), [])]
    finally:
        rt.close()


def test_the_duration_follows_the_request():
    short, long = (startup.zero_gpu_duration(Request(max_new_tokens=n), [1, 2]) for n in (16, 1024))
    assert startup.ZERO_GPU_BASE_S <= short < long <= startup.ZERO_GPU_MAX_S
    assert isinstance(short, int)
