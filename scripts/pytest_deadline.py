"""A per-test deadline and a record of every test as it runs, for the GPU check's pytest processes (the GPU machine
has no pytest-timeout to count on). scripts/gpu_check.py loads it with `-p pytest_deadline`, scripts/ on PYTHONPATH:

    --deadline S     a test still running after S seconds dumps every thread's stack and ends the process
                     (faulthandler, stdlib): one hang costs S, not the step's whole time cap. The stacks go to the
                     records file (pytest's capture holds stderr while a test runs), else to stderr.
    --records FILE   one JSON line when a test starts and one per phase report: what ran survives a process that
                     was killed or timed out, where --junitxml is written only at the end

A failed test after which the CUDA context no longer answers (an illegal memory access poisons every later CUDA
call in the process) stops the session, saying so: the tests after it would only repeat that error.
"""
from __future__ import annotations

import faulthandler
import json
import sys

import pytest

_records = None  # the open --records file, if any


def pytest_addoption(parser):
    group = parser.getgroup("deadline", "per-test deadline and records (scripts/gpu_check.py)")
    group.addoption("--deadline", type=float, default=0.0, help="seconds a test may run before the process ends")
    group.addoption("--records", default=None, help="append a JSON line per test start and phase report here")


def pytest_configure(config):
    global _records
    path = config.getoption("records")
    _records = open(path, "a", buffering=1) if path else None  # line-buffered: each record lands as it is written


def pytest_unconfigure(config):
    if _records is not None:
        _records.close()


def _write(**record) -> None:
    if _records is not None:
        _records.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid, location):
    _write(event="start", nodeid=nodeid)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        message = report.longreprtext.strip().splitlines()[-1][:300] if report.failed and report.longreprtext else None
        _write(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
               seconds=round(report.duration, 3), message=message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    seconds = item.config.getoption("deadline")
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=True, file=_records or sys.stderr)
    try:
        yield
    finally:
        if seconds > 0:
            faulthandler.cancel_dump_traceback_later()


def cuda_context_error() -> str | None:
    """Why the CUDA context no longer answers, or None (also when this process never used CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        return str(e).strip().splitlines()[0]
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and (error := cuda_context_error()):
        item.session.shouldstop = f"the CUDA context is unusable after {item.nodeid}: {error}"
        _write(event="stop", nodeid=item.nodeid, message=error)
