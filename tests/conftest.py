"""Shared fixtures.

Tests that load the embedded default model are marked `@pytest.mark.slow` (registered in
pyproject.toml). They still run by default; `pytest -m "not slow"` skips them for a quick loop.
"""
import pytest

from engine import default_model


@pytest.fixture(scope="session")
def default_model_dir():
    """The converted SmolLM2-135M-Instruct folder; the first run downloads and converts it (~10 s)."""
    return default_model.ensure()
