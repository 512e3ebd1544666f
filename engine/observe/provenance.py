"""Whether a measured number can be trusted: the state of the machine while it was measured.

GPU: SM and memory clocks, temperature, power and the clock-event (throttle) reasons, sampled through NVML
(the nvidia-ml-py binding) on a background thread for the whole measurement. A run during which the GPU
slowed itself down (power cap, thermal or hardware slowdown) is flagged: its timings are not the chip's.
CPU: the model and its SIMD flags (py-cpuinfo), governor and frequency where the kernel exposes them, and
the load average before and after. On a shared machine a run that started with the cores already busy is
flagged: its timings say as much about the other jobs as about the code.

    with Telemetry("cuda") as tel:
        ...measure...
    result["provenance"]["telemetry"] = tel.summary()
"""
from __future__ import annotations

import functools
import os
import platform
import statistics
import threading
import time
from pathlib import Path

import psutil
import torch

INTERVAL_S = 0.5  # NVML answers in microseconds; a sample every 0.5 s costs the measured thread nothing
GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
# the clock-event reasons that mean the GPU ran below the clocks it was asked for (NVML's names)
SLOWDOWN_REASONS = {
    "nvmlClocksEventReasonSwPowerCap": "power cap",
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonSwThermalSlowdown": "thermal (driver)",
    "nvmlClocksEventReasonHwThermalSlowdown": "thermal (hardware)",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake",
}
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd")


# AMD's cores by cpuid family and model range (AMD's processor programming references); Intel's server cores by
# model (family 6). What a benchmark's file name calls the CPU it ran on (`-cpu-<kind>`), kept in its provenance.
AMD_KINDS = {23: [(0x00, 0x2F, "zen1"), (0x30, 0xFF, "zen2")],
             25: [(0x00, 0x0F, "zen3"), (0x10, 0x1F, "zen4"), (0x20, 0x5F, "zen3"), (0x60, 0xAF, "zen4")],
             26: [(0x00, 0xFF, "zen5")]}
INTEL_KINDS = {0x55: "skylake-x", 0x6A: "icelake-x", 0x6C: "icelake-x", 0x8F: "sapphire-rapids",
               0xCF: "emerald-rapids", 0xAD: "granite-rapids", 0xAE: "granite-rapids"}


def cpu_kind(vendor: str, family: int | None, model: int | None) -> str:
    """The core's generation by its cpuid vendor, family and model (zen4, sapphire-rapids, ...), or the three
    numbers themselves where the tables above do not know them."""
    if vendor == "AuthenticAMD":
        for lo, hi, name in AMD_KINDS.get(family, []):
            if model is not None and lo <= model <= hi:
                return name
    if vendor == "GenuineIntel" and family == 6 and model in INTEL_KINDS:
        return INTEL_KINDS[model]
    return f"{vendor or 'unknown'}-f{family}m{model}"


@functools.cache
def cpu_info() -> dict:
    """CPU model and the SIMD flags the kernels dispatch on. py-cpuinfo asks in a subprocess (about 1 s),
    so once per process."""
    try:
        import cpuinfo
    except ImportError:  # a declared dependency, but a bench box may lack it: say so rather than fail the run
        return dict(cpu_model=platform.processor() or platform.machine(), cpu_flags="unknown (no py-cpuinfo)",
                    cpu_count=os.cpu_count())
    info = cpuinfo.get_cpu_info()
    flags = set(info.get("flags", []))
    vendor, family, model = info.get("vendor_id_raw", ""), info.get("family"), info.get("model")
    return dict(cpu_model=info.get("brand_raw") or info.get("arch_string_raw") or "unknown",
                cpu_kind=cpu_kind(vendor, family, model), cpu_family_model=f"family {family} model {model}",
                cpu_flags=" ".join(f for f in SIMD_FLAGS if f in flags), cpu_count=os.cpu_count())


