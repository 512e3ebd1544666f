"""Where the llama.cpp benchmarks find llama.cpp's binaries (bench/llamacpp.py): one lookup each, $LLAMA_SERVER and
$LLAMA_BENCH before scripts/build_llamacpp.sh's folder, and what is missing named."""
from bench import llamacpp, reference


def fake_binary(path):
    """An executable file at path (its folder made): what the lookups accept as a binary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_llama_bench_binary_from_env_or_the_build_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(llamacpp.BENCH_ENV, str(tmp_path / "nope"))
    assert llamacpp.bench_binary() is None
    assert str(tmp_path / "nope") in llamacpp.bench_missing()
    monkeypatch.delenv(llamacpp.BENCH_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert llamacpp.prefix() == tmp_path / "decodescope" / f"llama.cpp-{llamacpp.VERSION}"
    assert llamacpp.bench_binary() is None and "build_llamacpp.sh" in llamacpp.bench_missing()
    exe = fake_binary(llamacpp.prefix() / "bin" / "llama-bench")
    assert llamacpp.bench_binary() == exe


def test_the_binaries_the_benchmarks_need_are_found_in_one_place(monkeypatch, tmp_path):
    """llama-server from LLAMA_SERVER else the build folder, llama-bench likewise, llama-quantize from the folder;
    what is missing is named."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for var in ("LLAMA_SERVER", llamacpp.BENCH_ENV):
        monkeypatch.delenv(var, raising=False)
    assert llamacpp.binaries_missing().startswith("no llama-server, llama-bench, llama-quantize")
    assert llamacpp.perplexity_binary() is None and "build_llamacpp.sh" in llamacpp.perplexity_missing()
    for name in ("llama-bench", "llama-quantize", "llama-perplexity"):
        fake_binary(llamacpp.prefix() / "bin" / name)
    assert llamacpp.quantize_binary() == llamacpp.prefix() / "bin" / "llama-quantize"
    assert llamacpp.perplexity_binary() == llamacpp.prefix() / "bin" / "llama-perplexity"
    assert llamacpp.perplexity_missing() is None
    assert llamacpp.binaries_missing().startswith("no llama-server (")
    other = fake_binary(tmp_path / "elsewhere" / "llama-server")  # LLAMA_SERVER names one outside the build folder
    monkeypatch.setenv("LLAMA_SERVER", str(other))
    assert llamacpp.server_binary() == other and llamacpp.binaries_missing() is None
    monkeypatch.delenv("LLAMA_SERVER")
    assert llamacpp.server_binary() is None  # and none in the build folder
    built = fake_binary(llamacpp.prefix() / "bin" / "llama-server")
    assert llamacpp.server_binary() == built


def test_llama_cpps_reference_ids_come_from_the_same_llama_server(monkeypatch, tmp_path):
    """bench.reference takes llama-server where bench.llamacpp finds it, else llama-cpp-python's loop, and names
    both when neither is there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    monkeypatch.setattr(llamacpp, "unavailable", lambda: "llama-cpp-python is not installed")
    assert reference.reference_missing() == (f"neither llama-server ({llamacpp.prefix() / 'bin' / 'llama-server'}; "
                                             "or set LLAMA_SERVER) nor llama-cpp-python is not installed")
    other = fake_binary(tmp_path / "elsewhere" / "llama-server")
    monkeypatch.setenv("LLAMA_SERVER", str(other))
    assert reference.reference_missing() is None
