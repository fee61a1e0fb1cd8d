"""Byte units, defined once for every room (memory figures, size limits, messages in MiB)."""

from __future__ import annotations

from typing import Final

KIB: Final[int] = 1 << 10
MIB: Final[int] = 1 << 20
GIB: Final[int] = 1 << 30