def governor() -> str | None:
    try:
        return GOVERNOR.read_text().strip()
    except OSError:  # containers and most VMs do not expose cpufreq
        return None


def cpu_mhz() -> float | None:
    freq = psutil.cpu_freq()
    return round(freq.current, 1) if freq and freq.current else None


def load_average() -> list[float]:
    return [round(x, 2) for x in psutil.getloadavg()]


def spread(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None]
    return dict(min=min(xs), median=statistics.median(xs), max=max(xs)) if xs else None


class Gpu:
    """One device through NVML: a sample is a dict of its clocks, temperature, power and slowdown reasons."""

    def __init__(self, index: int, nvml=None):
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        nvml.nvmlInit()
        self.handle = self._handle(index)
        self.name = nvml.nvmlDeviceGetName(self.handle)
        self.max_sm_mhz = nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM)
        self.power_limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3
        self.reasons = {getattr(nvml, k): v for k, v in SLOWDOWN_REASONS.items()}

    def _handle(self, index: int):
        # NVML numbers devices in PCI order, CUDA (and CUDA_VISIBLE_DEVICES) may not: match by UUID first
        nvml = self.nvml
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except (AttributeError, RuntimeError, AssertionError, nvml.NVMLError):
            return nvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> dict:
        nvml, h = self.nvml, self.handle
        bits = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        return dict(sm_mhz=nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                    mem_mhz=nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                    temp_c=nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                    power_w=nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                    slowdown=[name for bit, name in self.reasons.items() if bits & bit])

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def open_gpu(device: torch.device, nvml=None) -> tuple[Gpu | None, str | None]:
    """(Gpu, None), or (None, why GPU telemetry is unavailable)."""
    if device.type != "cuda":
        return None, None
    try:
        return Gpu(device.index or 0, nvml), None
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    except Exception as e:  # NVMLError and its many subclasses (no driver, no permission, not supported)
        return None, f"NVML unavailable: {e}"


