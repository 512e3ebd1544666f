"""Benchmarks: run from the repository root as `python -m bench.<name>`; results go to bench/results/."""
