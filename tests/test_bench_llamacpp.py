"""The llama.cpp anchor without timing anything: the random-model GGUF writer through our converter, the clean
environment every llama.cpp process gets, llama-bench's command line and parsing, the ids comparison, and (where
llama-cpp-python / llama-bench are installed) the logits read back from a tiny GGUF against our engine's.

The tiny models carry the first 512 tokens of the default model's vocabulary: reading the full tokenizer out of
a GGUF file takes most of a minute on a busy 2-core machine, and the tiny file is read once per module.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import pytest

import engine
from bench import llamacpp, random_gguf
from engine import Engine, load_model
from engine.checkpoint import default_model, gguf_convert
from test_bench_llamacpp_binaries import fake_binary

TINY = dict(hidden=64, intermediate=96, layers=2, heads=4, kv_heads=2, tied=False, rope_theta=10000.0)
TINY_VOCAB = 512
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """random-tiny-{F32,F16,Q8_0,Q4_1}.gguf in a temp folder (an untied head, so both embed roles are there)."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    tok = random_gguf.tokenizer_fields(default_model.gguf_path(progress=lambda msg: None), vocab=TINY_VOCAB)
    random_gguf.write(folder, "tiny", TINY, tok, progress=lambda msg: None)
    return folder


def hf_originals() -> dict[str, np.ndarray]:
    """The writer's random tensors by HF name, in HF layout (before the q/k permutation)."""
    tensors = random_gguf.hf_tensors(TINY, TINY_VOCAB)
    return {gguf_convert.hf_name(name): random_gguf.random_tensor(i, dims, role)
            for i, (name, dims, role, _) in enumerate(tensors)}


# Quantized tensors come back within half a step of their block's grid (Q8_0 steps are max|w| / 127 of the block,
# Q4_1 steps (max - min) / 15), plus the fp16 rounding of the block's scale and minimum: a few % of a step at
# most (127 steps of a scale off by 2^-12), so 0.55 steps. A wrong row order (the q/k permutation) puts other
# rows' values there, off by about the weights' own scale (0.02, some 5 to 70 steps), far past the bound.
def grid_step(w: np.ndarray, kind: str) -> np.ndarray:
    b = w.reshape(w.shape[0], -1, 32)
    step = np.abs(b).max(-1) / 127 if kind == "Q8_0" else (b.max(-1) - b.min(-1)) / 15
    return np.repeat(step, 32, axis=-1).reshape(w.shape)