class Telemetry:
    """Samples the machine on a daemon thread between __enter__ and __exit__; summary() says what it saw."""

    def __init__(self, device: str | torch.device = "cpu", interval_s: float = INTERVAL_S, nvml=None):
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.nvml = nvml
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.gpu, self.gpu_error, self.gpu_static = None, None, {}
        self.load_before = self.load_after = None
        self.t0 = self.t1 = None

    def sample(self, first: bool = False) -> dict:
        # cpu_percent is the busy share since its previous call: the first call only starts the count
        busy = psutil.cpu_percent(interval=None)
        s = dict(t=time.monotonic(), cpu_mhz=cpu_mhz(), cpu_busy_pct=None if first else busy)
        if self.gpu is not None:
            try:
                s.update(self.gpu.sample())
            except Exception as e:  # an NVMLError mid-run: keep what was sampled, say why it stopped
                self.gpu_error = f"NVML stopped answering: {e}"
                self.gpu = None
        return s

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def __enter__(self) -> Telemetry:
        self.gpu, self.gpu_error = open_gpu(self.device, self.nvml)
        if self.gpu is not None:
            g = self.gpu
            self.gpu_static = dict(gpu_name=g.name, gpu_max_sm_mhz=g.max_sm_mhz, gpu_power_limit_w=g.power_limit_w)
        self.load_before, self.t0 = load_average(), time.monotonic()
        self.samples.append(self.sample(first=True))
        self._thread = threading.Thread(target=self._loop, name="decodescope-telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.sample())
        self.load_after, self.t1 = load_average(), time.monotonic()
        if self.gpu is not None:
            self.gpu.close()

    def summary(self) -> dict:
        """Flat figures for a bench JSON and the page; `flags` lists what makes the numbers suspect."""
        s = self.samples
        out = dict(sampled=True, samples=len(s), interval_s=self.interval_s,
                   duration_s=round((self.t1 or time.monotonic()) - self.t0, 2), **cpu_info(),
                   governor=governor(), cpu_mhz=spread([x["cpu_mhz"] for x in s]),
                   cpu_busy_pct=spread([x["cpu_busy_pct"] for x in s]),
                   load_before=self.load_before, load_after=self.load_after)
        flags = []
        if self.load_before and self.load_before[0] >= 0.5 * out["cpu_count"]:
            flags.append(f"busy machine: 1-min load {self.load_before[0]} before the run on {out['cpu_count']} cores")
        if self.device.type == "cuda":
            gpu = [x for x in s if "sm_mhz" in x]
            seen = sorted({r for x in gpu for r in x["slowdown"]})
            throttled = [x for x in gpu if x["slowdown"]]
            out.update(gpu_telemetry=self.gpu_error or "NVML", **self.gpu_static,
                       **{f"gpu_{k}": spread([x[k] for x in gpu]) for k in ("sm_mhz", "mem_mhz", "temp_c", "power_w")},
                       throttle_reasons=seen, throttled=bool(throttled), throttled_samples=len(throttled))
            if self.gpu_error:
                flags.append(f"GPU not sampled: {self.gpu_error}")
            if throttled:
                flags.append(f"GPU throttled in {len(throttled)}/{len(gpu)} samples ({', '.join(seen)})")
        out["flags"] = flags
        return out


def snapshot(device: str | torch.device = "cpu", nvml=None) -> dict:
    """The machine now, from one sample: for the app's environment card, and for a bench run that measured
    without Telemetry around it (sampled=False says so)."""
    tel = Telemetry(device, nvml=nvml)
    with tel:
        pass
    return dict(tel.summary(), sampled=False)


def _mid(d: dict | None, fmt: str = ".0f") -> str:
    if not d:
        return "n/a"
    if d["min"] == d["max"]:
        return format(d["median"], fmt)
    return f"{d['median']:{fmt}} median ({d['min']:{fmt}}-{d['max']:{fmt}})"


def describe(t: dict) -> dict[str, str]:
    """A summary (Telemetry.summary or snapshot) as label -> text, for RESULTS.md and the environment card."""
    flags = "; ".join(t.get("flags", [])) or "none"
    out = {
        "CPU": (f"{t['cpu_model']}" + (f" ({t['cpu_kind']}: {t['cpu_family_model']})" if t.get("cpu_kind") else "")
                + f", {t['cpu_count']} cores ({t['cpu_flags'] or 'no AVX2/AVX-512/NEON flags'})"),
        "CPU clock": f"{_mid(t.get('cpu_mhz'))} MHz, governor {t.get('governor') or 'not exposed'}",
        "load average": (f"{t['load_before'][0]:.2f} before, {t['load_after'][0]:.2f} after (1 min)"
                         if t.get("sampled") and t.get("load_after") else f"{t['load_before'][0]:.2f} (1 min)"),
    }
    if "gpu_telemetry" in t:
        if t.get("gpu_name"):
            out["GPU"] = (f"{t['gpu_name']} (max SM {t['gpu_max_sm_mhz']} MHz, power limit "
                          f"{t['gpu_power_limit_w']:.0f} W)")
        out["GPU clocks"] = f"SM {_mid(t.get('gpu_sm_mhz'))} MHz, memory {_mid(t.get('gpu_mem_mhz'))} MHz"
        out["GPU heat, power"] = (f"{_mid(t.get('gpu_temp_c'))} °C, {_mid(t.get('gpu_power_w'))} W"
                                  if t.get("gpu_sm_mhz") else t["gpu_telemetry"])
        out["throttling"] = (f"{', '.join(t['throttle_reasons'])} in {t['throttled_samples']} of {t['samples']} samples"
                             if t.get("throttled") else "none seen")
    out["sampled"] = (f"{t['samples']} samples over {t['duration_s']:.1f} s" if t.get("sampled")
                      else "one snapshot")
    out["flags"] = flags
    return out
