"""Creating an attempt's workload through the backend, and what a refusal means for the DLJob.

`Launcher.ensure` is safe to repeat: the Job's name is a function of the DLJob and the attempt,
so an operator that restarts half-way finds the Job and finishes giving it its GPU. A workload
the API server refuses becomes a `journal.StepError` (a namespace quota waits, an invalid
template fails the DLJob, an outage is retried); the devices counted for it are released.
"""

from __future__ import annotations

from kubeseer.operator import backends, dljob, explain, journal, ports
from kubeseer.operator import errors as api_errors
from kubeseer.operator import status as st

Cond = dljob.ConditionType
Reason = dljob.Reason


class Launcher:
    """Creates workloads.

    Args:
        cluster: where Jobs and claim templates are created.
        backend: how the Job gets its GPU.
        log: events.
    """

    def __init__(
        self, cluster: ports.Cluster, backend: backends.Backend, log: journal.Journal
    ) -> None:
        self.cluster = cluster
        self.backend = backend
        self.log = log

    def ensure(self, attempt: backends.Attempt) -> backends.Launched:
        """Create the attempt's workload (a no-op if it runs already); what was found and done.

        Raises:
            journal.StepError: the API server refused it, or failed.
        """
        try:
            launched = self.backend.launch(self.cluster, attempt)
        except api_errors.ApiError as e:
            self.backend.forget(attempt)
            raise explain.workload_error(e) from e
        except ValueError as e:  # a ladder with no rung: no claim could ever be allocated
            self.backend.forget(attempt)
            raise journal.StepError(Cond.WORKLOAD_READY, Reason.NO_FIT, str(e)) from e
        if launched is backends.Launched.RUNNING:
            # Its pods (or claims) are in the inventory already; counting them again would
            # hide free devices until the assumption expires.
            self.backend.forget(attempt)
        elif launched is backends.Launched.CREATED:
            device = self.backend.device(attempt).describe()
            self.log.emit(
                attempt.ref,
                ports.EventType.NORMAL,
                Reason.CREATED,
                f"Job {attempt.name} created with {device} (attempt {attempt.placed.attempt})",
            )
        return launched

    def next_attempt(self, state: st.DLJobStatus, attempt: backends.Attempt) -> None:
        """Create a later attempt's workload; a workload event is not retried by kopf, so a
        failure here (transient ones were retried by the create) fails the DLJob."""
        try:
            self.ensure(attempt)
        except journal.StepError as e:
            self.log.fail(attempt.ref, state, st.Patch(), e.condition, e.reason, e.message)