@pytest.mark.slow
@pytest.mark.parametrize("kind", random_gguf.KINDS)
def test_random_gguf_round_trips_through_our_converter(tiny_files, tmp_path, kind):
    from engine.checkpoint import sources
    from engine.checkpoint.formats import dequantized_rows, stored_format
    from engine.config import ModelConfig

    gguf_convert.convert(random_gguf.path(tiny_files, "tiny", kind), tmp_path, progress=lambda msg: None)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (64, 96, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (4, 2, TINY_VOCAB)
    assert config["tie_word_embeddings"] is False
    src = sources.GGUFSource(tmp_path, ModelConfig.from_json(tmp_path / "config.json"))

    def value(name):  # what the loader reads: the file's rows in HF order, decoded
        s = stored_format(src, name)
        if s is None:
            return src.dense(name).float().numpy()
        return torch.cat(list(dequantized_rows(src.raw(name), s, src.shapes[name][-1]))).numpy()

    want = hf_originals()
    assert set(src.index) == set(want)
    for name, w in want.items():
        g = value(name)
        kept = random_gguf.stored_type(kind, "norm" if w.ndim == 1 else
                                       "embed" if name in ("model.embed_tokens.weight", "lm_head.weight") else "linear")
        if kept == "F32":
            np.testing.assert_array_equal(g, w, err_msg=name)
        elif kept == "F16":
            np.testing.assert_array_equal(g, w.astype(np.float16).astype(np.float32), err_msg=name)
        else:
            assert (np.abs(g - w) <= 0.55 * grid_step(w, kept)).all(), name
    if kind in ("Q8_0", "Q4_1"):  # the layers' projections in the file's type, the head Q8_0 in both files
        assert src.gguf_type("model.layers.1.self_attn.q_proj.weight") == kind
        assert src.gguf_type("lm_head.weight") == "Q8_0"
    src.close()


def test_permute_is_unpermute_inverted():
    w = np.arange(8 * 6 * 3, dtype=np.float32).reshape(8 * 6, 3)
    np.testing.assert_array_equal(gguf_convert.unpermute(random_gguf.permute(w, 6), 6), w)
    assert not np.array_equal(random_gguf.permute(w, 6), w)


def test_step_bytes_counts_what_a_step_reads():
    from bench.scaling import step_bytes

    s = random_gguf.SHAPES["135M"]  # tied: the head is the embedding, read whole
    C, I, L, V = s["hidden"], s["intermediate"], s["layers"], random_gguf.VOCAB
    kv = C // s["heads"] * s["kv_heads"]
    linears = L * (C * C * 2 + kv * C * 2 + 3 * C * I)
    norms = (2 * L + 1) * C * 4
    assert step_bytes("135M", "F32") == 4 * (linears + V * C) + norms
    assert step_bytes("135M", "Q4_1") == linears // 32 * 20 + V * C // 32 * 34 + norms
    s = random_gguf.SHAPES["1.1B"]  # untied: the head whole, one row of the embedding (not counted)
    C, I, L = s["hidden"], s["intermediate"], s["layers"]
    kv = C // s["heads"] * s["kv_heads"]
    assert step_bytes("1.1B", "F16") == 2 * (L * (C * C * 2 + kv * C * 2 + 3 * C * I) + V * C) + (2 * L + 1) * C * 4


# ---- the environment a llama.cpp process gets ----

def test_clean_env_drops_our_openmp_defaults(monkeypatch):
    for name, value in engine.OPENMP_DEFAULTS.items():
        monkeypatch.setenv(name, value)  # what `import engine` set
    monkeypatch.setattr(engine, "USER_OPENMP", dict.fromkeys(engine.OPENMP_DEFAULTS))
    assert not set(engine.OPENMP_DEFAULTS) & set(llamacpp.clean_env())
    monkeypatch.setattr(engine, "USER_OPENMP", {"OMP_WAIT_POLICY": "ACTIVE"})
    assert llamacpp.clean_env()["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's own choice stays


def test_the_timing_child_never_imports_engine(monkeypatch):
    """The child runs `python -m bench.llamacpp`: importing that module must not import engine, which would set
    OMP_WAIT_POLICY=PASSIVE in the child before llama.cpp's OpenMP runtime reads it."""
    monkeypatch.setattr(engine, "USER_OPENMP", dict.fromkeys(engine.OPENMP_DEFAULTS))
    probe = "import sys, os, bench.llamacpp; print('engine' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                          env=llamacpp.clean_env(), check=True)
    assert done.stdout.split() == ["False", "None"]


class Recorder:
    """Stands in for subprocess.run: records each command and environment, answers with canned output."""

    def __init__(self, stdout):
        self.calls, self.stdout = [], stdout

    def __call__(self, cmd, **kw):
        self.calls.append((cmd, kw))
        return subprocess.CompletedProcess(cmd, 0, self.stdout(cmd), "")


def test_time_decode_and_llama_bench_pass_the_clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(engine, "USER_OPENMP", dict.fromkeys(engine.OPENMP_DEFAULTS))
    exe = fake_binary(tmp_path / "llama-bench")
    monkeypatch.setenv(llamacpp.BENCH_ENV, str(exe))

    def answer(cmd):
        if cmd[0] == sys.executable:
            return json.dumps(dict(ids=[1], margins=[0.5], ms_per_token=1.0))
        test = dict(avg_ts=100.0, stddev_ts=1.0, model_type="llama", load_mode="none", type_k="f16")
        return json.dumps([test])

    rec = Recorder(answer)
    monkeypatch.setattr(llamacpp.subprocess, "run", rec)
    llamacpp.time_decode(tmp_path / "m.gguf", [1, 2], 4, threads=2)
    r = llamacpp.llama_bench(tmp_path / "m.gguf", threads=2, n_gen=128, depth=64, n_prompt=64)
    assert len(rec.calls) == 3  # the loop's child, llama-bench tg, llama-bench pp
    for _, kw in rec.calls:
        assert not set(engine.OPENMP_DEFAULTS) & set(kw["env"])
    tg, pp = rec.calls[1][0], rec.calls[2][0]
    assert tg[0] == str(exe)
    for cmd in (tg, pp):  # weights read into memory, llama.cpp's default flash attention, our thread count
        joined = " ".join(cmd)
        assert "-lm none" in joined and "-fa auto" in joined and "-t 2" in joined and "-o json" in joined
    assert "-n 128 -d 64" in " ".join(tg) and "-p 64 -n 0" in " ".join(pp)
    assert r["tg_tok_s"] == r["pp_tok_s"] == 100.0 and r["tg_test"] == "tg128@d64" and r["pp_test"] == "pp64"


# ---- comparing greedy ids ----

def test_first_divergence_and_the_f32_check():
    assert llamacpp.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert llamacpp.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert llamacpp.first_divergence([1, 2, 3], [1, 2]) == 2
    same = dict(ids_match=True, first_divergence=None, our_margin=None, llamacpp_margin=None)
    parted = dict(ids_match=False, first_divergence=7, our_margin=0.01, llamacpp_margin=0.02)
    llamacpp.check_same_f32("F32", "m", same)
    llamacpp.check_same_f32("Q4_1", "m", parted)  # other types may part: reported, not raised
    with pytest.raises(AssertionError, match="part from ours at token 7"):
        llamacpp.check_same_f32("F32", "m", parted)
    assert llamacpp.ids_cell(same) == "same"
    assert llamacpp.ids_cell(parted) == "part at 7 (margins 0.01 / 0.02)"


def test_margin_is_top1_minus_top2():
    assert llamacpp.margin(np.array([0.1, 3.0, -2.0, 2.5], np.float32)) == pytest.approx(0.5)


# ---- llama.cpp itself, where installed ----

needs_binding = pytest.mark.skipif(llamacpp.unavailable() is not None, reason=str(llamacpp.unavailable()))
needs_bench = pytest.mark.skipif(llamacpp.bench_binary() is None, reason=llamacpp.bench_missing())


@pytest.fixture(scope="module")
def tiny_f32(tiny_files):
    """Our engine on the tiny F32 file, fp32 throughout, and a prompt for it."""
    model = load_model(random_gguf.path(tiny_files, "tiny", "F32"), weights="fp32", progress=lambda msg: None)
    return Engine(model, max_seq_len=64), [5, 300, 17, 42, 99, 256, 8, 77]


@pytest.mark.slow
@needs_binding
def test_llamacpp_logits_are_read_after_every_eval(tiny_files, tiny_f32):
    """Each step's logits from llama.cpp match ours on the same F32 file; before the fix the loop read
    llm.scores, which Llama.eval never writes without logits_all (its picks were the argmax of an
    uninitialized array)."""
    eng, prompt = tiny_f32
    llm = llamacpp.open_model(random_gguf.path(tiny_files, "tiny", "F32"), 64, threads=1)
    _, _, ids, margins = llamacpp.greedy(llm, prompt, 6)
    ours = eng.logits(prompt + ids[:-1])[len(prompt) - 1:].float().numpy()  # the rows that picked each id
    llm.reset()
    llm.eval(prompt + ids[:-1])
    assert ids == ours.argmax(-1).tolist()
    assert ids != [0] * len(ids)
    # f32 weights, activations and caches on both sides, no flash attention: only the order of the sums
    # differs (2e-7 measured on logits of ~0.2; the f16 rounding of CPU flash attention would show as 1e-4),
    # so 1e-5 holds for a correct read and fails any other row or a 16-bit path
    np.testing.assert_allclose(llamacpp.last_logits(llm), ours[-1], atol=1e-5)
    np.testing.assert_allclose(margins, [llamacpp.margin(row) for row in ours], atol=1e-5)


@pytest.mark.slow
@needs_binding
def test_time_decode_child_matches_our_greedy_ids(tiny_files, tiny_f32, monkeypatch):
    monkeypatch.setattr(engine, "USER_OPENMP", dict.fromkeys(engine.OPENMP_DEFAULTS))
    eng, prompt = tiny_f32
    theirs = llamacpp.time_decode(random_gguf.path(tiny_files, "tiny", "F32"), prompt, 12, threads=1, repeats=1)
    assert theirs["child"] == dict(omp_wait_policy=None, engine_imported=False)
    ours, _ = eng.generate(prompt, 12, temperature=0.0, stop_ids=[])
    cmp = llamacpp.compare_ids(eng, prompt, ours, theirs)
    llamacpp.check_same_f32("F32", "tiny", cmp)
    assert len(theirs["margins"]) == 12


@pytest.mark.slow
@needs_bench
def test_llama_bench_runs_on_a_tiny_file(tiny_files):
    r = llamacpp.llama_bench(random_gguf.path(tiny_files, "tiny", "Q4_1"), threads=1, n_gen=4, depth=4, n_prompt=8,
                             repetitions=1)
    assert r["tg_tok_s"] > 0 and r["pp_tok_s"] > 0
    assert r["load_mode"] == "none" and r["tg_test"] == "tg4@d4"


def test_describe_records_the_settings_and_the_build():
    info = llamacpp.describe()
    assert info["settings"]["use_mmap"] is False
    if llamacpp.unavailable() is None:
        assert "AVX" in info["system_info"]
    if llamacpp.bench_binary() is not None:
        assert "commit" in info["llama_bench_version"]


def test_results_md_carries_the_anchors_provenance(tmp_path):
    from bench.render_results import render

    info = dict(settings=llamacpp.SETTINGS, python="llama-cpp-python 0.3.36", system_info="CPU : AVX2 = 1 |",
                llama_bench="/x/llama-bench", llama_bench_version="version: 0.5.0-dev\nbuilt with GNU 12",
                llama_bench_build="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF")
    (tmp_path / "scaling-cpu.md").write_text("| a |\n|---|\n| 1 |\n")
    (tmp_path / "scaling-cpu.json").write_text(json.dumps(dict(llamacpp=info, rows=[])))
    (tmp_path / "other.md").write_text("| b |\n|---|\n| 2 |\n")
    md = render(tmp_path)
    line = next(x for x in md.splitlines() if x.startswith("llama.cpp:"))
    assert "system_info: `CPU : AVX2 = 1 |`" in line and "use_mmap=False" in line
    assert "version: 0.5.0-dev; built with GNU 12" in line and "GGML_AMX_TILE=OFF" in line
    assert md.count("llama.cpp:") == 1  # a result that did not time llama.cpp gets no such line


def scaling_result(mismatches: list[str]) -> dict:
    """A scaling run as bench.scaling.run() records it (two rows, figures invented for the layout only)."""
    from bench.common import provenance

    info = dict(settings=llamacpp.SETTINGS, python="llama-cpp-python 0.3.36", system_info="CPU : AVX2 = 1 |",
                llama_bench="/x/llama-bench", llama_bench_version="version: 0.5.0-dev\nbuilt with GNU 12")
    rows = [dict(shape=s, weights=fmt, gguf=kind, weight_mb=mb, ours_tok_s=ours, loop_tok_s=loop, bench_tg_tok_s=tg,
                 bench_pp_tok_s=4 * tg, ours_pct=50.0, loop_pct=40.0, bench_pct=60.0, ours_over_bench=ours / tg,
                 bandwidth_gbs=bw, greedy_ids=ids, bench_tests="tg128@d128, pp128")
            for s, fmt, kind, mb, ours, loop, tg, bw, ids in (
                ("135M", "fp32", "F32", 650.0, 41.0, 33.0, 47.0, 58.0, "same 128/128"),
                ("1.1B", "q4", "Q4_1", 690.0, 27.5, 30.0, 31.0, 61.0, "part at 17: 0.0213 vs 0.0018"))]
    return dict(shapes={s: random_gguf.SHAPES[s] for s in ("135M", "1.1B")}, vocab=random_gguf.VOCAB,
                prompt_tokens=128, new_tokens=128, rounds=2, threads=2, bandwidth_gbs=58.0,
                bandwidth_range_gbs=[58.0, 61.0], llamacpp=info, rows=rows, f32_mismatches=mismatches,
                provenance=provenance("cpu"))


def test_scaling_table_renders_into_results_md(tmp_path):
    """bench.scaling's table, written as it writes it, reaches RESULTS.md under its own heading with every row,
    the run's bandwidth range, the anchor's provenance and the machine's."""
    from bench import scaling
    from bench.common import write_results
    from bench.render_results import render

    result = scaling_result([])
    write_results(tmp_path, "scaling-cpu", result, scaling.markdown(result))
    md = render(tmp_path)
    section = md[md.index("## scaling-cpu"):]
    table = [x for x in section.splitlines() if x.startswith("| ")]
    assert table[0].startswith("| shape | weights | gguf |") and len(table) == 3
    assert "| 135M | fp32 | F32 |" in table[1] and "same 128/128" in table[1]
    assert "| 1.1B | q4 | Q4_1 |" in table[2] and "part at 17" in table[2]
    assert "58-61 GB/s in this run" in section and "tg128@d128, pp128" in section
    assert "SmolLM2-135M" in section and "TinyLlama-1.1B" in section
    assert "F32 ids differ" not in section
    line = next(x for x in section.splitlines() if x.startswith("llama.cpp:"))
    assert "system_info: `CPU : AVX2 = 1 |`" in line and "use_mmap=False" in line
    assert any(x.startswith("Provenance: commit=") and "cpu=" in x for x in section.splitlines())


def test_scaling_table_names_an_f32_mismatch():
    from bench import scaling

    md = scaling.markdown(scaling_result(["random 135M F32: ids part at 3"]))
    assert "**F32 ids differ:** random 135M F32: ids part at 3" in md
