"""Watching the engine run: what its figures rest on, none of it on the decode path.

    profile.py      torch.profiler over a few steps -> rows per layer and op class, bytes moved, GB/s
    breakdown.py    a recorded trace -> where a step's time went (pure: no torch)
    bandwidth.py    the memory bandwidth measured on the spot, the ceiling a decode step is held against
    provenance.py   the machine while a benchmark ran: CPU model and flags, load, GPU clocks and throttling
"""
