"""Benchmarks: `python -m dmuon bench ns | step | e2e` (command.py registers them)."""
