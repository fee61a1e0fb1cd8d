"""What each failure means for a DLJob, and the sentences the status and events use.

The words live here, apart from the steps that act, so that every reason a DLJob can show is
chosen in one place: the ModelReady reason of each fetch failure, the Placed reason of each
cause placement gives for placing nothing, what a refused workload means.
"""

from __future__ import annotations

from kubeseer import metrics, units
from kubeseer.operator import dljob, journal
from kubeseer.operator import errors as api_errors
from kubeseer.placement import policy
from kubeseer.prediction import Prediction

Cond = dljob.ConditionType
Reason = dljob.Reason

MODEL_REASONS = {
    metrics.FetchFailure.UNREACHABLE: Reason.MODEL_UNREACHABLE,
    metrics.FetchFailure.REFUSED: Reason.MODEL_REFUSED,
    metrics.FetchFailure.TOO_LARGE: Reason.MODEL_TOO_LARGE,
    metrics.FetchFailure.DIGEST_MISMATCH: Reason.DIGEST_MISMATCH,
    metrics.FetchFailure.NOT_FOUND: Reason.MODEL_NOT_FOUND,
    metrics.FetchFailure.INVALID: Reason.MODEL_SOURCE_INVALID,
    metrics.FetchFailure.TOO_SLOW: Reason.MODEL_TOO_SLOW,
}
"""The ModelReady reason of each kind of fetch failure (the failure class chose the kind)."""

NO_FIT_REASONS = {
    policy.NoFitCause.NOTHING_FITS: Reason.NO_FIT,
    policy.NoFitCause.PRODUCT_ABSENT: Reason.GPU_PRODUCT_NOT_IN_CLUSTER,
    policy.NoFitCause.NO_MATCHING_NODE: Reason.NO_MATCHING_NODE,
    policy.NoFitCause.TOO_MANY_REPLICAS: Reason.TOO_MANY_REPLICAS,
}
"""The Placed reason of each cause placement gives for placing nothing."""


def workload_error(error: api_errors.ApiError) -> journal.StepError:
    """What a refused Job (or its claim template) means for the DLJob."""
    message = str(error)
    if isinstance(error, api_errors.QuotaExceededError):
        return journal.StepError(
            Cond.WORKLOAD_READY,
            Reason.QUOTA_EXCEEDED,
            f"{message}; the workload is created once the namespace quota has room",
            patient=True,
        )
    if isinstance(error, api_errors.InvalidObjectError):
        return journal.StepError(
            Cond.WORKLOAD_READY,
            Reason.INVALID_TEMPLATE,
            f"the API server refuses the workload built from spec.template: {message}",
        )
    return journal.StepError(
        Cond.WORKLOAD_READY, Reason.WORKLOAD_FAILED, message, transient=error.transient
    )


def coverage_advice(prediction: Prediction, request: policy.Request) -> str:
    """Why the requested coverage cannot be served, and what to change."""
    return (
        f"the predictor's upper bound is calibrated to cover {prediction.coverage:.0%} of peaks "
        f"and the DLJob asks for {request.coverage:.0%}; set spec.placement.coverage to "
        f"{prediction.coverage:g} or less, or ask the admin for a checkpoint calibrated at "
        f"{request.coverage:g} (KUBESEER_PREDICTOR_CHECKPOINT)"
    )


def describe_prediction(p: Prediction) -> str:
    """The Predicted condition's message."""
    return (
        f"peak memory {p.memory_bytes.point / units.MIB:.0f} MiB, upper bound "
        f"{p.memory_bytes.upper / units.MIB:.0f} MiB at {p.coverage:.0%} coverage; "
        f"SM utilisation {p.sm_util_percent.point:.0f}%; step time "
        f"{p.step_time_s.point * 1e3:.1f} ms (predictor {p.predictor_version}, "
        f"labels from {p.label_device})"
    )


def placed_event(prediction: Prediction, placement: policy.Placement) -> str:
    """The Placed event's message."""
    return (
        f"{placement.resource} on {placement.gpu_product} for a predicted peak of "
        f"{prediction.memory_bytes.point / units.MIB:.0f} MiB (upper bound "
        f"{prediction.memory_bytes.upper / units.MIB:.0f} MiB): {placement.reason}"
    )
