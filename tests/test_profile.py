"""engine/observe/profile.py on the tiny random-weight model: a real torch.profiler trace reduced to rows."""
import json

import pytest

from engine import Engine, load_model
from engine.observe import profile
from engine.observe.breakdown import OP_CLASSES, reduce_trace
from engine.tiny import tiny_config, write_tiny_model

STEPS, K = 4, 3


@pytest.fixture(scope="module")
def eng(tmp_path_factory, one_thread):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", tiny_config(), seed=0)
    e = Engine(load_model(folder, device="cpu"), max_seq_len=256)
    e.bandwidth_gbs = 20.0
    return e


@pytest.fixture(scope="module")
def result(eng):
    return profile.run(eng, profile.Config("torch"), steps=STEPS, k=K)


def rows(result, kind):
    return [r for r in result.rows if r["pass"] == kind]


def test_every_layer_and_op_class_of_a_step_is_there(eng, result):
    decode = rows(result, "decode")
    layers = {r["layer"] for r in decode}
    assert {str(i) for i in range(eng.config.n_layers)} | {"embed", "head", "sample", "engine", "model"} == layers
    calls = {(r["layer"], r["op_class"]): r["calls"] for r in decode}
    for i in map(str, range(eng.config.n_layers)):
        # per block: wqkv, wo, gate_up, down; two add+norms; one KV write (K and V); one each of the rest
        assert calls[(i, "matmul")] == 4 and calls[(i, "norm")] == 2 and calls[(i, "kv_write")] == 1
        assert calls[(i, "attention")] == calls[(i, "rope")] == calls[(i, "activation")] == 1
    assert calls[("head", "matmul")] == 1 and calls[("sample", "sampling")] == 1
    assert set(r["op_class"] for r in decode) <= set(OP_CLASSES)


def test_rows_add_up_to_the_profiled_step_and_say_how_far_that_is_from_the_plain_one(result):
    for s in result.summary:
        kind_rows = rows(result, s["pass"])
        # to the trace's timestamps, which kineto rounds to the nanosecond
        assert sum(r["ms"] for r in kind_rows) == pytest.approx(s["profiled_ms"], abs=1e-4)
        assert sum(r["pct_of_step"] for r in kind_rows) == pytest.approx(100, abs=1e-2)
        assert s["rows_vs_step"] == pytest.approx(s["rows_ms"] / s["step_ms"])
        assert s["profiler_overhead_pct"] == pytest.approx(100 * (s["profiled_ms"] / s["step_ms"] - 1))
        assert s["python"] + s["dispatch"] + s["kernel"] == pytest.approx(s["profiled_ms"], abs=1e-4)
        assert s["trace_events"] > 100 and s["total_s"] > s["record_s"] > 0
    assert {s["pass"]: s["windows"] for s in result.summary} == {"decode": STEPS, "verify": 1}


def test_bytes_are_the_weights_once_and_the_live_cache(eng, result):
    decode = rows(result, "decode")
    weights = sum(r["bytes"] for r in decode if r["op_class"] in ("matmul", "norm"))
    # every weight a step streams (an untied embedding table is not one: a step reads one row of it)
    assert weights == eng.weight_bytes
    attn = [r for r in decode if r["op_class"] == "attention"]
    per_layer = eng.cache.bytes_per_token / eng.config.n_layers
    assert {r["bytes"] for r in attn} == {per_layer * (profile.CONTEXT + (STEPS + 1) / 2)}
    mm = next(r for r in decode if (r["layer"], r["op_class"]) == ("0", "matmul"))
    assert mm["gbs"] == pytest.approx(mm["bytes"] / mm["ms"] / 1e6)
    assert mm["pct_of_ceiling"] == pytest.approx(100 * mm["gbs"] / 20.0)


def test_verify_pass_reads_k_plus_1_tokens(eng, result):
    kv_write = {r["bytes"] for r in rows(result, "verify") if r["op_class"] == "kv_write"}
    assert kv_write == {(K + 1) * eng.cache.bytes_per_token / eng.config.n_layers}


def test_scopes_are_removed_and_the_engine_is_left_as_it_was(eng, result):
    model = eng.model
    assert model.ops.rmsnorm.__module__ in ("engine.ops.ref", "engine.ops.rowwise")  # the twin or kernel, not a scope
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.layers)
    ids, _ = eng.generate([1, 2, 3], max_new_tokens=4, stop_ids=[])
    assert len(ids) == 4


def test_the_trace_is_trace_event_json_and_reduces_again(result):
    text = json.dumps(result.trace, allow_nan=False)  # NaN is not JSON; Perfetto rejects it
    trace = json.loads(text)
    assert all("ph" in e for e in trace["traceEvents"])
    assert set(reduce_trace(trace)) == {"decode", "verify"}


