"""`python -m kubeseer.operator run ...`: the operator without the rest of the CLI's commands.

Child processes (restart tests, the benchmark) start the operator this way, so that they do not
import every other room's command module just to parse `operator run`.
"""

from __future__ import annotations

import argparse
import sys

from kubeseer.operator import commands


def main() -> int:
    """Parse `run ...` as `kubeseer operator run ...` would, and run it."""
    parser = argparse.ArgumentParser(prog="python -m kubeseer.operator")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["operator", *sys.argv[1:]])
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
