r"""Memory margins that learn from the cluster's own jobs, before any retraining.

The checkpoint's conformal margin (`kubeseer.predictor.calibration`) was fitted on held-out
configurations of the families it trained on; on a family it never saw, or a GPU whose memory
behaves differently, its errors are not exchangeable with that calibration set and the bound's
coverage is not guaranteed (docs/accuracy.md measured 52-76 % on four held-out families). The
cluster's own finished jobs are the calibration set that matters, so the margin is recomputed
from them, with the same split-conformal rule: for the scores

.. math::

    s_j = \log \frac{y_j}{\hat y_j}

of the :math:`n` most recent jobs of a group (observed peak memory :math:`y_j`, point prediction
:math:`\hat y_j`), the margin is the :math:`\lceil (n + 1)\,c \rceil`-th smallest score for
coverage :math:`c`, clamped at 0, and the bound is :math:`\hat y\,e^{q}`.

Groups, in three levels: (GPU product, model family); then (family) and (product); then
everything. A prediction takes its margin from the first level where a group has at least
`min_samples` jobs (and enough for the coverage: 19 at 95 %), and at the middle level the
larger of the two margins that qualify: a family's errors follow its architecture on every GPU,
a product's follow its runtime (CUDA context, allocator) for every family, and a job is exposed
to both, so neither may lower the other. With no group, the checkpoint's margin stands.
bench/recalibration.py measures the rule against one global group and against the checkpoint.

Details that keep the guarantee honest:

- The exchangeable unit is a DLJob, not an attempt: a job's score is the largest over its
  attempts, as `calibration.calibrate` takes the largest over a configuration's batch sizes.
- An attempt that ran out of memory scores :math:`\log(m / \hat y)` with `m` the slice's usable
  memory, a lower bound of its true score; the same job's next, larger attempt usually
  supplies the real one, which the maximum then keeps.
- Scores are kept per checkpoint (`predictor_version`): a new checkpoint's errors are its own,
  so it starts from its own calibration and learns again.
- Only the `window` most recent jobs of a group count, so the margin follows drift (a family
  that starts to be trained differently) instead of averaging it away.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from kubeseer.observations import record


@dataclass(frozen=True)
class Group:
    """A set of jobs sharing a margin; None means "any"."""

    gpu_product: str | None
    family: str | None

    def label(self) -> str:
        """`A100-80GB/resnet`, `*/resnet`, `A100-80GB/*` or `*/*`."""
        return f"{self.gpu_product or '*'}/{self.family or '*'}"


def levels_of(gpu_product: str | None, family: str | None) -> tuple[tuple[Group, ...], ...]:
    """The groups a job's margin is looked up in, level by level, most specific first (a
    group naming an unknown part is left out)."""
    levels = (
        (Group(gpu_product, family),),
        (Group(None, family), Group(gpu_product, None)),
        (Group(None, None),),
    )
    known = tuple(
        tuple(
            g
            for g in level
            if (g.gpu_product is None or gpu_product) and (g.family is None or family)
        )
        for level in levels
    )
    seen: set[Group] = set()
    unique = []
    for level in known:
        fresh = tuple(g for g in level if g not in seen)
        seen.update(fresh)
        if fresh:
            unique.append(fresh)
    return tuple(unique)


def groups_of(gpu_product: str | None, family: str | None) -> tuple[Group, ...]:
    """Every group a job belongs to (its score is added to each)."""
    return tuple(g for level in levels_of(gpu_product, family) for g in level)


@dataclass(frozen=True)
class Margin:
    """A log margin and where it came from (`group` None: the checkpoint's own)."""

    log_margin: float
    group: Group | None
    samples: int

    @property
    def factor(self) -> float:
        """upper / point."""
        return math.exp(self.log_margin)

    def group_label(self) -> str:
        """The group's label, `checkpoint` for the checkpoint's own margin."""
        return "checkpoint" if self.group is None else self.group.label()

    def describe(self) -> str:
        """One line for a prediction's warnings and the DLJob's status."""
        if self.group is None:
            return f"memory margin x{self.factor:.3f} from the checkpoint's calibration"
        return (
            f"memory margin x{self.factor:.3f} recalibrated on the cluster's last "
            f"{self.samples} jobs of {self.group.label()}"
        )


def score(observation: record.Observation) -> float | None:
    """log(observed / predicted) of an attempt's memory, or None if it teaches nothing.

    Succeeded attempts score their observed peak; out-of-memory attempts the usable memory they
    exceeded (a lower bound); failed attempts and attempts the profiler never saw do not score.
    """
    if observation.outcome is record.Outcome.FAILED:
        return None
    label = observation.memory_label
    if label is None or label <= 0 or observation.predicted_memory_bytes <= 0:
        return None
    return math.log(label / observation.predicted_memory_bytes)


class Recalibrator:
    """Online conformal margins per (checkpoint, group), thread-safe.

    Args:
        window: the most recent jobs of a group that count.
        min_samples: jobs a group needs before its margin replaces a coarser one.
    """

    def __init__(self, *, window: int = 200, min_samples: int = 20) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.window = window
        self.min_samples = min_samples
        self._lock = threading.Lock()
        # checkpoint -> group -> DLJob UID -> score (oldest first).
        self._scores: dict[str, dict[Group, OrderedDict[str, float]]] = {}

    def observe(self, observation: record.Observation) -> bool:
        """Add one attempt; False if it carries no memory score."""
        value = score(observation)
        if value is None:
            return False
        with self._lock:
            by_group = self._scores.setdefault(observation.predictor_version, {})
            for group in groups_of(observation.gpu_product, observation.family):
                jobs = by_group.setdefault(group, OrderedDict())
                old = jobs.pop(observation.dljob_uid, None)
                jobs[observation.dljob_uid] = value if old is None else max(old, value)
                while len(jobs) > self.window:
                    jobs.popitem(last=False)
        return True

    def observe_all(self, observations: Iterable[record.Observation]) -> int:
        """Add attempts in order (a warm start from the store); returns how many scored."""
        return sum(self.observe(o) for o in observations)

    def margin(
        self,
        predictor_version: str,
        *,
        gpu_product: str | None,
        family: str | None,
        coverage: float,
    ) -> Margin | None:
        """The margin of the most specific level with a group of enough jobs (the larger of
        a level's qualifying margins), or None: use the checkpoint's."""
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {coverage}")
        with self._lock:
            by_group = self._scores.get(predictor_version, {})
            for level in levels_of(gpu_product, family):
                found = [
                    m
                    for group in level
                    if (m := self._quantile(by_group.get(group), group, coverage)) is not None
                ]
                if found:
                    return max(found, key=lambda m: m.log_margin)
        return None

    def _quantile(
        self, jobs: OrderedDict[str, float] | None, group: Group, coverage: float
    ) -> Margin | None:
        if not jobs or len(jobs) < self.min_samples:
            return None
        scores = sorted(jobs.values())
        rank = math.ceil((len(scores) + 1) * coverage)
        if rank > len(scores):
            return None
        return Margin(max(0.0, scores[rank - 1]), group, len(scores))

    def samples(self, predictor_version: str, group: Group) -> int:
        """Jobs currently counted in a group."""
        with self._lock:
            return len(self._scores.get(predictor_version, {}).get(group, ()))
