"""The effects the DLJob state machine needs, as narrow protocols.

The state machine never imports the API client, the model fetcher or kopf: they come in through
these protocols (`kube.KubeCluster`, `models.ModelStore`, `handlers.KopfEvents` and the
learning loop's `observations.operator_hook.OperatorFeedback` in production), so every step is
tested against in-memory fakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from kubeseer.operator import dljob, models
from kubeseer.operator.fetch import cancel
from kubeseer.prediction import Prediction


class EventType(StrEnum):
    """Kubernetes event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Cluster(Protocol):
    """The API calls the state machine makes; failures raise `errors.ApiError` subclasses."""

    def patch_status(self, ref: dljob.DLJobRef, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Merge-patch the DLJob's status; return the status as stored."""
        ...

    def get_dljob(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The DLJob, or None if it is gone."""
        ...

    def create_job(self, manifest: Mapping[str, Any]) -> tuple[bool, Mapping[str, Any]]:
        """Create the Job; (True, it as stored), or (False, the Job of that name that exists)."""
        ...

    def patch_job(
        self, namespace: str, name: str, patch: Mapping[str, Any], *, strategic: bool
    ) -> Mapping[str, Any]:
        """Patch a Job (a strategic merge patch, else a JSON merge patch); the Job as stored."""
        ...

    def job_exists(self, namespace: str, name: str) -> bool:
        """Whether the Job of that name exists."""
        ...

    def create_claim_template(self, manifest: Mapping[str, Any]) -> bool:
        """Create a ResourceClaimTemplate; False if one of that name already exists."""
        ...

    def list_events(
        self, namespace: str, involved_uid: str, reason: str
    ) -> list[Mapping[str, Any]]:
        """The events of one reason about the object with this uid."""
        ...


class Feedback(Protocol):
    """The learning loop's hooks (`kubeseer.observations.operator_hook.OperatorFeedback`)."""

    def serve(
        self, ref: dljob.DLJobRef, spec: dljob.DLJobSpec, prediction: Prediction
    ) -> Prediction:
        """The prediction with the cluster's recalibrated memory bound; never raises."""
        ...

    def model_loaded(self, path: Path, digest: str, spec: dljob.DLJobSpec) -> None:
        """Keep the downloaded model's PerfGraph for retraining; never raises."""
        ...


class ModelLoader(Protocol):
    """Gets a DLJob's model from a URL or a ConfigMap (`models.ModelStore`)."""

    def verified(self, source: dljob.ModelSource, namespace: str) -> str | None:
        """The pinned digest if this very source served it before and it is still cached."""
        ...

    def load(
        self,
        source: dljob.ModelSource,
        namespace: str,
        cancellation: cancel.Cancellation | None = None,
    ) -> models.LoadedModel:
        """The model on disk; raises `fetch.errors.FetchError`."""
        ...


class Events(Protocol):
    """Posts Kubernetes events about a DLJob."""

    def emit(
        self, ref: dljob.DLJobRef, kind: EventType, reason: dljob.Reason, message: str
    ) -> None:
        """Post one event; never raises (an event is not worth failing a reconcile)."""
        ...
