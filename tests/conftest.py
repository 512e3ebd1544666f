"""Shared fixtures.

Tests that load the embedded default model are marked `@pytest.mark.slow` (registered in
pyproject.toml). They still run by default; `pytest -m "not slow"` skips them for a quick loop.
"""
import pytest

from engine.checkpoint import default_model
import torch  # after engine, which sets OpenMP's wait policy before torch loads

from cpu_paths import PATHS, load_module, on_path


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted SmolLM2-135M-Instruct folder; the first run downloads and converts it (~10 s)."""
    return default_model.ensure()


@pytest.fixture(scope="module")
def cpu_module():
    """The CPU kernel module (tests/cpu_paths.py), or a skip saying why it did not build. Only the tests that ask
    for it build it, so a run of the CUDA tests never does."""
    return load_module()


@pytest.fixture(params=PATHS)
def m(request, cpu_module):
    """The CPU kernel module on one instruction-set path (amx with its tiles at every row count)."""
    yield from on_path(cpu_module, request.param)


@pytest.fixture(scope="module")
def tiny_runtime():
    """The UI's runtime over the tiny launch model (a module's own: its tests may change it), closed after."""
    from runtimes import QUIET
    from ui.startup import build_runtime

    rt = build_runtime(tiny=True, **QUIET)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models are all per-op overhead: OpenMP's thread handoffs cost more than the math, and far more
    when the CPU is shared with other jobs."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the browser tests (tests/browser.py: they skip without it or Playwright)."""
    from tests.browser import ARGS, CHROMIUM, sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()
