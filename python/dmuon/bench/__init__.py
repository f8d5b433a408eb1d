"""Benchmarks: `python -m dmuon bench ns | step`."""
