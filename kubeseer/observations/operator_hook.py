"""The operator's side of the loop: recalibrated bounds in, finished attempts out.

The operator calls three methods, each from a worker thread and each safe to repeat:

- `serve` on every fresh prediction, before it is stored and placed: the memory upper bound
  takes the cluster's recalibrated margin for the DLJob's family (the `kubeseer.io/model-family`
  label) and, when the DLJob allows one GPU product only, that product;
- `model_loaded` when a model was downloaded: its PerfGraph goes to the store once, so that
  `kubeseer dataset pull` can train on the job after the model is gone;
- `dljob_changed` on every event of a DLJob: each attempt in `status.attempts` that ended
  (succeeded, failed, or ran out of memory) becomes an observation with the profiler's entries
  for its pods (`status.observed`); the profiler's final report usually arrives after the
  operator has recorded the attempt, and the next event records it again, complete.

Nothing here may fail a reconcile: errors are logged and counted, and the next event retries.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubeseer.observations import feedback, graphs, record
from kubeseer.observations import store as store_mod
from kubeseer.operator import dljob
from kubeseer.operator import status as st
from kubeseer.prediction import Prediction
from kubeseer.profiler import report

log = logging.getLogger(__name__)

_OUTCOMES = {
    st.OUTCOME_SUCCEEDED: record.Outcome.SUCCEEDED,
    st.OUTCOME_FAILED: record.Outcome.FAILED,
    st.OUTCOME_OOM: record.Outcome.OOM,
}

LabelsFn = Callable[[str, str], Mapping[str, str] | None]
"""(namespace, DLJob name) -> the DLJob's labels, None if it is gone."""


