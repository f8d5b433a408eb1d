"""Bad command-line input reported as argparse reports its own errors: the subcommand's usage
line, then "PROG: error: MESSAGE", exit status 2, no traceback."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator


class UsageError(ValueError):
    """A command-line value that cannot be used (raised by a subcommand's input checks)."""


@contextlib.contextmanager
def input_checks() -> Iterator[None]:
    """Inside: a ValueError (a subcommand reading its arguments) becomes a UsageError."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_at_least(args, **lows: float) -> None:
    """Every named argument of `args` that is given (not None) at least its low bound, else
    an error naming it (`--warmup must be >= 0, got -1`; NaN is refused too)."""
    for name, low in lows.items():
        value = getattr(args, name)
        if value is not None and not value >= low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def leaf_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser that parsed the chosen subcommand, following each subparsers choice."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, actions[0].dest, None) if actions else None
        if chosen is None:
            return parser
        parser = actions[0].choices[chosen]
