"""bench/cores.py: which processes are the browser's side, the cores each side is given, and the pin itself."""
import os
import shutil
import subprocess
import time

import pytest

from bench import cores


def test_the_browser_gets_a_quarter_of_the_cores_and_the_engine_the_rest():
    assert cores.split({0, 1}) == cores.Split(engine=frozenset({0}), browser=frozenset({1}))
    assert cores.split({2, 5, 7, 9}) == cores.Split(engine=frozenset({2, 5, 7}), browser=frozenset({9}))
    eight = cores.split(set(range(8)))
    assert eight.browser == {6, 7} and eight.engine == set(range(6))


def test_one_core_has_no_split_and_says_why():
    reason = cores.split({3})
    assert isinstance(reason, str) and "1 core" in reason and "at least 2" in reason


@pytest.fixture
def grandchild():
    """A shell (our child) that started a sleep (our grandchild)."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        for _ in range(100):  # the shell has forked its sleep
            below = cores.descendants(shell.pid)
            if below:
                break
            time.sleep(0.02)
        yield shell.pid, below
    finally:
        shell.kill()
        for pid in below:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shell.wait()


def test_descendants_are_children_and_theirs_only(grandchild):
    shell, below = grandchild
    assert len(below) == 1
    assert {shell, *below} <= set(cores.descendants(os.getpid()))
    assert os.getpid() not in cores.descendants(os.getpid())
    assert os.getppid() not in cores.descendants(os.getpid())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs at least 2 cores")
def test_a_pin_moves_every_thread_of_a_process_and_ran_on_reads_it_back(grandchild):
    shell, below = grandchild
    one = min(os.sched_getaffinity(0))
    before = cores.ran_on([shell])
    assert len(before) >= 2
    cores.pin(shell, {one})
    assert cores.ran_on([shell]) == [one] and cores.ran_on(below) == before  # a running child keeps its own
    assert cores.keep([shell, *below], frozenset({one})) == len(below)  # the sleep's one thread, brought over
    assert cores.ran_on(below) == [one] and cores.keep([shell, *below], frozenset({one})) == 0


def test_the_browsers_share_of_the_cores_between_two_stamps():
    c = cores.ChromiumCPU()
    c.samples = [(1000.0, 5.0), (1020.0, 5.01), (1500.0, 5.25), (2000.0, 5.5), (2020.0, 9.0)]
    assert c.cores(1010, 2010) == (5.5 - 5.01) / ((2000 - 1020) / 1e3)  # the samples inside the stretch only
    assert c.cores(1600, 1700) != c.cores(1600, 1700)  # fewer than two samples: NaN, not a guess
    assert c._cpu_s() >= 0  # the live reading works on this machine (0 with no Chromium of ours running)


def test_the_sampler_reads_the_browsers_processes_found_at_its_last_scan(tmp_path):
    """A sample reads only the Chromium processes the last scan found (the scan of /proc is the costly part, on the
    engine's interpreter lock), and a process's CPU time stays in the total after it ends."""
    fake = tmp_path / "chromium-fake"  # a process whose name says chrom, burning CPU for a moment
    shutil.copy("/bin/sh", fake)
    proc = subprocess.Popen([str(fake), "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
    c = cores.ChromiumCPU()
    c._scan()
    assert c.chromium == [proc.pid]
    readings = []
    while proc.poll() is None:
        readings.append(c._cpu_s())
        time.sleep(0.02)
    assert readings[-1] > 0
    c._scan()
    assert c.chromium == [] and c._cpu_s() == readings[-1]  # ended: its time kept in the total, not dropped
