"""Every Prometheus metric kubeseer exports, declared once.

Names follow Prometheus conventions: namespace `kubeseer`, one subsystem per component, base
units in the name (`_seconds`), counters ending in `_total`, label names fixed here. Nothing is
registered on import: a component builds its metrics on a registry it is given, so tests use a
fresh `CollectorRegistry()` and two operators in one process never collide. docs/metrics.md
lists every series.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Histogram

NAMESPACE = "kubeseer"

# Prediction latency ranges from a cache hit (microseconds) to a cold GNN forward on a large
# graph (seconds); the buckets span both ends.
_PREDICTION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# One reconcile step is an API round trip or a model fetch.
_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PredictionOutcome(StrEnum):
    """How one prediction request ended."""

    COMPUTED = "computed"
    CACHED = "cached"
    FAILED = "failed"


class PlacementOutcome(StrEnum):
    """How one placement decision ended."""

    PLACED = "placed"
    ESCALATED = "escalated"
    NO_FIT = "no_fit"


class EscalationOutcome(StrEnum):
    """Whether an out-of-memory pod found a larger profile."""

    ESCALATED = "escalated"
    EXHAUSTED = "exhausted"


class FetchFailure(StrEnum):
    """Why fetching a model failed; one value per operator-facing failure reason."""

    UNREACHABLE = "unreachable"
    REFUSED = "refused"
    TOO_LARGE = "too_large"
    DIGEST_MISMATCH = "digest_mismatch"
    NOT_FOUND = "not_found"
    INVALID = "invalid"


class ReconcileStep(StrEnum):
    """The steps of a DLJob reconcile whose duration is observed."""

    PREDICT = "predict"
    PLACE = "place"
    POD_EVENT = "pod_event"


_OPERATOR = "operator"

NO_PROFILE = "none"
"""The `profile` label value of a placement that found nothing."""


class OperatorMetrics:
    """The DLJob operator's metrics (subsystem `operator`).

    Args:
        registry: where the metrics are registered.
        profiles: placement profile names known at start (the catalogue), pre-initialised so
            that dashboards see zeros rather than absent series.
    """

    def __init__(self, registry: CollectorRegistry, *, profiles: Iterable[str] = ()) -> None:
        self.registry = registry
        self.profiles = tuple(profiles)
        self.predictions = Counter(
            "predictions",
            "Predictions requested for DLJobs, by mode and outcome (cached: served from the "
            "(digest, batch, mode, precision, inputs) cache).",
            ["mode", "outcome"],
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self.prediction_duration = Histogram(
            "prediction_duration",
            "Wall time of one prediction, including graph extraction, excluding the fetch.",
            ["mode"],
            unit="seconds",
            buckets=_PREDICTION_BUCKETS,
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self.placements = Counter(
            "placements",
            "Placement decisions, by chosen profile (`none` when nothing fits) and outcome.",
            ["profile", "outcome"],
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self.oom_escalations = Counter(
            "oom_escalations",
            "Pods that ran out of GPU memory, by whether a larger profile was found.",
            ["outcome"],
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self.fetch_failures = Counter(
            "model_fetch_failures",
            "Model fetches that failed, by reason.",
            ["reason"],
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self.reconcile_duration = Histogram(
            "reconcile_duration",
            "Wall time of one reconcile step of one DLJob.",
            ["step"],
            unit="seconds",
            buckets=_RECONCILE_BUCKETS,
            namespace=NAMESPACE,
            subsystem=_OPERATOR,
            registry=registry,
        )
        self._preinitialise()

    def _preinitialise(self) -> None:
        for mode in ("train", "infer"):
            self.prediction_duration.labels(mode=mode)
            for prediction_outcome in PredictionOutcome:
                self.predictions.labels(mode=mode, outcome=prediction_outcome)
        for profile in self.profiles:
            for placement_outcome in (PlacementOutcome.PLACED, PlacementOutcome.ESCALATED):
                self.placements.labels(profile=profile, outcome=placement_outcome)
        self.placements.labels(profile=NO_PROFILE, outcome=PlacementOutcome.NO_FIT)
        for escalation in EscalationOutcome:
            self.oom_escalations.labels(outcome=escalation)
        for failure in FetchFailure:
            self.fetch_failures.labels(reason=failure)
        for step in ReconcileStep:
            self.reconcile_duration.labels(step=step)
