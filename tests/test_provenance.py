"""engine/observe/provenance.py: the sampler against a fake NVML (no GPU here), and the CPU figures it reads."""
import time
from types import SimpleNamespace

import pytest

from engine.observe import provenance
from engine.observe.provenance import Telemetry, describe, snapshot


class FakeNVMLError(Exception):
    pass


def fake_nvml(script, fail_init=False):
    """An object with the pynvml calls Telemetry makes. `script` is a list of (sm MHz, reasons bits) the
    device reports, one per sample; the last one repeats."""
    calls = dict(samples=0, shutdown=0)

    def init():
        if fail_init:
            raise FakeNVMLError("Driver Not Loaded")

    def reasons(handle):
        i = min(calls["samples"], len(script) - 1)
        calls["samples"] += 1
        return script[i][1]

    def clock(handle, kind):
        return script[min(calls["samples"], len(script)) - 1][0] if kind == 1 else 2619

    nvml = SimpleNamespace(
        NVMLError=FakeNVMLError, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        nvmlClocksEventReasonGpuIdle=0x1, nvmlClocksEventReasonSwPowerCap=0x4, nvmlClocksEventReasonHwSlowdown=0x8,
        nvmlClocksEventReasonSwThermalSlowdown=0x20, nvmlClocksEventReasonHwThermalSlowdown=0x40,
        nvmlClocksEventReasonHwPowerBrakeSlowdown=0x80,
        nvmlInit=init, nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetHandleByUUID=lambda uuid: "h", nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetName=lambda h: "NVIDIA Fake 80GB", nvmlDeviceGetMaxClockInfo=lambda h, k: 1980,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000, nvmlDeviceGetCurrentClocksEventReasons=reasons,
        nvmlDeviceGetClockInfo=clock, nvmlDeviceGetTemperature=lambda h, s: 61,
        nvmlDeviceGetPowerUsage=lambda h: 412_500,
    )
    return nvml, calls


def run(nvml, seconds=0.12):
    with Telemetry("cuda", interval_s=0.02, nvml=nvml) as tel:
        time.sleep(seconds)
    return tel.summary()


def test_a_run_that_throttled_is_flagged_with_its_reasons():
    nvml, calls = fake_nvml([(1980, 0x1), (1980, 0x0), (1410, 0x4 | 0x20), (1755, 0x40)])
    s = run(nvml)
    assert s["throttled"] and s["throttle_reasons"] == ["power cap", "thermal (driver)", "thermal (hardware)"]
    assert s["throttled_samples"] >= 2 and s["samples"] == calls["samples"] >= 4
    assert s["gpu_sm_mhz"]["min"] == 1410 and s["gpu_sm_mhz"]["max"] == 1980
    assert s["gpu_power_w"]["max"] == 412.5 and s["gpu_temp_c"]["max"] == 61
    assert (s["gpu_name"], s["gpu_max_sm_mhz"], s["gpu_power_limit_w"]) == ("NVIDIA Fake 80GB", 1980, 700.0)
    assert any("GPU throttled" in f and "power cap" in f for f in s["flags"])
    assert calls["shutdown"] == 1


def test_idle_is_not_throttling():
    nvml, _ = fake_nvml([(1980, 0x1)])
    s = run(nvml, 0.05)
    assert not s["throttled"] and s["throttle_reasons"] == []
    assert not any("GPU" in f for f in s["flags"])


def test_no_nvml_is_said_not_hidden():
    nvml, _ = fake_nvml([(1980, 0)], fail_init=True)
    s = run(nvml, 0.01)
    assert s["gpu_telemetry"] == "NVML unavailable: Driver Not Loaded"
    assert s["gpu_sm_mhz"] is None and "GPU not sampled: NVML unavailable: Driver Not Loaded" in s["flags"]


def test_cpu_run_records_the_machine_and_the_load_around_it():
    with Telemetry("cpu", interval_s=0.02) as tel:
        time.sleep(0.1)
    s = tel.summary()
    assert s["sampled"] and s["samples"] >= 3 and s["cpu_count"] >= 1
    assert s["cpu_model"] and isinstance(s["cpu_flags"], str)
    assert len(s["load_before"]) == 3 and len(s["load_after"]) == 3
    assert "gpu_sm_mhz" not in s and isinstance(s["flags"], list)


def test_a_busy_machine_is_flagged(monkeypatch):
    monkeypatch.setattr(provenance, "load_average", lambda: [64.0, 64.0, 64.0])
    s = snapshot("cpu")
    assert not s["sampled"]
    assert any(f.startswith("busy machine: 1-min load 64.0") for f in s["flags"])


def test_spread():
    assert provenance.spread([3, None, 1, 2]) == dict(min=1, median=2, max=3)
    assert provenance.spread([None]) is None


@pytest.mark.parametrize("text,expected", [("performance\n", "performance"), (None, None)])
def test_governor(monkeypatch, tmp_path, text, expected):
    path = tmp_path / "scaling_governor"
    if text is not None:
        path.write_text(text)
    monkeypatch.setattr(provenance, "GOVERNOR", path)
    assert provenance.governor() == expected


@pytest.mark.parametrize("vendor, family, model, kind", [
    ("AuthenticAMD", 25, 0x11, "zen4"),  # Genoa, this project's Zen 4 box
    ("AuthenticAMD", 25, 0x01, "zen3"),  # Milan
    ("AuthenticAMD", 25, 0xA0, "zen4"),  # Bergamo (Zen 4c)
    ("AuthenticAMD", 26, 0x02, "zen5"),  # Turin
    ("AuthenticAMD", 23, 0x31, "zen2"),  # Rome
    ("GenuineIntel", 6, 0x8F, "sapphire-rapids"),
    ("GenuineIntel", 6, 0xCF, "emerald-rapids"),
    ("GenuineIntel", 6, 0x9A, "GenuineIntel-f6m154"),  # not a server core the table knows: its numbers
    ("", None, None, "unknown-fNonemNone"),
])
def test_cpu_kind_names_the_core_generation(vendor, family, model, kind):
    assert provenance.cpu_kind(vendor, family, model) == kind


def test_the_card_names_the_cpu_kind():
    t = dict(cpu_model="AMD EPYC", cpu_kind="zen4", cpu_family_model="family 25 model 17", cpu_count=2,
             cpu_flags="avx2 avx512f", load_before=[0.5, 0.5, 0.5])
    assert describe(t)["CPU"] == "AMD EPYC (zen4: family 25 model 17), 2 cores (avx2 avx512f)"
    del t["cpu_kind"]  # results written before the kind was recorded
    assert describe(t)["CPU"] == "AMD EPYC, 2 cores (avx2 avx512f)"
