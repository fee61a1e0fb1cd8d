"""The `kubeseer` command line: one entry point, one subcommand module per room of the house.

Each module listed in `COMMAND_MODULES` exposes `register(subparsers)`, which adds its
subcommands and sets `handler` (a callable taking the parsed namespace and returning an exit
code). Command modules import heavy dependencies (torch, kopf) inside their handlers, so that
`kubeseer --help` and light commands stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

import kubeseer

COMMAND_MODULES = (
    "kubeseer.predictor.commands",
    "kubeseer.plan_command",
    "kubeseer.zoo.commands",
    "kubeseer.measure.commands",
    # After measure: adds `pull` to its `dataset` group.
    "kubeseer.observations.commands",
    "kubeseer.devcluster.commands",
    "kubeseer.operator.commands",
    "kubeseer.extender.commands",
    "kubeseer.profiler.commands",
    "kubeseer.demo",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """Assemble the parser from every command module."""
    parser = argparse.ArgumentParser(
        prog="kubeseer",
        description="Predict GPU memory, SM utilisation and step time of DL jobs from ONNX graphs, "
        "and right-size them on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"kubeseer {kubeseer.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
