"""The sha256 digest as kubeseer writes it everywhere: 64 lower-case hex digits.

A model is known by the sha256 of its serialised bytes (DLJob `spec.model.sha256`, the fetch
cache's file names, `Prediction.model_digest`), so one spelling is checked in one place.
"""

from __future__ import annotations

import re
from typing import Final

SHA256_HEX: Final[re.Pattern[str]] = re.compile(r"[0-9a-f]{64}")
"""A sha256 in lower-case hex; use `fullmatch` (or `is_sha256`)."""


def is_sha256(text: str) -> bool:
    """Whether `text` is exactly a lower-case hex sha256."""
    return SHA256_HEX.fullmatch(text) is not None
