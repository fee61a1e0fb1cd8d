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

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
    MOVED = "moved"
    """An attempt whose pods waited unschedulable moved to a kind of device that was free."""
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
    TOO_SLOW = "too_slow"


class ReconcileStep(StrEnum):
    """The steps of a DLJob reconcile whose duration is observed."""

    FETCH = "fetch"
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
            for placement_outcome in (
                PlacementOutcome.PLACED,
                PlacementOutcome.ESCALATED,
                PlacementOutcome.MOVED,
            ):
                self.placements.labels(profile=profile, outcome=placement_outcome)
        self.placements.labels(profile=NO_PROFILE, outcome=PlacementOutcome.NO_FIT)
        for escalation in EscalationOutcome:
            self.oom_escalations.labels(outcome=escalation)
        for failure in FetchFailure:
            self.fetch_failures.labels(reason=failure)
        for step in ReconcileStep:
            self.reconcile_duration.labels(step=step)


# -- the GPU profiler DaemonSet (subsystem `profiler`) --------------------------------------------

_PROFILER = "profiler"

PROFILER_POD_LABELS = (
    "namespace",
    "pod",
    "dljob",
    "UUID",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
)
"""Labels of the per-pod profiler series. `UUID`, `modelName`, `GPU_I_PROFILE` and `GPU_I_ID`
are dcgm-exporter's names for the same facts (GPU or MIG device UUID, product name, MIG profile
and GPU instance id; empty for a whole GPU), so the two join in PromQL without relabelling."""

# One NVML sampling round of a node: tens of microseconds per call, a few calls per device.
_SAMPLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class PredictedBound(StrEnum):
    """Which predicted memory figure a `pod_predicted_memory_bytes` series carries."""

    POINT = "point"
    UPPER = "upper"


class ReportOutcome(StrEnum):
    """How one patch of a DLJob's `status.observed` ended."""

    PATCHED = "patched"
    GONE = "gone"
    FAILED = "failed"


