"""Split conformal upper bounds: a per-metric margin that makes ``upper >= true`` hold with a
chosen probability.

The operator sizes a GPU slice from the upper bound, not the point estimate, so the bound must
mean what it says. Split conformal prediction (Vovk et al.; Lei et al., 2018) gives that
guarantee without assumptions on the model: on held-out calibration samples, compute the
score ``s = log(y) - log(y_hat)`` (how many times larger the truth was than the prediction),
take the ``ceil((n + 1) * coverage) / n`` empirical quantile ``q``, and bound every future
prediction by ``y_hat * exp(q)``. For exchangeable data, ``P(y <= upper) >= coverage``.

Log-ratio scores make the margin relative (a 10 % margin on 1 GiB and on 40 GiB alike), which
suits errors that scale with the target. A negative quantile (a model that over-predicts) is
clamped to 0 so the bound is never below the point estimate; that only raises coverage.

The exchangeable unit is a configuration, not a sample: the splits assign whole
configurations, and the errors of one model at batch 8 and batch 64 move together. Calibrating
on samples one by one would count one configuration's error many times and under-cover new
configurations, so `train` passes each sample's config hash and the score of a configuration is
its largest log-ratio.

On an unseen model family the calibration samples are not exchangeable with the test samples,
so the guarantee does not carry over; `eval` reports the empirical coverage for that reason.

Labels are not the only evidence. A job that ran out of memory on a card is right-censored
evidence: it needed more than the card, by an unknown amount. `censored_margin` turns such
failures into the margin that makes the bound say "does not fit" for them, which widens (never
replaces) the margin fitted on labels; `Calibration.widened` applies it.

A prediction for a domain no calibration sample came from (step time on a GPU without step
labels) is a shift, not an exchangeable draw. `shift_margin` measures the extra margin such a
domain needs by leaving each known domain out in turn; `Calibration.raised` adds it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubeseer.predictor import calibration

DEFAULT_COVERAGE = 0.95


class CalibrationError(ValueError):
    """Too few calibration samples for the requested coverage, or a bad coverage."""


def minimum_calibration(coverage: float) -> int:
    """The fewest scores (configurations) that give a finite bound at `coverage`: the least
    ``n`` whose corrected rank ``ceil((n + 1) * coverage)`` is at most ``n`` (19 at 95 %).

    Splits use it to give every metric enough calibration configurations
    (`kubeseer.predictor.splits.ensure_calibration`).
    """
    if not 0 < coverage < 1:
        raise CalibrationError(f"coverage must be in (0, 1), got {coverage}")
    n = 1
    while math.ceil((n + 1) * coverage) > n:
        n += 1
    return n


def conformal_quantile(scores: npt.NDArray[np.float64], coverage: float) -> float:
    """The finite-sample-corrected conformal quantile of `scores`.

    Raises:
        CalibrationError: fewer than `minimum_calibration` scores, where the corrected rank
            exceeds the sample and no finite bound is valid.
    """
    needed = minimum_calibration(coverage)
    n = scores.size
    if n < needed:
        raise CalibrationError(
            f"{n} calibration samples cannot support coverage {coverage}: need at least {needed}"
        )
    return float(np.sort(scores)[math.ceil((n + 1) * coverage) - 1])


def worst_per_group(groups: Iterable[object], scores: Iterable[float]) -> npt.NDArray[np.float64]:
    """One score per group (configuration), the largest of its samples': the exchangeable unit
    is the configuration, and a bound covers it only if it covers all its samples."""
    worst: dict[str, float] = {}
    for group, score in zip(groups, scores, strict=True):
        worst[str(group)] = max(worst.get(str(group), -math.inf), float(score))
    return np.fromiter(worst.values(), dtype=np.float64)


def calibrate(
    predicted: npt.NDArray[np.float64],
    true: npt.NDArray[np.float64],
    mask: npt.NDArray[np.bool_],
    metrics: Sequence[str],
    coverage: float = DEFAULT_COVERAGE,
    groups: Sequence[str] | None = None,
    offsets: Sequence[float] | None = None,
    short_covers_all: bool = False,
) -> calibration.Calibration:
    """Fit per-metric margins on calibration predictions and labels ``(N, T)``.

    With `short_covers_all`, a metric with fewer scores than `coverage` needs gets the margin
    that covers every one of them instead of an error: a new configuration is then covered with
    probability n / (n + 1) for n scores, less than `coverage`, and its count in
    `Calibration.samples` says so (a fine-tune on a few observations keeps the
    larger of that and its base's margin).

    `groups` names the exchangeable unit of each sample (its configuration). Samples of one
    configuration at several batch sizes share their errors, so they are not exchangeable one
    by one; with groups, each group contributes one score, the largest of its samples, and the
    guarantee becomes "all samples of a new configuration are covered with probability at
    least `coverage`", which implies the per-sample one.

    `offsets` (label units per metric) shift labels and predictions before the log-ratio:
    the score is ``log(y + c) - log(y_hat + c)``, still a fixed function of the sample and
    the fitted model, so the guarantee is unchanged; it holds for ``y + c``, which is the
    figure served (`calibration.Calibration`).
    """
    if groups is not None and len(groups) != predicted.shape[0]:
        raise CalibrationError(f"{len(groups)} groups for {predicted.shape[0]} samples")
    shifts = tuple(float(c) for c in offsets) if offsets is not None else ()
    if shifts and len(shifts) != len(metrics):
        raise CalibrationError(f"{len(shifts)} offsets for {len(metrics)} metrics")
    margins, counts = [], []
    for k, metric in enumerate(metrics):
        present = mask[:, k]
        if not present.any():
            if not short_covers_all:
                raise CalibrationError(f"no calibration sample has a label for {metric}")
            margins.append(0.0)
            counts.append(0)
            continue
        shift = shifts[k] if shifts else 0.0
        scores = np.log(true[present, k] + shift) - np.log(predicted[present, k] + shift)
        if groups is not None:
            scores = worst_per_group(np.asarray(groups)[present], scores)
        if short_covers_all and scores.size < minimum_calibration(coverage):
            margins.append(max(0.0, float(scores.max())))
        else:
            try:
                margins.append(max(0.0, conformal_quantile(scores, coverage)))
            except CalibrationError as e:
                raise CalibrationError(f"{metric}: {e}") from e
        counts.append(int(scores.size))
    return calibration.Calibration(coverage, tuple(metrics), tuple(margins), tuple(counts), shifts)


def censored_margin(
    points: npt.NDArray[np.float64],
    floors: npt.NDArray[np.float64],
    groups: Sequence[str],
    coverage: float = DEFAULT_COVERAGE,
) -> float:
    """The log margin that lifts point predictions above figures the truth is known to exceed.

    Each piece of evidence is a served point prediction and a floor the true figure exceeds
    (a card's memory at a batch that ran out of memory on it). Its score,
    ``log(floor) - log(point)``, is the smallest log margin with which the upper bound is above
    the floor; the conformal quantile over configurations (`groups`, the largest score of
    each) puts a new configuration's failures above their floors with probability `coverage`
    when the evidence is exchangeable with it. The true figure may exceed its floor by more,
    so the margin is a lower bound on the one that covers the truth: widen with it, never
    replace a label-fitted margin. Clamped at 0 like `calibrate`.

    Raises:
        CalibrationError: mismatched lengths, or fewer configurations than `coverage` needs.
    """
    if not len(points) == len(floors) == len(groups):
        raise CalibrationError(
            f"{len(points)} points, {len(floors)} floors and {len(groups)} groups"
        )
    scores = worst_per_group(groups, np.log(floors) - np.log(points))
    return max(0.0, conformal_quantile(scores, coverage))


@dataclass(frozen=True)
class DomainCheck:
    """One left-out domain's row of `ShiftMargin.per_domain`."""

    configurations: int
    own_coverage: float
    others_log_margin: float
    widened_coverage: float


@dataclass(frozen=True)
class ShiftMargin:
    """The log margin a bound adds on a domain its calibration never saw (a GPU without step
    labels), measured by leaving each known domain out in turn (`shift_margin`).

    Attributes:
        log_margin: the margin, from every left-out domain's excesses pooled.
        configurations: how many excesses it was fitted on.
        per_domain: for each domain left out, its configurations, the share its model's own
            margins covered, the margin the other domains alone give, and the share that one
            covers: the check of the widening on a domain it was not fitted on.
    """

    log_margin: float
    configurations: int
    per_domain: Mapping[str, DomainCheck]


def shift_margin(
    excess: Mapping[str, Sequence[float]], coverage: float = DEFAULT_COVERAGE
) -> ShiftMargin:
    """The extra log margin that covers `coverage` of configurations on a domain left out.

    `excess[domain]` holds, for each test configuration of a domain that a model was trained
    and calibrated without, how far the truth lay beyond that model's own bound:
    ``log(y) - log(y_hat) - margin``, the largest over the configuration's samples. Within a
    domain the split-conformal guarantee holds; across domains it does not, and the excesses
    measure by how much. Their pooled conformal quantile (at least 0) is the margin; each
    domain is also scored with the quantile of the other domains' excesses alone.

    With a handful of domains this is empirical, not a guarantee: the exchangeable unit of a
    shift is the domain, and a new one may differ from every domain seen more than they differ
    from each other. The per-domain check says how far that went here.

    Raises:
        CalibrationError: fewer than two domains, or too few excesses for `coverage`.
    """
    if len(excess) < 2:
        raise CalibrationError(
            f"a shift is measured by leaving domains out in turn: need two, got {len(excess)}"
        )

    def margin(values: Sequence[float]) -> float:
        return max(0.0, conformal_quantile(np.asarray(values, dtype=np.float64), coverage))

    per_domain = {}
    for domain, values in sorted(excess.items()):
        others = margin([v for d, vs in excess.items() if d != domain for v in vs])
        scores = np.asarray(values, dtype=np.float64)
        per_domain[domain] = DomainCheck(
            configurations=int(scores.size),
            own_coverage=float(np.mean(scores <= 0)) if scores.size else math.nan,
            others_log_margin=others,
            widened_coverage=float(np.mean(scores <= others)) if scores.size else math.nan,
        )
    pooled = [v for values in excess.values() for v in values]
    return ShiftMargin(margin(pooled), len(pooled), per_domain)
