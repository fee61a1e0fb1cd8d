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

A metric labelled on few configurations (GPU training step time: timm's public benchmark
trains on one GPU of four) can land on fewer calibration configurations than a conformal bound
needs (19 at 95 %); `ensure_calibration` then moves configurations that label it from the
training part into calibration. The bound is never dropped nor narrowed for want of
calibration data; the price is training data for that metric.

Configurations named `training_only` belong to a draw whose held-out counterpart is a set of
its own (the Llama family's training draw beside `data/held-out-llama`): a split takes them out
first (`apart`) and adds them to its training part after (`trained_also_on`), so they never sit
in validation, calibration or test and the seeded split of every other configuration is the
one it was without them. They are named by config hash, not marked on the samples: PyG cannot
batch samples whose attributes differ.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
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
    moved: tuple[tuple[str, int], ...] = ()
    """Per metric, the configurations `ensure_calibration` moved from training to calibration."""
    training_only: frozenset[str] = frozenset()
    """Training configurations that no other part may take (`trained_also_on`)."""

    def describe(self) -> str:
        """One line for logs and reports."""
        what = self.kind.value + (
            f" (held out: {self.held_out_family})" if self.held_out_family else ""
        )
        moves = "".join(
            f"; {n} configurations labelled {metric} moved from train to calibration"
            for metric, n in self.moved
        )
        return (
            f"{what}, seed {self.seed}: {len(self.train)} train, {len(self.val)} val, "
            f"{len(self.calibration)} calibration, {len(self.test)} test samples{moves}"
        )


def apart(samples: Sequence[Data], training_only: Collection[str]) -> tuple[list[Data], list[Data]]:
    """The samples a split partitions, and those of the `training_only` configurations, each
    in given order."""
    named = frozenset(training_only)
    return (
        [s for s in samples if str(s.config_hash) not in named],
        [s for s in samples if str(s.config_hash) in named],
    )


def trained_also_on(split: Split, extra: Sequence[Data]) -> Split:
    """`split` with `extra` appended to its training part.

    Raises:
        SplitError: a configuration of `extra` is in another part of `split`, which would put
            one configuration on both sides.
    """
    elsewhere = {str(s.config_hash) for s in (*split.val, *split.calibration, *split.test)}
    clash = sorted(elsewhere.intersection(_configs(extra)))
    if clash:
        raise SplitError(f"training-only configurations also outside training: {clash[:3]}")
    return replace(
        split,
        train=[*split.train, *extra],
        training_only=split.training_only.union(_configs(extra)),
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


def random_split(samples: Sequence[Data], seed: int, training_only: Collection[str] = ()) -> Split:
    """Configurations shuffled with `seed`, then 2:1:1 into train, validation (half of it
    calibration) and test; the `training_only` configurations all in train."""
    samples, extra = apart(samples, training_only)
    hashes = _configs(samples)
    if len(hashes) < 8:
        raise SplitError(f"a random split needs at least 8 configurations, got {len(hashes)}")
    rng = random.Random(seed)
    train, val, test = _partition(hashes, (2, 1, 1), rng)
    stop, calibration = _partition(sorted(val), (1, 1), rng)
    split = Split(
        SplitKind.RANDOM,
        seed,
        None,
        _take(samples, train),
        _take(samples, stop),
        _take(samples, calibration),
        _take(samples, test),
    )
    return trained_also_on(split, extra)


def family_split(
    samples: Sequence[Data], held_out_family: str, seed: int, training_only: Collection[str] = ()
) -> Split:
    """`held_out_family` is the test set; the rest split 3:1 (validation halved for
    calibration); the `training_only` configurations all in train."""
    samples, extra = apart(samples, training_only)
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
    split = Split(
        SplitKind.FAMILY,
        seed,
        held_out_family,
        _take(rest, train),
        _take(rest, stop),
        _take(rest, calibration),
        [s for s in samples if s.family == held_out_family],
    )
    return trained_also_on(split, extra)


def make_split(
    samples: Sequence[Data],
    kind: SplitKind | str,
    seed: int,
    held_out_family: str | None = None,
    training_only: Collection[str] = (),
) -> Split:
    """Dispatch on `kind`; a family split needs `held_out_family`."""
    kind = SplitKind(kind)
    if kind is SplitKind.RANDOM:
        return random_split(samples, seed, training_only)
    if held_out_family is None:
        raise SplitError("a family split needs the family to hold out")
    return family_split(samples, held_out_family, seed, training_only)


def _labelled(samples: Sequence[Data], column: int) -> list[str]:
    """Config hashes, in first-seen order, of the samples that carry label `column`."""
    return _configs([s for s in samples if bool(s.y_mask[0, column])])


def ensure_calibration(
    split: Split, metrics: Sequence[str], needed: int, *, short_ok: bool = False
) -> Split:
    """`split` with at least `needed` calibration configurations labelled with each metric
    that training labels, moved from the training part where calibration has fewer.

    With `short_ok`, a metric whose training part cannot give enough keeps its split as it is
    instead (a fine-tune on a few observations, calibrated by `conformal.calibrate`'s
    `short_covers_all`): moving nearly all of them would leave nothing to learn from.

    `metrics` names the label columns (``y``/``y_mask``) in order. The configurations moved
    are the first of the metric's training configurations in an order shuffled with the
    split's seed, chosen without looking at any label or prediction: the calibration and test
    configurations of that metric stay random subsets of its configurations, exchangeable with
    each other, so its conformal bound keeps its guarantee. Test and early-stopping parts are
    never touched, nor are training-only samples. A metric no training sample labels is left
    alone (nothing can learn it).

    Raises:
        SplitError: training cannot give enough configurations of a metric and keep one.
    """
    train, calibration, moved = list(split.train), list(split.calibration), []
    for column, metric in enumerate(metrics):
        have = len(_labelled(calibration, column))
        kept, _ = apart(train, split.training_only)
        offered = sorted(_labelled(kept, column))
        if have >= needed or not offered:
            continue
        short = needed - have
        if short >= len(offered) and short_ok:
            continue
        if short >= len(offered):
            raise SplitError(
                f"{metric}: {have} calibration and {len(offered)} training configurations carry "
                f"its label; a conformal bound needs {needed} in calibration and training at "
                "least one"
            )
        random.Random(f"{split.seed}:{metric}").shuffle(offered)
        taken = set(offered[:short])
        calibration += [s for s in train if str(s.config_hash) in taken]
        train = [s for s in train if str(s.config_hash) not in taken]
        moved.append((metric, short))
    if not moved:
        return split
    return replace(split, train=train, calibration=calibration, moved=(*split.moved, *moved))
