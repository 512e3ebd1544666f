"""bench.ui's own arithmetic (the benchmark itself needs Chromium and minutes: `python -m bench.ui`)."""


def test_ui_bench_reads_the_browsers_share_of_the_cores_between_two_stamps():
    from bench.ui import ChromiumCPU

    c = ChromiumCPU()
    c.samples = [(1000.0, 5.0), (1020.0, 5.01), (1500.0, 5.25), (2000.0, 5.5), (2020.0, 9.0)]
    assert c.cores(1010, 2010) == (5.5 - 5.01) / ((2000 - 1020) / 1e3)  # the samples inside the stretch only
    assert c.cores(1600, 1700) != c.cores(1600, 1700)  # fewer than two samples: NaN, not a guess
    assert c._cpu_s() >= 0  # the live reading works on this machine (0 with no Chromium running)