class ProfilerMetrics:
    """The profiler agent's metrics (subsystem `profiler`): what each DLJob pod uses on its GPU,
    and the agent's own health.

    Args:
        registry: where the metrics are registered.
        nvml_errors: the error kinds NVML calls can fail with
            (`kubeseer.profiler.nvml.ERROR_KINDS`), pre-initialised.
    """

    def __init__(self, registry: CollectorRegistry, *, nvml_errors: Iterable[str] = ()) -> None:
        self.registry = registry
        self.pod_memory = Gauge(
            "pod_memory",
            "GPU memory a DLJob pod uses on a device at the last sample (its processes' memory "
            "as NVML reports it, or the device's used memory when the pod holds it alone and "
            "NVML lists no processes).",
            PROFILER_POD_LABELS,
            unit="bytes",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.pod_memory_peak = Gauge(
            "pod_memory_peak",
            "Peak GPU memory of a DLJob pod on a device since it was first seen there.",
            PROFILER_POD_LABELS,
            unit="bytes",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.pod_sm_activity = Gauge(
            "pod_sm_activity_percent",
            "SM activity of the device a DLJob pod holds alone, at the last sample (GPM on "
            "Hopper and later, else NVML utilisation on a whole GPU; absent where the hardware "
            "reports nothing, such as a MIG device of an A100).",
            PROFILER_POD_LABELS,
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.pod_predicted_memory = Gauge(
            "pod_predicted_memory",
            "GPU memory the operator predicted for a DLJob pod on the device it holds (the pod's "
            "kubeseer.io/predicted-memory-*-bytes annotations): the point prediction and the "
            "calibrated upper bound it was placed with, beside the observed series.",
            (*PROFILER_POD_LABELS, "bound"),
            unit="bytes",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.pod_predicted_sm_activity = Gauge(
            "pod_predicted_sm_activity_percent",
            "SM utilisation the operator predicted for a DLJob pod (for a whole GPU), from its "
            "kubeseer.io/predicted-sm-util-percent annotation.",
            PROFILER_POD_LABELS,
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.pod_device_memory = Gauge(
            "pod_device_memory",
            "Memory of the device a DLJob pod holds (a MIG device's own share): with the pod's "
            "peak, the memory it holds but does not use.",
            PROFILER_POD_LABELS,
            unit="bytes",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.devices = Gauge(
            "devices",
            "GPU devices the agent samples (whole GPUs, and MIG devices of GPUs in MIG mode).",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.samples = Counter(
            "samples",
            "Sampling rounds over every device of the node.",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.sample_duration = Histogram(
            "sample_duration",
            "Wall time of one sampling round (NVML, /proc and attribution).",
            unit="seconds",
            buckets=_SAMPLE_BUCKETS,
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.nvml_errors = Counter(
            "nvml_errors",
            "NVML calls that failed, by NVML error (a plain 'not supported' answer is not an "
            "error: it is how the hardware says it has no such reading).",
            ["error"],
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.unattributed_processes = Gauge(
            "unattributed_processes",
            "GPU processes at the last sample that belong to no pod the agent knows.",
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        self.reports = Counter(
            "reports",
            "Patches of a DLJob's status.observed, by outcome (gone: the DLJob was deleted).",
            ["outcome"],
            namespace=NAMESPACE,
            subsystem=_PROFILER,
            registry=registry,
        )
        for error in nvml_errors:
            self.nvml_errors.labels(error=error)
        for outcome in ReportOutcome:
            self.reports.labels(outcome=outcome)


# -- prediction against observation (subsystem `feedback`, served by the operator) ---------------

_FEEDBACK = "feedback"

OTHER_FAMILY = "other"
"""The `family` label of a model family outside the known set (keeps the label bounded)."""

# Absolute percentage error as a ratio: 1 % to 10x off.
_ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)


class Quantity(StrEnum):
    """A predicted quantity that the profiler observes."""

    MEMORY = "memory"
    SM_UTIL = "sm_util"


class ExceedCause(StrEnum):
    """How a job showed that its calibrated upper bound was too low."""

    OBSERVED = "observed"
    OOM = "oom"


class ObservationOutcome(StrEnum):
    """How a finished attempt ended, as the observation store records it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OOM = "oom"


class FeedbackMetrics:
    """Prediction against observation, per finished attempt (subsystem `feedback`).

    Args:
        registry: where the metrics are registered.
        families: model family names known at start (label values outside are `other`).
        profiles: placement profile names (`<GPU>/<MIG profile>` or `<GPU>/whole`).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        families: Iterable[str] = (),
        profiles: Iterable[str] = (),
    ) -> None:
        self.registry = registry
        self.families = frozenset(families)
        self.profiles = tuple(profiles)
        self.prediction_error = Histogram(
            "prediction_absolute_error",
            "Absolute percentage error of the point prediction against the profiler's "
            "observation, as a ratio (0.1 = 10 %), by quantity, model family, GPU product and "
            "profile.",
            ["quantity", "family", "gpu_product", "profile"],
            unit="ratio",
            buckets=_ERROR_BUCKETS,
            namespace=NAMESPACE,
            subsystem=_FEEDBACK,
            registry=registry,
        )
        self.bound_exceeded = Counter(
            "bound_exceeded",
            "Finished attempts whose observed peak memory exceeded the calibrated upper bound "
            "(cause observed), or that ran out of memory (cause oom: the need exceeded the "
            "slice, which held at least the bound).",
            ["family", "gpu_product", "profile", "cause"],
            namespace=NAMESPACE,
            subsystem=_FEEDBACK,
            registry=registry,
        )
        self.observations = Counter(
            "observations",
            "Finished attempts recorded in the observation store, by outcome (oom is a "
            "censored memory label).",
            ["outcome"],
            namespace=NAMESPACE,
            subsystem=_FEEDBACK,
            registry=registry,
        )
        self.store_errors = Counter(
            "store_errors",
            "Observation records that could not be written (the store is retried on the next "
            "event of the same attempt).",
            namespace=NAMESPACE,
            subsystem=_FEEDBACK,
            registry=registry,
        )
        self.margin = Gauge(
            "memory_margin_ratio",
            "The multiplicative memory margin (upper bound / point) the operator applies, by "
            "the group it was recalibrated on (`checkpoint` before the cluster has enough "
            "observations).",
            ["group"],
            namespace=NAMESPACE,
            subsystem=_FEEDBACK,
            registry=registry,
        )
        for outcome in ObservationOutcome:
            self.observations.labels(outcome=outcome)

    def family(self, name: str) -> str:
        """`name` if it is a known family, else `other`."""
        return name if name in self.families else OTHER_FAMILY


# -- the scheduler extender (subsystem `extender`) ------------------------------------------------

_EXTENDER = "extender"

# kube-scheduler waits for filter and prioritize in its scheduling cycle; the goal is 20 ms at
# the 99th percentile on 1,000 nodes, and its default timeout is 5 s.
_EXTENDER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class ExtenderVerb(StrEnum):
    """The extender calls kube-scheduler makes."""

    FILTER = "filter"
    PRIORITIZE = "prioritize"


class ExtenderDecision(StrEnum):
    """What the extender did with the pod of one call."""

    DECIDED = "decided"
    OTHER_SCHEDULER = "other_scheduler"
    NOT_KUBESEER = "not_kubeseer"
    MALFORMED_ANNOTATION = "malformed_annotation"


class RelistCause(StrEnum):
    """Why a watch cache listed its resource again."""

    START = "start"
    EXPIRED = "expired"
    ERROR = "error"


class ExtenderMetrics:
    """The scheduler extender's metrics (subsystem `extender`).

    Args:
        registry: where the metrics are registered.
        reasons: the filter's rejection reasons (`kubeseer.extender.decide.Reason`),
            pre-initialised.
    """

    def __init__(self, registry: CollectorRegistry, *, reasons: Iterable[str] = ()) -> None:
        self.registry = registry
        self.request_duration = Histogram(
            "request_duration",
            "Wall time of one filter or prioritize call, from the request's first byte read to "
            "the answer written.",
            ["verb"],
            unit="seconds",
            buckets=_EXTENDER_BUCKETS,
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        self.requests = Counter(
            "requests",
            "Calls by verb and HTTP status (400: malformed request; 503: caches not synced yet, "
            "kube-scheduler then skips the ignorable extender).",
            ["verb", "code"],
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        self.decisions = Counter(
            "decisions",
            "Pods per call by what the extender did: decided (a kubeseer pod of its scheduler), "
            "passed through (another scheduler's pod, or one without kubeseer annotations), or "
            "rejected everywhere for an unreadable kubeseer annotation.",
            ["verb", "decision"],
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        self.rejections = Counter(
            "node_rejections",
            "Nodes failed by the filter, by reason (a node failing for two reasons counts twice).",
            ["reason"],
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        self.cached = Gauge(
            "cached_objects",
            "Objects in the watch caches: nodes, and pods bound to a node holding NVIDIA "
            "resources.",
            ["kind"],
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        self.relists = Counter(
            "relists",
            "Full lists of a watched resource, by cause (expired: the watch's resource version "
            "was too old, HTTP 410).",
            ["kind", "cause"],
            namespace=NAMESPACE,
            subsystem=_EXTENDER,
            registry=registry,
        )
        for verb in ExtenderVerb:
            self.request_duration.labels(verb=verb)
            for code in ("200", "400", "503"):
                self.requests.labels(verb=verb, code=code)
            for decision in ExtenderDecision:
                self.decisions.labels(verb=verb, decision=decision)
        for reason in reasons:
            self.rejections.labels(reason=reason)
        for kind in ("node", "pod"):
            self.cached.labels(kind=kind)
            for cause in RelistCause:
                self.relists.labels(kind=kind, cause=cause)
