"""Seeded, lazy drawing of distinct model specs for the measurement dataset."""

from __future__ import annotations

import random

from kubeseer.zoo import registry
from kubeseer.zoo.spec import SIZE_CLASSES, ModelSpec, SizeClass

# How many draws per requested spec before concluding the size class's space is exhausted.
_ATTEMPTS_PER_SPEC = 50


class SamplerExhaustedError(RuntimeError):
    """The family's space for that size class has fewer distinct specs than requested."""


def sample_specs(family: str, n: int, seed: int, *, size: SizeClass = "small") -> list[ModelSpec]:
    """Draw `n` distinct, valid specs of `family` in size class `size`.

    The stream depends only on (family, size, seed), so a dataset can be regenerated exactly,
    and drawing a larger `n` with the same seed extends a smaller draw rather than replacing
    it. Specs are only validated, never built, so drawing thousands takes milliseconds.

    Raises:
        InvalidSpecError: unknown family.
        ValueError: `n` is negative or `size` is not a size class.
        SamplerExhaustedError: fewer than `n` distinct specs turned up.
    """
    fam = registry.family(family)
    if size not in SIZE_CLASSES:
        raise ValueError(f"size must be one of {', '.join(SIZE_CLASSES)}, got {size!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # A string seed is hashed with SHA-512 by `random`, so it is stable across processes.
    rng = random.Random(f"kubeseer.zoo:{family}:{size}:{seed}")
    specs: dict[str, ModelSpec] = {}
    for _ in range(n * _ATTEMPTS_PER_SPEC):
        if len(specs) == n:
            break
        drawn = fam.sample(rng, size)
        specs.setdefault(drawn.config_hash(), drawn)
    if len(specs) < n:
        raise SamplerExhaustedError(
            f"only {len(specs)} distinct {family} specs of size {size!r} in "
            f"{n * _ATTEMPTS_PER_SPEC} draws; asked for {n}"
        )
    return list(specs.values())
