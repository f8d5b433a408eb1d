"""`python -m dmuon <command>`: train | plan | bench."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes register(subparsers), which adds its parser and sets `func`.
_COMMAND_MODULES = ("dmuon.train.cli", "dmuon.plan.cli", "dmuon.bench.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dmuon", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dmuon.cli_usage import UsageError, leaf_parser

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as error:
        leaf_parser(parser, args).error(str(error))  # NOTE: exits with status 2, as argparse's own errors
        raise


if __name__ == "__main__":
    sys.exit(main())
