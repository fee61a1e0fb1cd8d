"""kopf handlers: typed shells that turn watch events into calls of the plain reconcile functions.

Each shell unpacks kopf's kwargs, calls one function of `reconcile` (or the inventory cache) and
maps the outcome onto kopf's error vocabulary: a transient failure becomes
`kopf.TemporaryError(delay=...)` (kopf retries the handler), a DLJob marked Failed becomes
`kopf.PermanentError`. The shells are coroutines: waiting for a download or a worker thread
holds nothing but a coroutine, so no number of slow model servers can take the threads other
DLJobs need. Handlers are registered on a registry passed in, so that tests and a second
operator in the same process each have their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf

from kubeseer.observations import operator_hook
from kubeseer.operator import backoff, dljob, errors, journal, pods, ports, reconcile, workload
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator.config import GpuBackend, OperatorConfig
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.kube import KubeCluster

_EVENT_BACKOFF = backoff.Backoff(tries=3, base_s=0.5, max_s=2.0)


@dataclass(frozen=True)
class OperatorContext:
    """What every handler needs, handed to kopf as the operator's `memo`."""

    config: OperatorConfig
    cluster: KubeCluster
    inventory: inventory_cache.InventoryCache
    reconciler: reconcile.Reconciler
    login: Callable[[], kopf.ConnectionInfo]
    feedback: operator_hook.OperatorFeedback | None = None
    devices: dra_inventory.DraInventoryCache | None = None
    """The DRA driver's devices and the claims' allocations (the DRA backend only)."""


def _context(memo: object) -> OperatorContext:
    """kopf types the memo as Any; the operator always passes an `OperatorContext`."""
    if not isinstance(memo, OperatorContext):
        raise TypeError(f"the operator's memo must be an OperatorContext, not {type(memo)}")
    return memo


EventPoster = Callable[[dljob.DLJobRef, ports.EventType, dljob.Reason, str], None]
"""Posts one event about a DLJob at once (`kube.KubeCluster.post_event`)."""


class KopfEvents:
    """`ports.Events` over kopf's event poster (batched, asynchronous, never raising).

    kopf queues events only from inside the handling of a watched object; the steps that run
    elsewhere (the sweep of stalled attempts, on a thread of its own) post theirs through
    `elsewhere` (`kube.KubeCluster.post_event`).
    """

    def __init__(self, elsewhere: EventPoster | None = None) -> None:
        self.elsewhere = elsewhere

    def emit(
        self,
        ref: dljob.DLJobRef,
        kind: ports.EventType,
        reason: dljob.Reason,
        message: str,
    ) -> None:
        """Queue one event on the DLJob."""
        body = {
            "apiVersion": dljob.API_VERSION,
            "kind": dljob.KIND,
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        }
        try:
            kopf.event(
                cast(Any, body), type=kind.value, reason=reason.value, message=message[:1024]
            )
        except LookupError:  # kopf's context is not set: not inside a handler
            if self.elsewhere is not None:
                self.elsewhere(ref, kind, reason, message)


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """kopf settings for an operator with least-privilege RBAC.

    Scanning is disabled, so kopf needs no CRD or namespace watches; only warnings become
    Kubernetes events (the reconcile posts its own events for every decision). The reconciles
    run on the operator's own pools (`reconcile.Reconciler`), kopf's pool only serves kopf.
    """
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = config.max_workers
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 310
    settings.watching.connect_timeout = 30
    # Handler progress in status.kopf only (the default also mirrors it into annotations):
    # one store to read and clear on every DLJob event, and the DLJob's metadata stays clean.
    settings.persistence.progress_storage = kopf.StatusProgressStorage()


def on_login(*, memo: Any, **_: Any) -> kopf.ConnectionInfo:
    """Authenticate kopf with the same credentials as the operator's API client."""
    return _context(memo).login()


def on_startup(*, memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    """Seed the GPU inventory before any DLJob is placed."""
    memo = _context(memo)
    nodes = memo.cluster.list_nodes()
    if memo.devices is None:
        memo.inventory.replace_all(nodes, memo.cluster.list_pods())
    else:
        memo.devices.replace_all(
            memo.cluster.list_resource_slices(),
            memo.cluster.list_resource_claims(),
            [inventory_cache.node_record(n) for n in nodes],
        )
    offers = memo.reconciler.backend.snapshot().offers
    logger.info(
        "GPU inventory seeded (%s): %d kinds of device on %d nodes",
        memo.reconciler.backend.kind.value,
        len(offers),
        len({o.node for o in offers}),
    )


async def on_dljob(
    *,
    memo: Any,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    name: str,
    namespace: str | None,
    uid: str,
    retry: int,
    **_: Any,
) -> None:
    """Reconcile a new DLJob, or one found when the operator starts."""
    memo = _context(memo)
    ref = dljob.DLJobRef(namespace=namespace or "", name=name, uid=uid)
    try:
        await memo.reconciler.reconcile(ref, spec, status, retry=retry)
    except journal.RetryLaterError as e:
        raise kopf.TemporaryError(str(e), delay=e.delay) from e
    except journal.DLJobFailedError as e:
        raise kopf.PermanentError(str(e)) from e
    except errors.OperatorError as e:
        if e.transient:
            raise kopf.TemporaryError(str(e), delay=memo.config.retry_delay_s) from e
        raise kopf.PermanentError(str(e)) from e


async def on_dljob_event(*, memo: Any, event: Mapping[str, Any], **_: Any) -> None:
    """The attempts that ended (and the profiler's reports of them) become observations."""
    memo = _context(memo)
    body = event.get("object") or {}
    if memo.feedback is not None and (body.get("status") or {}).get("attempts"):
        await reconcile.in_thread(memo.reconciler.work_pool, memo.feedback.dljob_changed, body)


async def on_workload_job(
    *,
    memo: Any,
    event: Mapping[str, Any],
    body: Mapping[str, Any],
    labels: Mapping[str, str],
    name: str,
    namespace: str | None,
    **_: Any,
) -> None:
    """Follow an attempt's Job; its pods are read only once it has failed (to tell an OOM, a
    failure of the job's own and a pod deleted by hand apart).

    Most Job events (created, resumed, still pending) change nothing; they are classified on
    the event loop and only the others cost a worker thread and API calls.
    """
    memo = _context(memo)
    namespace = namespace or ""
    memo.reconciler.stalls.observe_job(event.get("type"), body)
    if event.get("type") == "DELETED":
        await _observe(memo, namespace, body, labels, pods.deleted("Job", name, body))
        return
    failed = any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for c in (body.get("status") or {}).get("conditions") or []
    )
    job_pods = (
        await reconcile.in_thread(
            memo.reconciler.work_pool, memo.cluster.list_job_pods, namespace, name
        )
        if failed
        else []
    )
    verdict = pods.classify_job(body, job_pods)
    if verdict.outcome is pods.PodOutcome.PENDING:
        return
    await _observe(memo, namespace, body, labels, verdict)


