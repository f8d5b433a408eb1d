"""`python -m dmuon <command>` (and the `dmuon` script): the CLI of dmuon.cli."""

import sys

from dmuon.cli.main import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    sys.exit(cli())
