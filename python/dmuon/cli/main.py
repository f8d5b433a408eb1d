"""`python -m dmuon <command>`: train | plan | bench."""

from __future__ import annotations

import argparse
import importlib

# Each module exposes register(subparsers), which adds its parser and sets `func`.
_COMMAND_MODULES = ("dmuon.cli.train.command", "dmuon.cli.plan.command", "dmuon.cli.bench.command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dmuon", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; bad input raises ValueError (dmuon.cli.usage.UsageError) naming the argument."""
    return _run(argv, usage_errors=False)


def cli(argv: list[str] | None = None) -> int:
    """The command line: main(), with bad input reported as argparse reports its own errors
    (the subcommand's usage, "PROG: error: …", exit status 2, no traceback)."""
    return _run(argv, usage_errors=True)


def _run(argv: list[str] | None, usage_errors: bool) -> int:
    from dmuon.cli.usage import UsageError, leaf_parser

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        if not usage_errors:
            raise
        leaf_parser(parser, args).error(str(error))  # NOTE: exits with status 2
        raise