async def _observe(
    memo: OperatorContext,
    namespace: str,
    body: Mapping[str, Any],
    labels: Mapping[str, str],
    verdict: pods.Verdict,
) -> None:
    """Hand a workload's outcome to the reconciler on a worker thread. kopf does not retry
    event handlers, so transient API errors are retried here."""
    owner = workload.owning_dljob(body)
    attempt = _attempt(labels)
    if owner is None or attempt is None:
        return

    def observe() -> None:
        memo.reconciler.observe_workload(namespace, owner, attempt, verdict)

    await reconcile.in_thread(memo.reconciler.work_pool, backoff.retrying, observe, _EVENT_BACKOFF)


def _attempt(labels: Mapping[str, str]) -> int | None:
    try:
        return int(labels[workload.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


async def on_node(*, memo: Any, event: Mapping[str, Any], **_: Any) -> None:
    """Keep the inventory's nodes current."""
    memo = _context(memo)
    kind, node = event.get("type"), event.get("object") or {}
    memo.inventory.observe_node(kind, node)
    if memo.devices is not None:
        memo.devices.observe_node(kind, inventory_cache.node_record(node))


async def on_pod(*, memo: Any, event: Mapping[str, Any], **_: Any) -> None:
    """Keep the inventory's GPU pods current (extended resources), and what the attempts' pods
    wait for (`stalls`)."""
    memo = _context(memo)
    kind, pod = event.get("type"), event.get("object") or {}
    memo.inventory.observe_pod(kind, pod)
    memo.reconciler.stalls.observe_pod(kind, pod)


async def on_resource_slice(*, memo: Any, event: Mapping[str, Any], **_: Any) -> None:
    """Keep the DRA inventory's devices current."""
    devices = _context(memo).devices
    if devices is not None:
        devices.observe_slice(event.get("type"), event.get("object") or {})


async def on_resource_claim(*, memo: Any, event: Mapping[str, Any], **_: Any) -> None:
    """Keep the DRA inventory's allocations current; an allocated claim of a DLJob's attempt
    goes into the DLJob's status."""
    memo = _context(memo)
    body = event.get("object") or {}
    metadata = body.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    owner = (metadata.get("annotations") or {}).get(workload.ANNOTATION_DLJOB_NAME)
    attempt = _attempt(metadata.get("labels") or {})
    ours = owner is not None and attempt is not None
    if memo.devices is not None:
        key = f"{namespace}/{owner}#{attempt}" if ours else None
        memo.devices.observe_claim(event.get("type"), body, key)
    allocated = bool((body.get("status") or {}).get("allocation"))
    if owner is None or attempt is None or event.get("type") == "DELETED" or not allocated:
        return
    dljob_name, number = str(owner), attempt

    def observe() -> None:
        memo.reconciler.observe_allocation(namespace, dljob_name, number, body)

    await reconcile.in_thread(memo.reconciler.work_pool, backoff.retrying, observe, _EVENT_BACKOFF)


def register(registry: kopf.OperatorRegistry, backend: GpuBackend = GpuBackend.EXTENDED) -> None:
    """Register every handler of the operator on `registry`: the inventory's watches of the
    backend in use (pods for extended resources; ResourceSlices and ResourceClaims for DRA)."""
    kopf.on.login(registry=registry)(on_login)
    kopf.on.startup(registry=registry)(on_startup)
    # The inventory first: kopf runs an object's event handlers in order, so a freed device has
    # left the inventory before its DLJob's next attempt is placed.
    kopf.on.event("", "v1", "nodes", registry=registry)(on_node)
    if backend is GpuBackend.DRA:
        kopf.on.event("resource.k8s.io", "v1", "resourceslices", registry=registry)(
            on_resource_slice
        )
        kopf.on.event("resource.k8s.io", "v1", "resourceclaims", registry=registry)(
            on_resource_claim
        )
    else:
        kopf.on.event("", "v1", "pods", registry=registry)(on_pod)
    for decorator in (kopf.on.create, kopf.on.resume):
        decorator(dljob.GROUP, dljob.VERSION, dljob.PLURAL, registry=registry, id="reconcile")(
            on_dljob
        )
    kopf.on.event(dljob.GROUP, dljob.VERSION, dljob.PLURAL, registry=registry)(on_dljob_event)
    selector = {workload.LABEL_DLJOB: kopf.PRESENT, workload.LABEL_ATTEMPT: kopf.PRESENT}
    kopf.on.event("batch", "v1", "jobs", labels=selector, registry=registry)(on_workload_job)