def test_compare_says_why_a_configuration_cannot_run_here(eng, monkeypatch):
    from engine.ops import ext

    monkeypatch.setattr(ext, "load", lambda target: ext.ExtStatus(None, f"no {target} kernels in this test"))
    eng.use_fused(False)  # fused is then asked for anew, and the (patched) build says why it cannot
    out = profile.compare({"fp32": eng}, [profile.Config("fused", fused=True), profile.Config("graph", graphs=True),
                                         profile.Config("q4", weights="q4")], steps=2, k=1)
    assert [r.rows for r in out] == [[], [], []]
    assert "no cpu kernels in this test" in out[0].reason and "CUDA graphs need a CUDA device" in out[1].reason
    assert out[2].reason == "q4 weights are not loaded here (loaded: fp32)"
    eng.use_fused(False)


def test_a_context_that_does_not_fit_is_refused(eng):
    with pytest.raises(ValueError, match="max_seq_len"):
        profile.run(eng, profile.Config("torch"), steps=4, k=1, context=list(range(1, 255)))


@pytest.mark.slow
def test_default_model_profile_accounts_for_every_profiled_millisecond(default_model_dir):
    """On the embedded model every millisecond of the profiled step lands in one (layer, op class) row: the
    rows add up to the profiled step. How that step compares with an unprofiled one, and what profiling costs
    in seconds, are timings: bench/profile.py measures them against its goals (10 %, 5 s)."""
    eng = Engine(load_model(default_model_dir, device="cpu"), max_seq_len=512)
    s = profile.run(eng, profile.Config("torch"), steps=3, k=4).summary[0]
    assert s["rows_ms"] == pytest.approx(s["profiled_ms"], rel=0.02)
    assert s["step_ms"] > 0 and s["total_s"] > 0 and {"rows_vs_step", "profiler_overhead_pct"} <= set(s)


def test_merged_sessions_keep_every_span_and_each_metadata_event_once():
    meta = dict(ph="M", name="process_name", pid=1, args=dict(name="python"))
    a = dict(schemaVersion=1, traceName="a", traceEvents=[meta, dict(ph="X", name="s", ts=0, dur=1, pid=1, tid=1)])
    b = dict(schemaVersion=1, traceName="b", traceEvents=[meta, dict(ph="X", name="s", ts=5, dur=1, pid=1, tid=1)])
    merged = profile.merge([a, b])
    assert merged["schemaVersion"] == 1 and "traceName" not in merged
    assert [e["ph"] for e in merged["traceEvents"]] == ["M", "X", "X"]


def test_the_ceiling_is_the_best_probe_taken_before_between_and_after(eng):
    """One probe before the first configuration and one after each that ran; a low reading (another job on
    the bus) does not set the ceiling."""
    readings = iter([12.0, 31.0, 18.0])
    calls = []

    def probe():
        calls.append(1)
        return next(readings)

    out = profile.compare({"fp32": eng}, [profile.Config("a"), profile.Config("q4", weights="q4"),
                                         profile.Config("b")], probe=probe, steps=1, k=1)
    assert len(calls) == 3  # before, after "a", after "b"; none for the one that could not run
    for r in (out[0], out[2]):
        assert all(s["bandwidth_gbs"] == 31.0 and s["probes_gbs"] == [12.0, 31.0, 18.0] for s in r.summary)
        row = next(x for x in r.rows if x["gbs"])
        assert row["pct_of_ceiling"] == pytest.approx(100 * row["gbs"] / 31.0)


def test_bytes_and_time_per_weight_format_with_the_cpu_kernels(tmp_path, one_thread):
    """The CPU kernels name each projection's call after its format: every format the model holds gets its bytes
    (each projection once a pass) and its calls' time, which are the matmul rows' time split another way."""
    from engine.ops import ext

    if ext.load("cpu").module is None:
        pytest.skip("the CPU kernels did not build")
    folder = write_tiny_model(tmp_path / "m", tiny_config(), seed=0)
    e = Engine(load_model(folder, device="cpu", weights="q4", fused=True), max_seq_len=256)
    e.bandwidth_gbs = 20.0
    r = profile.run(e, profile.Config("fused", fused=True, weights="q4"), steps=STEPS, k=K)
    held = profile.format_bytes(e.model)
    assert set(held) == {"q4", e.model.lm_head.weight.fmt} and len(held) == 2  # the head keeps 8-bit blocks
    for kind in ("decode", "verify"):
        mine = [f for f in r.formats if f["pass"] == kind]
        assert {f["format"]: f["bytes"] for f in mine} == held
        assert sum(f["bytes"] for f in mine) == sum(x["bytes"] for x in rows(r, kind) if x["op_class"] == "matmul")
        assert sum(f["ms"] for f in mine) == pytest.approx(
            sum(x["ms"] for x in rows(r, kind) if x["op_class"] == "matmul"), rel=1e-6)
        calls = {f["format"]: f["calls"] for f in mine}
        assert calls["q4"] == 4 * e.config.n_layers and calls[e.model.lm_head.weight.fmt] == 1
        for f in mine:
            assert f["gbs"] == pytest.approx(f["bytes"] / f["ms"] / 1e6)
            assert f["pct_of_ceiling"] == pytest.approx(100 * f["gbs"] / 20.0)