class OperatorFeedback:
    """Feedback for one operator.

    Args:
        recorder: store, metrics and margins.
        labels: reads a DLJob's labels (the family) when a prediction is served.
        clock: the time an attempt is first seen to have ended, when nothing else dates it.
    """

    def __init__(
        self,
        recorder: feedback.FeedbackRecorder,
        labels: LabelsFn,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.recorder = recorder
        self.labels = labels
        self.clock = clock
        self._lock = threading.Lock()
        self._first_seen: dict[str, datetime] = {}
        self._written: dict[str, tuple[object, ...]] = {}

    # -- predictions ----------------------------------------------------------------------------

    def serve(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> Prediction:
        """The prediction with the recalibrated memory bound (unchanged if nothing qualifies)."""
        try:
            family = feedback.family_of(self.labels(ref.namespace, ref.name))
            products = spec.placement.gpu_products
            return self.recorder.apply(
                prediction,
                gpu_product=products[0] if len(products) == 1 else None,
                family=family,
                coverage=spec.placement.coverage,
            )
        except Exception:  # a margin is an improvement, never a reason to fail a DLJob
            log.exception("recalibrating the bound of %s/%s failed", ref.namespace, ref.name)
            return prediction

    def model_loaded(self, path: Path, digest: str, spec: dljob.DLJobSpec) -> None:
        """Store the model's PerfGraph at the DLJob's batch and bindings (once per model)."""
        store = self.recorder.store
        if store is None:
            return
        inputs = dict(spec.inputs)
        name = store_mod.Store.graph_name(digest, record.canonical_inputs(inputs), spec.batch_size)
        from kubeseer.predictor import errors, extract  # the operator has the predictor loaded

        try:
            if store.get_graph(name) is not None:
                return
            graph = extract.from_onnx(path, batch_size=spec.batch_size, inputs=inputs or None)
            store.put_graph(name, graphs.to_bytes(graph))
        except (store_mod.StoreError, errors.PredictionError, OSError) as e:
            log.warning("the PerfGraph of %s was not stored: %s", digest, e)

    # -- finished attempts ----------------------------------------------------------------------

    def dljob_changed(self, body: Mapping[str, Any]) -> int:
        """Record every ended attempt of the DLJob; returns how many records were written."""
        try:
            ends = attempt_ends(body, self._finished_at)
        except (KeyError, TypeError, ValueError, dljob.InvalidSpecError) as e:
            log.warning("cannot read the attempts of a DLJob: %s", e)
            return 0
        status = body.get("status") or {}
        written = 0
        for ended in ends:
            observed = report.attempt_entries(status, ended.attempt)
            end = self._with_graph(_dated(ended, observed))
            key = _content(end, observed)
            observation_id = record.observation_id(end.dljob_uid, end.attempt)
            with self._lock:
                if self._written.get(observation_id) == key:
                    continue
            try:
                self.recorder.record_attempt(end, observed)
            except store_mod.StoreError as e:
                log.warning(
                    "observation of %s/%s attempt %d not stored: %s",
                    end.namespace,
                    end.dljob,
                    end.attempt,
                    e,
                )
                continue
            with self._lock:
                self._written[observation_id] = key
            written += 1
        return written

    def _finished_at(self, dljob_uid: str, attempt: int) -> datetime:
        key = f"{dljob_uid}/{attempt}"
        with self._lock:
            return self._first_seen.setdefault(key, self.clock())

    def _with_graph(self, end: feedback.AttemptEnd) -> feedback.AttemptEnd:
        store = self.recorder.store
        if store is None:
            return end
        prediction = end.prediction
        name = store_mod.Store.graph_name(
            prediction.model_digest, record.canonical_inputs(end.inputs), prediction.batch_size
        )
        try:
            present = store.get_graph(name) is not None
        except store_mod.StoreError:
            present = False
        return dataclasses.replace(end, perfgraph_ref=name) if present else end


def _dated(end: feedback.AttemptEnd, observed: list[Mapping[str, Any]]) -> feedback.AttemptEnd:
    """The attempt dated by the end of the profiler's window where there is one (the same
    after an operator restart), else by when the operator first saw it end."""
    ends = [
        str(w["end"])
        for e in observed
        if isinstance(w := e.get("window"), Mapping) and isinstance(w.get("end"), str)
    ]
    if not ends:
        return end
    try:
        at = datetime.strptime(max(ends), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return end
    return dataclasses.replace(end, finished_at=at)


def _content(end: feedback.AttemptEnd, observed: list[Mapping[str, Any]]) -> tuple[object, ...]:
    """What a write depends on: an unchanged attempt is not written again."""
    finals = tuple(sorted((str(e.get("updatedAt")), bool(e.get("final"))) for e in observed))
    return (end.outcome, end.perfgraph_ref, finals, end.prediction.predictor_version)


def attempt_ends(
    body: Mapping[str, Any], finished_at: Callable[[str, int], datetime]
) -> list[feedback.AttemptEnd]:
    """The ended attempts of a DLJob object (deleted workloads teach nothing and are left out).

    Raises:
        dljob.InvalidSpecError: the spec does not parse (such a DLJob never ran an attempt).
    """
    metadata = body.get("metadata") or {}
    state = st.read(body.get("status") or {})
    if state.prediction is None or not state.attempts:
        return []
    spec = dljob.parse_spec(body.get("spec") or {})
    uid = str(metadata["uid"])
    family = feedback.family_of(metadata.get("labels"))
    ends = []
    for entry in state.attempts:
        outcome = _OUTCOMES.get(str(entry.get("outcome")))
        if outcome is None:
            continue
        attempt = int(entry["attempt"])
        product, _, profile = str(entry.get("profile", "")).partition("/")
        usable = None
        if state.placed is not None and state.placed.attempt == attempt:
            usable = state.placed.placement.usable_memory_bytes
        observation = entry.get("observation")
        if observation is not None:
            usable = int(observation["memoryBytesAtLeast"])
        ends.append(
            feedback.AttemptEnd(
                namespace=str(metadata.get("namespace", "")),
                dljob=str(metadata.get("name", "")),
                dljob_uid=uid,
                attempt=attempt,
                family=family,
                model_source=spec.model.describe(),
                inputs=dict(spec.inputs),
                optimizer=feedback.default_optimizer(spec.mode),
                gpu_product=product,
                mig_profile=None if profile in ("", "whole") else profile,
                usable_memory_bytes=usable,
                prediction=state.prediction,
                outcome=outcome,
                finished_at=finished_at(uid, attempt),
            )
        )
    return ends
