"""`python -m dmuon bench <what>`: each benchmark module registers its own subcommand."""

from __future__ import annotations

from dmuon.cli.bench import e2e, ns, step, sym


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (each prints one table headed by the environment)")
    bench_subparsers = parser.add_subparsers(dest="bench", required=True)
    for module in (ns, step, sym, e2e):
        module.register(bench_subparsers)
