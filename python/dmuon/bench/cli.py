"""`python -m dmuon bench <what>`: each benchmark module registers its own subcommand."""

from __future__ import annotations

import importlib

# Each module exposes register(subparsers) and sets `func` on its parser.
_BENCH_MODULES = ("dmuon.bench.ns", "dmuon.bench.step", "dmuon.bench.e2e")


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (each prints one table headed by the environment)")
    bench_subparsers = parser.add_subparsers(dest="bench", required=True)
    for name in _BENCH_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue  # NOTE: a benchmark whose module is not written yet is simply absent
        module.register(bench_subparsers)
