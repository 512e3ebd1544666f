"""csrc/format_list.h, the one list of weight formats, against engine/weights' records (engine/ops check_formats).

The list's rows are read from the header's text (no build), the CPU module's and the CUDA emulation's reports of
them from the compiled code; a record changed on the Python side only must make the OpSet's build refuse, naming
the format and the fact.
"""
from __future__ import annotations

import dataclasses
import re

import pytest

from engine import ops, weights
from engine.ops import ext

ROW = re.compile(r"^\s*X\((\w+), ([\d.]+), (\d+), (yes|no), (\w+), (\w+), (gemv|int8|q4|no)\)", re.M)


def list_rows() -> dict[str, tuple]:
    text = (ext.CSRC / "format_list.h").read_text()
    rows = ROW.findall(text)
    assert len(rows) == len({r[0] for r in rows}), "a format is listed twice"
    return {r[0]: r[1:] for r in rows}


def test_the_list_has_every_record_once_with_its_facts():
    rows = list_rows()
    assert set(rows) == set(weights.REGISTRY)
    for name, (bits, block, cpu, _, activations, cuda) in rows.items():
        f = weights.REGISTRY[name]
        assert (float(bits), int(block), activations) == (f.bits, f.block, f.cpu_activations), name
        assert (cpu == "yes") == ("cpu" in f.layouts), name
        assert (cuda != "no") == (f.cuda_kernel is not None), name


def test_the_cuda_gemv_formats_are_the_gemv_rows():
    """blocks::Format (csrc/cuda/blocks.cuh) is generated from the rows whose cuda column says gemv."""
    assert [n for n, r in list_rows().items() if r[-1] == "gemv"] == ["fp16", "bf16", "int8", "q4"]


def facts_of(target: str) -> dict[str, dict]:
    runs = {"cpu": lambda f: "cpu" in f.layouts, "cuda": lambda f: f.cuda_kernel is not None}[target]
    return {n: dict(bits=f.bits, block=f.block) for n, f in weights.REGISTRY.items() if runs(f)}


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_check_formats_names_each_difference(target):
    ops.check_formats(target, facts_of(target))  # agreeing lists pass
    facts = facts_of(target)
    facts["q4"]["bits"] = 4.0
    del facts["int8"]
    facts["q3"] = dict(bits=3.5, block=32)
    with pytest.raises(RuntimeError) as e:
        ops.check_formats(target, facts)
    msg = str(e.value)
    for part in ("q4.bits is 4.0 in csrc/format_list.h, 5.0 in engine/weights", "int8 is in engine/weights only",
                 "q3 is in csrc/format_list.h only", target.upper()):
        assert part in msg, msg


@pytest.fixture(scope="module")
def cpu_module():
    status = ext.load("cpu")
    if status.module is None:
        pytest.skip(f"needs the CPU kernels: {status.reason}")
    return status.module


def test_the_cpu_module_reports_the_list(cpu_module):
    rows = list_rows()
    facts = cpu_module.format_facts()
    assert list(facts) == cpu_module.formats() == [n for n, r in rows.items() if r[2] == "yes"]
    assert all(facts[n]["cpu_activations"] == rows[n][4] for n in facts)
    assert ops.cpu_ops().name == "fused"


def test_a_record_the_cpu_module_disagrees_with_refuses_the_load(cpu_module, monkeypatch):
    monkeypatch.setitem(weights.REGISTRY, "q4_k", dataclasses.replace(weights.REGISTRY["q4_k"],
                                                                      cpu_activations="int8"))
    with pytest.raises(RuntimeError, match="q4_k.cpu_activations is 'q8_k' in csrc/format_list.h, 'int8'"):
        ops.select("cpu")
    monkeypatch.setitem(weights.REGISTRY, "fp16x", dataclasses.replace(weights.REGISTRY["fp16"], name="fp16x"))
    with pytest.raises(RuntimeError, match="fp16x is in engine/weights only"):  # a CPU layout, no CPU kernel
        ops.cpu_ops()


@pytest.mark.emulation
def test_the_cuda_emulation_reports_the_list_and_refuses_a_disagreeing_record(monkeypatch):
    from cuda_backends import EmulatedModule

    module = EmulatedModule()
    assert module.format_facts() == facts_of("cuda")
    assert set(ops.cuda_ops(module, "emulated").linear) >= set(facts_of("cuda"))
    monkeypatch.setitem(weights.REGISTRY, "q8", dataclasses.replace(weights.REGISTRY["q8"], cuda_kernel=None))
    with pytest.raises(RuntimeError, match="q8 is in csrc/format_list.h only"):
        ops.cuda_ops(module, "emulated")
