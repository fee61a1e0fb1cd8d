"""Prediction as the operator uses it: one narrow callable, a cache, typed failures, metrics.

The operator never imports the predictor's model code here; the composition root (`main`)
hands in a `PredictFn`, so the reconcile logic is tested without torch and the predictor can be
swapped (SeerNet-Multi, the analytic estimator) by configuration.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubeseer import metrics
from kubeseer.operator import dljob
from kubeseer.prediction import Mode, Precision, Prediction
from kubeseer.predictor import errors as graph_errors

PredictFn = Callable[[bytes, int, Mode, Precision, Mapping[str, int]], Prediction]
"""(model bytes, batch size, mode, precision, symbolic dimension values) -> Prediction."""


class PredictionError(Exception):
    """The model could not be predicted; `reason` says why in the DLJob's vocabulary."""

    def __init__(self, reason: dljob.Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class _Key:
    digest: str
    batch_size: int
    mode: Mode
    precision: Precision
    inputs: tuple[tuple[str, int], ...]


def _reason(error: graph_errors.GraphError) -> dljob.Reason:
    if isinstance(error, graph_errors.ControlFlowError):
        return dljob.Reason.UNSUPPORTED_MODEL
    if isinstance(error, graph_errors.BindingError | graph_errors.SymbolicDimensionError):
        return dljob.Reason.INVALID_INPUTS
    if isinstance(error, graph_errors.ModelTooLargeError):
        return dljob.Reason.MODEL_TOO_LARGE
    return dljob.Reason.CORRUPT_MODEL


class CachedPredictor:
    """Memoises predictions by (digest, batch size, mode, precision, inputs).

    The same model is typically submitted many times (sweeps, retries, replicas of a service),
    and a prediction is deterministic in its key, so the LRU turns repeats into a dictionary
    lookup. Two threads asking for the same new key may both compute it; the cost is bounded
    and simpler than a per-key lock.

    Args:
        predict_fn: the predictor.
        operator_metrics: where predictions and their duration are counted.
        size: entries kept.
    """

    def __init__(
        self, predict_fn: PredictFn, operator_metrics: metrics.OperatorMetrics, size: int
    ) -> None:
        self.predict_fn = predict_fn
        self.metrics = operator_metrics
        self.size = size
        self._lock = threading.Lock()
        self._cache: OrderedDict[_Key, Prediction] = OrderedDict()

    def is_cached(self, digest: str, spec: dljob.DLJobSpec) -> bool:
        """Whether `predict` for this model and spec would be a cache hit."""
        with self._lock:
            return self._key(digest, spec) in self._cache

    def lookup(self, digest: str, spec: dljob.DLJobSpec) -> Prediction | None:
        """The cached prediction for this model and spec (counted as a cache hit), or None."""
        key = self._key(digest, spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
        if cached is not None:
            self._count(spec.mode.value, metrics.PredictionOutcome.CACHED)
        return cached

    @staticmethod
    def _key(digest: str, spec: dljob.DLJobSpec) -> _Key:
        return _Key(digest, spec.batch_size, spec.mode, spec.precision, spec.inputs)

    def predict(self, data: bytes, digest: str, spec: dljob.DLJobSpec) -> Prediction:
        """The prediction for this model under the DLJob's batch, mode, precision and inputs.

        Raises:
            PredictionError: the graph is unusable (corrupt, unsupported, inputs that do not
                bind) or the predictor failed.
        """
        cached = self.lookup(digest, spec)
        if cached is not None:
            return cached
        key = self._key(digest, spec)
        mode = spec.mode.value
        start = time.perf_counter()
        try:
            prediction = self.predict_fn(
                data, spec.batch_size, spec.mode, spec.precision, dict(spec.inputs)
            )
        except graph_errors.GraphError as e:
            self._count(mode, metrics.PredictionOutcome.FAILED)
            raise PredictionError(_reason(e), str(e)) from e
        except (ValueError, RuntimeError, MemoryError) as e:
            self._count(mode, metrics.PredictionOutcome.FAILED)
            raise PredictionError(
                dljob.Reason.PREDICTION_FAILED, f"the predictor failed: {type(e).__name__}: {e}"
            ) from e
        self.metrics.prediction_duration.labels(mode=mode).observe(time.perf_counter() - start)
        self._count(mode, metrics.PredictionOutcome.COMPUTED)
        with self._lock:
            self._cache[key] = prediction
            self._cache.move_to_end(key)
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return prediction

    def _count(self, mode: str, outcome: metrics.PredictionOutcome) -> None:
        self.metrics.predictions.labels(mode=mode, outcome=outcome).inc()
