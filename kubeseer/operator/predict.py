"""Prediction as the operator uses it: the predictor's one cache, typed failures, metrics.

The operator never imports the predictor's model code here; the composition root (`main`)
hands in a `Predictor` (in production `kubeseer.predictor.api.Predictor`), so the reconcile
logic is tested without torch. The cache is the predictor's own, keyed by the whole request
(`kubeseer.predictor.cache`); this module asks it first, so that a DLJob that pins its model's
digest is answered without a fetch and every answer is counted as computed, cached or failed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from kubeseer import metrics
from kubeseer.operator import dljob
from kubeseer.prediction import Attention, Mode, Precision, Prediction
from kubeseer.predictor import errors as predictor_errors


class Predictor(Protocol):
    """What the operator needs of the predictor (`kubeseer.predictor.api.Predictor` has it)."""

    def cached(
        self,
        model_digest: str,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention = Attention.AUTO,
    ) -> Prediction | None:
        """The cached prediction for the model with this sha256, or None."""

    def predict(
        self,
        model: bytes | Path,
        batch_size: int,
        mode: Mode,
        precision: Precision,
        *,
        inputs: Mapping[str, int],
        attention: Attention = Attention.AUTO,
    ) -> Prediction:
        """Predict (and cache); raises `kubeseer.predictor.errors.PredictionError`."""


def reason(error: predictor_errors.PredictionError) -> dljob.Reason:
    """Why a prediction failed, in the DLJob's vocabulary: the model's fault or the predictor's."""
    if isinstance(
        error, predictor_errors.ControlFlowError | predictor_errors.UnsupportedOperatorError
    ):
        return dljob.Reason.UNSUPPORTED_MODEL
    if isinstance(error, predictor_errors.BindingError | predictor_errors.SymbolicDimensionError):
        return dljob.Reason.INVALID_INPUTS
    if isinstance(error, predictor_errors.ModelTooLargeError):
        return dljob.Reason.MODEL_TOO_LARGE
    if isinstance(error, predictor_errors.GraphError):
        return dljob.Reason.CORRUPT_MODEL
    return dljob.Reason.PREDICTION_FAILED


class CachedPredictor:
    """The predictor with the operator's metrics: each answer is computed, cached or failed.

    Args:
        predictor: the predictor, which holds the cache.
        operator_metrics: where predictions and their duration are counted.
    """

    def __init__(self, predictor: Predictor, operator_metrics: metrics.OperatorMetrics) -> None:
        self.predictor = predictor
        self.metrics = operator_metrics

    def is_cached(self, digest: str, spec: dljob.DLJobSpec) -> bool:
        """Whether `predict` for this model and spec would be a cache hit (not counted)."""
        return self._cached(digest, spec) is not None

    def lookup(self, digest: str, spec: dljob.DLJobSpec) -> Prediction | None:
        """The cached prediction for this model and spec (counted as a cache hit), or None."""
        cached = self._cached(digest, spec)
        if cached is not None:
            self._count(spec.mode.value, metrics.PredictionOutcome.CACHED)
        return cached

    def _cached(self, digest: str, spec: dljob.DLJobSpec) -> Prediction | None:
        return self.predictor.cached(
            digest,
            spec.batch_size,
            spec.mode,
            spec.precision,
            inputs=dict(spec.inputs),
            attention=spec.attention,
        )

    def predict(self, model: bytes | Path, digest: str, spec: dljob.DLJobSpec) -> Prediction:
        """The prediction for this model (its bytes, or the file holding them) under the
        DLJob's batch, mode, precision and inputs.

        Raises:
            kubeseer.predictor.errors.PredictionError: the graph is unusable (corrupt,
                unsupported, inputs that do not bind) or the predictor failed; `reason` says
                which in the DLJob's vocabulary.
        """
        cached = self.lookup(digest, spec)
        if cached is not None:
            return cached
        mode = spec.mode.value
        start = time.perf_counter()
        try:
            prediction = self.predictor.predict(
                model,
                spec.batch_size,
                spec.mode,
                spec.precision,
                inputs=dict(spec.inputs),
                attention=spec.attention,
            )
        except predictor_errors.PredictionError:
            self._count(mode, metrics.PredictionOutcome.FAILED)
            raise
        except (ValueError, RuntimeError, MemoryError) as e:
            self._count(mode, metrics.PredictionOutcome.FAILED)
            raise predictor_errors.PredictionError(
                f"the predictor failed: {type(e).__name__}: {e}"
            ) from e
        self.metrics.prediction_duration.labels(mode=mode).observe(time.perf_counter() - start)
        self._count(mode, metrics.PredictionOutcome.COMPUTED)
        return prediction

    def _count(self, mode: str, outcome: metrics.PredictionOutcome) -> None:
        self.metrics.predictions.labels(mode=mode, outcome=outcome).inc()
