"""Start llama.cpp's llama-server on a GGUF file for the tests and the benchmark: a free loopback port, a clean
environment, its log in a file, and always stopped after (a context manager).

The binary comes from scripts/build_llamacpp.sh; LLAMA_SERVER names it. Its OpenMP threads spin by design, and
a process started after `import engine` inherits OMP_WAIT_POLICY=PASSIVE (engine/__init__.py OPENMP_DEFAULTS), which
made llama.cpp ~2.5x slower here: the server gets the environment the user had before that default.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

ENV_VAR = "LLAMA_SERVER"
START_TIMEOUT_S = 120.0


def binary() -> str | None:
    """The llama-server binary LLAMA_SERVER names, if it is there and runs."""
    path = os.environ.get(ENV_VAR)
    return path if path and Path(path).is_file() and os.access(path, os.X_OK) else None


def missing_reason() -> str:
    path = os.environ.get(ENV_VAR)
    if not path:
        return f"{ENV_VAR} is not set (scripts/build_llamacpp.sh PREFIX builds llama-server into PREFIX/bin)"
    return f"{ENV_VAR}={path} is not an executable file"


def clean_env() -> dict:
    """This process's environment without the OpenMP defaults `import engine` set (engine/__init__.py), the
    user's own values of them kept."""
    from engine import USER_OPENMP

    env = {k: v for k, v in os.environ.items() if k not in USER_OPENMP}
    return env | {k: v for k, v in USER_OPENMP.items() if v is not None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """with LlamaServer(gguf, spec=["--spec-type", "ngram-simple"]) as srv: srv.url -> http://127.0.0.1:PORT/v1"""

    def __init__(self, model: str | Path, *, spec: list[str] = (), threads: int | None = None, ctx: int = 2048,
                 exe: str | None = None, extra: list[str] = ()):
        self.exe = exe or binary()
        if self.exe is None:
            raise FileNotFoundError(missing_reason())
        self.model = Path(model)
        if not self.model.is_file():
            raise FileNotFoundError(f"GGUF file {self.model} does not exist")
        self.port = free_port()
        threads = threads or os.cpu_count() or 1
        self.args = [self.exe, "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", "1", "--no-webui", "--metrics",
                     *spec, *extra]
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.mkdtemp(prefix="decodescope-llama-server-")
        self.log_path = Path(self._dir) / "server.log"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.root + "/v1"

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start(self) -> LlamaServer:
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                                     stdin=subprocess.DEVNULL)
        log.close()
        t = time.monotonic()
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while time.monotonic() - t < START_TIMEOUT_S:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if client.get(self.root + "/health").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not answer /health within {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def props(self) -> dict:
        return httpx.get(self.root + "/props", trust_env=False, timeout=5.0).json()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
