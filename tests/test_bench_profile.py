"""bench/profile.py, bench/common.py's provenance and bench/render_results.py's conditions lines."""
import json

import pytest

from bench import profile as bench_profile
from bench.common import Telemetry, provenance, write_results
from bench.render_results import conditions_lines, render
from engine import Engine, load_model
from engine.observe import profile
from engine.observe.provenance import describe
from engine.tiny import tiny_config, write_tiny_model


def test_configurations_per_device():
    cpu = [c.label for c in bench_profile.configs("cpu", ["fp32"])]
    cuda = [c.label for c in bench_profile.configs("cuda", ["bf16"])]
    assert cpu == ["eager · torch · fp32", "eager · fused · fp32"]
    assert cuda == ["eager · torch · bf16", "graph · torch · bf16", "eager · fused · bf16", "graph · fused · bf16"]


def test_an_unavailable_default_model_falls_back_to_random_weights_of_its_shape(monkeypatch):
    def offline(*args, **kwargs):
        raise ValueError("the default model is not in the cache and DECODESCOPE_OFFLINE=1 forbids downloading")

    monkeypatch.setattr(bench_profile, "load_model", offline)
    notes = []
    eng = bench_profile.engines("cpu", ["q4"], 128, notes)["q4"]
    assert eng.model.weight_format == "q4" and eng.config.n_layers == 30
    assert notes and notes[0].startswith("q4: default model unavailable (the default model is not in the cache")


def test_provenance_carries_what_was_sampled_during_the_run():
    with Telemetry("cpu", interval_s=0.02) as tel:
        pass
    prov = provenance("cpu", tel)
    assert prov["telemetry"]["sampled"] and prov["telemetry"]["load_before"]
    assert provenance("cpu")["telemetry"]["sampled"] is False  # a snapshot when nothing was sampled


def test_a_summary_taken_inside_the_run_renders_without_its_load_after():
    """A results file saved while the telemetry still samples (after each row of a run) has no load_after yet."""
    with Telemetry("cpu", interval_s=0.02) as tel:
        prov = provenance("cpu", tel)
    assert prov["telemetry"]["load_after"] is None
    assert describe(prov["telemetry"])["load average"].endswith("(1 min)")


def test_a_device_run_takes_its_commit_by_name(monkeypatch):
    """The tree reaches a GPU machine without its own history: scripts/gpu_check.sh names the commit, and a
    '-dirty' suffix says the tree had changes."""
    monkeypatch.setenv("GPU_CHECK_COMMIT", "2ef267b-dirty")
    assert (provenance("cpu")["commit"], provenance("cpu")["dirty"]) == ("2ef267b", True)
    monkeypatch.setenv("GPU_CHECK_COMMIT", "2ef267b")
    assert (provenance("cpu")["commit"], provenance("cpu")["dirty"]) == ("2ef267b", False)


def test_results_md_shows_conditions_and_flags_under_each_table(tmp_path):
    quiet = provenance("cpu")
    quiet["telemetry"]["flags"] = []
    busy = json.loads(json.dumps(quiet))
    busy["telemetry"]["flags"] = ["busy machine: 1-min load 3.1 before the run on 2 cores"]
    write_results(tmp_path, "a-cpu", dict(provenance=quiet), "| x |\n|---|\n| 1 |\n")
    write_results(tmp_path, "b-cpu", dict(provenance=busy), "| y |\n|---|\n| 2 |\n")
    write_results(tmp_path, "c-cpu", dict(provenance=dict(commit="abc")), "| z |\n|---|\n| 3 |\n")
    md = render(tmp_path)
    a, b, c = md.split("## ")[1:]
    assert "Nothing flagged. Conditions: CPU: " in a and "load average: " in a
    assert "**Flagged: busy machine: 1-min load 3.1" in b
    assert "Conditions: not recorded" in c


def test_gpu_conditions_line_names_the_throttling():
    t = dict(sampled=True, samples=10, duration_s=5.0, cpu_model="x", cpu_count=16, cpu_flags="avx2", governor=None,
             cpu_mhz=None, load_before=[0.1, 0, 0], load_after=[0.2, 0, 0], gpu_telemetry="NVML",
             gpu_name="NVIDIA H200", gpu_max_sm_mhz=1980, gpu_power_limit_w=700.0,
             gpu_sm_mhz=dict(min=1410, median=1980, max=1980), gpu_mem_mhz=dict(min=2619, median=2619, max=2619),
             gpu_temp_c=dict(min=40, median=55, max=61), gpu_power_w=dict(min=100, median=300, max=650),
             throttle_reasons=["power cap"], throttled=True, throttled_samples=3,
             flags=["GPU throttled in 3/10 samples (power cap)"])
    line = conditions_lines(dict(telemetry=t))[0]
    assert line.startswith("**Flagged: GPU throttled in 3/10 samples (power cap).**")
    assert "SM 1980 median (1410-1980) MHz" in line and "power cap in 3 of 10 samples" in line


@pytest.fixture(scope="module")
def results(tmp_path_factory, one_thread):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", tiny_config(), seed=0)
    eng = Engine(load_model(folder, device="cpu"), max_seq_len=256)
    eng.bandwidth_gbs = 10.0
    return profile.compare({"fp32": eng}, bench_profile.configs("cpu", ["fp32"]), steps=2, k=1)


def test_markdown_has_the_summary_the_class_table_and_the_reasons(results):
    result = dict(device="cpu", model="tiny", context=64, steps=2, k=1, bandwidth_gbs=10.0, notes=["a note"])
    md = bench_profile.markdown(result, results)
    assert "| eager · torch · fp32 | decode |" in md and "| eager · torch · fp32 | verify |" in md
    assert "| matmul |" in md and "| host |" in md and "- a note" in md
    fused = next(r for r in results if r.config.fused)
    if fused.reason:  # where the CPU kernels cannot run, the table says why instead
        assert f"- eager · fused · fp32: {fused.reason}" in md
    else:
        assert "| eager · fused · fp32 | decode |" in md
    rows = bench_profile.class_rows(results)
    assert [r["op_class"] for r in rows][:2] == ["matmul", "attention"]
    assert rows[0]["eager · torch · fp32 GB/s"] > 0


def test_a_finished_profile_run_saves_its_provenance_with_the_load_after(tmp_path):
    """The results file is written after each configuration (a run cut short keeps them) and once more when the run
    ends, its telemetry complete: the load average after the run is recorded."""
    bench_profile.main(["--device", "cpu", "--weights", "q4", "--steps", "2", "--k", "1", "--context", "8",
                        "--out", str(tmp_path)])
    prov = json.loads((tmp_path / "profile-cpu.json").read_text())["provenance"]
    assert prov["telemetry"]["sampled"] and prov["telemetry"]["load_after"] is not None
