"""`python -m kubeseer.measure ACTION ...`: the dataset commands without the full CLI.

On a bare GPU image only this package's dependencies are installed, so the harness must not
go through `kubeseer.cli`, which imports every room's commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kubeseer.measure import commands


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `kubeseer dataset`'s arguments and run the chosen action."""
    parser = argparse.ArgumentParser(prog="python -m kubeseer.measure")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dataset", *(argv if argv is not None else sys.argv[1:])])
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
