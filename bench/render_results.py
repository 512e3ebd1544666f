"""Render docs/RESULTS.md from the benchmark files in bench/results/ (never typed by hand).

Each NAME.md table is copied under a heading, followed by the provenance its NAME.json recorded and the
state of the machine while it ran (clocks, heat, power and throttling on a GPU; frequency and load on a CPU),
with what makes its numbers suspect flagged.

    python -m bench.render_results [--results bench/results] [--out docs/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.observe.provenance import describe

HERE = Path(__file__).resolve().parent
PROVENANCE_KEYS = ("commit", "dirty", "time", "device", "gpu", "driver", "torch", "torch_cuda", "cpu",
                   "cpu_count", "torch_threads")


def provenance_line(prov: dict) -> str:
    parts = [f"{k}={prov[k]}" for k in PROVENANCE_KEYS if prov.get(k) not in (None, "")]
    return "Provenance: " + ", ".join(parts)


def conditions_lines(prov: dict) -> list[str]:
    """The machine while the benchmark ran; a flagged run says so first. Older results have no telemetry."""
    if "telemetry" not in prov:
        return ["Conditions: not recorded (this result predates telemetry)."]
    d = describe(prov["telemetry"])
    flags = d.pop("flags")
    head = f"**Flagged: {flags}.** " if flags != "none" else "Nothing flagged. "
    return [head + "Conditions: " + "; ".join(f"{k}: {v}" for k, v in d.items()) + "."]


def llamacpp_lines(data: dict) -> list[str]:
    """The anchor's own provenance, where a result timed llama.cpp (bench/llamacpp.py describe()): the binding's
    version and system_info, llama-bench's version and build flags, and the settings both ran with."""
    info = data.get("llamacpp_info") or (data["llamacpp"] if isinstance(data.get("llamacpp"), dict) else None)
    if not info:
        return []
    settings = ", ".join(f"{k}={v}" for k, v in info.get("settings", {}).items())
    parts = [f"binding: {info.get('python')}"]
    if info.get("system_info"):
        parts.append(f"system_info: `{info['system_info']}`")
    parts.append(f"llama-bench: {info.get('llama_bench_version', info.get('llama_bench'))}".replace("\n", "; "))
    if info.get("llama_bench_build"):
        parts.append(f"built as `{info['llama_bench_build']}`")
    return ["llama.cpp: " + "; ".join(parts) + (f"; settings: {settings}." if settings else "."), ""]


def render(results: Path) -> str:
    out = ["# decodescope benchmark results", "",
           f"Rendered by `python -m bench.render_results` from the files in `{results.name}/`; each table is",
           "the markdown its benchmark wrote, followed by the provenance in its JSON and the machine's state while",
           "it ran (a run on a busy CPU or a throttled GPU is flagged).", ""]
    for md in sorted(results.glob("*.md")):
        data = json.loads(md.with_suffix(".json").read_text()) if md.with_suffix(".json").exists() else {}
        out += [f"## {md.stem}", "", md.read_text().rstrip(), ""]
        out += llamacpp_lines(data)
        if "provenance" in data:
            out += [provenance_line(data["provenance"]), "", *conditions_lines(data["provenance"]), ""]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(HERE / "results"))
    p.add_argument("--out", default=str(HERE.parent / "docs" / "RESULTS.md"))
    args = p.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(render(Path(args.results)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
