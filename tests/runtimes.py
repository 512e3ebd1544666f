"""The UI's tests' runtimes: built on the CPU, without the bandwidth probe or progress lines (the tiny launch
model's is conftest.py's `tiny_runtime`), a base model's folder, and the CSV files a run exports read back."""
import csv
import json
from pathlib import Path

from engine.tiny import tiny_config, write_tiny_model

QUIET = dict(device="cpu", bandwidth=False, progress=lambda *a: None)


def write_base_model(folder: Path, seed: int) -> Path:
    """A tiny model in `folder` with no chat template, as a base model's GGUF file gives the converter (no
    tokenizer.chat_template)."""
    folder = write_tiny_model(folder, tiny_config(), seed=seed)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def read_csv(path) -> list[dict]:
    """An exported CSV file's rows, as dicts of strings."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
