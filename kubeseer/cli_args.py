"""Argument types the subcommands share, so that a bad batch size or `--input` reads the same
whichever command it is given to (standard library only: `kubeseer --help` stays fast)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A whole number of at least 1 (batch sizes, counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def input_binding(text: str) -> tuple[str, int]:
    """`NAME=VALUE`: a size for one of the model's symbolic input dimensions."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, positive_int(value)
