"""Seeded train/validation/calibration/test splits that never split a model configuration.

A configuration (one `config_hash`) appears at several batch sizes and precisions; if some of
those sat in training and others in test, the test would measure interpolation over batch
size of a model already seen, not prediction for a new model. Every split therefore assigns
whole configurations.

- ``random``: the paper's 2:1:1 train/validation/test over configurations (section 4.1).
- ``family``: leave one model family out (unseen architectures): the held-out family is the
  test set; the other families are split 3:1 into train and validation.

Split conformal calibration needs data the model was not fitted on, so the validation part is
split once more in half: one half drives early stopping and the learning-rate schedule, the
other calibrates the upper bounds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from torch_geometric.data import Data


class SplitKind(StrEnum):
    """How test configurations are chosen."""

    RANDOM = "random"
    FAMILY = "family"


class SplitError(ValueError):
    """A split that cannot be made from the given samples (too few configurations, no family)."""


@dataclass(frozen=True)
class Split:
    """Four disjoint sets of samples; no config hash is in more than one."""

    kind: SplitKind
    seed: int
    held_out_family: str | None
    train: list[Data]
    val: list[Data]
    calibration: list[Data]
    test: list[Data]

    def describe(self) -> str:
        """One line for logs and reports."""
        what = self.kind.value + (
            f" (held out: {self.held_out_family})" if self.held_out_family else ""
        )
        return (
            f"{what}, seed {self.seed}: {len(self.train)} train, {len(self.val)} val, "
            f"{len(self.calibration)} calibration, {len(self.test)} test samples"
        )


def _configs(samples: Sequence[Data]) -> list[str]:
    """Distinct config hashes in first-seen order, so the result does not depend on set order."""
    return list(dict.fromkeys(str(s.config_hash) for s in samples))


def _partition(hashes: list[str], ratios: Sequence[int], rng: random.Random) -> list[set[str]]:
    shuffled = sorted(hashes)
    rng.shuffle(shuffled)
    total = sum(ratios)
    bounds, acc = [], 0
    for r in ratios:
        acc += r
        bounds.append(round(len(shuffled) * acc / total))
    parts, start = [], 0
    for end in bounds:
        parts.append(set(shuffled[start:end]))
        start = end
    return parts


def _take(samples: Sequence[Data], hashes: set[str]) -> list[Data]:
    return [s for s in samples if str(s.config_hash) in hashes]


def random_split(samples: Sequence[Data], seed: int) -> Split:
    """Configurations shuffled with `seed`, then 2:1:1 into train, validation (half of it
    calibration) and test."""
    hashes = _configs(samples)
    if len(hashes) < 8:
        raise SplitError(f"a random split needs at least 8 configurations, got {len(hashes)}")
    rng = random.Random(seed)
    train, val, test = _partition(hashes, (2, 1, 1), rng)
    stop, calibration = _partition(sorted(val), (1, 1), rng)
    return Split(
        SplitKind.RANDOM,
        seed,
        None,
        _take(samples, train),
        _take(samples, stop),
        _take(samples, calibration),
        _take(samples, test),
    )


def family_split(samples: Sequence[Data], held_out_family: str, seed: int) -> Split:
    """`held_out_family` is the test set; the rest split 3:1 (validation halved for
    calibration)."""
    families = sorted({str(s.family) for s in samples})
    if held_out_family not in families:
        raise SplitError(f"no samples of family {held_out_family!r}; families: {families}")
    if len(families) < 2:
        raise SplitError("leave-one-family-out needs at least two families")
    rest = [s for s in samples if s.family != held_out_family]
    hashes = _configs(rest)
    if len(hashes) < 6:
        raise SplitError(f"only {len(hashes)} configurations outside {held_out_family}")
    rng = random.Random(seed)
    train, val = _partition(hashes, (3, 1), rng)
    stop, calibration = _partition(sorted(val), (1, 1), rng)
    return Split(
        SplitKind.FAMILY,
        seed,
        held_out_family,
        _take(rest, train),
        _take(rest, stop),
        _take(rest, calibration),
        [s for s in samples if s.family == held_out_family],
    )


def make_split(
    samples: Sequence[Data], kind: SplitKind | str, seed: int, held_out_family: str | None = None
) -> Split:
    """Dispatch on `kind`; a family split needs `held_out_family`."""
    kind = SplitKind(kind)
    if kind is SplitKind.RANDOM:
        return random_split(samples, seed)
    if held_out_family is None:
        raise SplitError("a family split needs the family to hold out")
    return family_split(samples, held_out_family, seed)
