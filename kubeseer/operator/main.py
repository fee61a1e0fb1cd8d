"""The composition root: builds every part of the operator from its configuration and runs kopf.

This is the one module that knows which predictor, fetcher and API client the operator uses;
everything else receives them. `run` blocks until `stop_flag` is set (or a signal arrives when it
runs in the main thread), so tests and the benchmark run the real operator in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import kopf
import kubernetes.client
from prometheus_client import CollectorRegistry, start_http_server

from kubeseer import metrics
from kubeseer.observations import feedback, operator_hook, recalibration
from kubeseer.observations import store as observation_store
from kubeseer.operator import (
    backends,
    checkpoints,
    errors,
    fairpool,
    handlers,
    kube,
    lease,
    models,
    predict,
    reconcile,
)
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator.config import ConfigError, GpuBackend, OperatorConfig
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.fetch import policy as fetch_policy
from kubeseer.placement import catalogue
from kubeseer.zoo import spec as zoo_spec

log = logging.getLogger(__name__)

STALL_SWEEP_S = 1.0
"""How often the attempts that have stalled are looked at (`stalls` decides which are due)."""


@dataclass(frozen=True)
class Operator:
    """A built operator, ready to `run`."""

    config: OperatorConfig
    context: handlers.OperatorContext
    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    metrics_registry: CollectorRegistry
    backend: GpuBackend
    """The GPU backend in use (`KUBESEER_GPU_BACKEND` resolved)."""
    checkpoint: checkpoints.SwappingPredictor | None = None
    """The checkpoint file followed for new versions (None: a predictor given to `build`)."""


def load_checkpoint(path: Path, cache_size: int) -> checkpoints.Loaded:
    """SeerNet-Multi from a checkpoint file, named by its fingerprint.

    Raises:
        ValueError: the file is not a checkpoint this kubeseer can use.
    """
    from kubeseer.predictor import api, checkpoint  # torch loads only when the operator runs

    try:
        ckpt = checkpoint.load(path)
    except checkpoint.CheckpointError as e:
        raise ValueError(str(e)) from e
    name = f"checkpoint {checkpoint.fingerprint(ckpt)[:12]}"
    return checkpoints.Loaded(api.Predictor(ckpt, cache_size=cache_size), name)


def load_predictor(config: OperatorConfig) -> checkpoints.SwappingPredictor:
    """SeerNet-Multi from the configured (or shipped) checkpoint, with the configured cache size,
    naming its checkpoint in every prediction and ready to follow the file (`checkpoints`).

    The predictor's cache is the operator's only one per checkpoint (`kubeseer.predictor.cache`).

    Raises:
        ConfigError: the checkpoint cannot be loaded.
    """
    from kubeseer.predictor import api  # torch loads only when the operator runs

    path = config.predictor_checkpoint or api.default_checkpoint_path()

    def load(at: Path) -> checkpoints.Loaded:
        return load_checkpoint(at, config.prediction_cache_size)

    try:
        first = load(path)
    except ValueError as e:
        raise ConfigError(f"cannot load the predictor checkpoint: {e}") from e
    return checkpoints.SwappingPredictor(path, load, first)


def build(
    config: OperatorConfig,
    *,
    kubeconfig: str | None,
    predictor: predict.Predictor | None = None,
) -> Operator:
    """Wire configuration, API client, fetcher, predictor, inventory and handlers together.

    `predictor` replaces the configured one (tests that need no checkpoint). The GPU backend
    is resolved here, once (`backends.resolve`; auto-detection lists DeviceClasses and nodes).

    Raises:
        ConfigError: the checkpoint or the S3 settings are unusable.
    """
    swapping: checkpoints.SwappingPredictor | None = None
    if predictor is None:
        predictor = swapping = load_predictor(config)
    client = kube.api_client(kubeconfig, pool_size=config.max_workers + config.fetch_workers + 4)
    cluster = kube.KubeCluster(client)
    registry_metrics = CollectorRegistry()
    profiles = sorted(
        f"{m.key}/{p.name or 'whole'}" for m in catalogue.MODELS for p in (m.whole, *m.profiles)
    )
    operator_metrics = metrics.OperatorMetrics(registry_metrics, profiles=profiles)
    inventory = inventory_cache.InventoryCache()
    devices = dra_inventory.DraInventoryCache()
    kind = resolve_backend(config.gpu_backend, cluster)
    fetch_rules = models.fetch_policy(config, cluster)
    feedback = build_feedback(
        config,
        fetch_rules,
        metrics.FeedbackMetrics(registry_metrics, families=zoo_spec.FAMILIES, profiles=profiles),
        cluster,
    )
    reconciler = reconcile.Reconciler(
        cluster=cluster,
        models=models.ModelStore(cluster, fetch_rules),
        predictor=predict.CachedPredictor(predictor, operator_metrics),
        backend=backends.build(kind, inventory, devices),
        events=handlers.KopfEvents(cluster.post_event),
        operator_metrics=operator_metrics,
        config=config,
        work_pool=ThreadPoolExecutor(config.max_workers, thread_name_prefix="kubeseer-work"),
        fetch_pool=fairpool.FairPool(
            config.fetch_workers, max(1, config.fetch_workers // 4), "kubeseer-fetch"
        ),
        feedback=feedback,
    )
    context = handlers.OperatorContext(
        config=config,
        cluster=cluster,
        inventory=inventory,
        reconciler=reconciler,
        login=lambda: connection_info(client.configuration),
        feedback=feedback,
        devices=devices if kind is GpuBackend.DRA else None,
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry, kind)
    settings = kopf.OperatorSettings()
    handlers.configure(settings, config)
    return Operator(config, context, registry, settings, registry_metrics, kind, swapping)


def resolve_backend(setting: GpuBackend, cluster: kube.KubeCluster) -> GpuBackend:
    """The GPU backend, auto-detected from the cluster where the setting says `auto`.

    An API server that cannot be asked (down, or DRA not readable by this identity) leaves
    auto on extended resources, which every Kubernetes release serves; the log says why.
    """
    classes: list[str] = []
    nodes: list[Mapping[str, object]] = []
    if setting is GpuBackend.AUTO:
        try:
            classes = cluster.list_device_classes()
            nodes = list(cluster.list_nodes())
        except errors.ApiError as e:
            log.warning("GPU backend: auto-detection could not read the cluster: %s", e)
    kind, why = backends.resolve(setting, classes, nodes)
    log.info("GPU backend: %s (%s)", kind.value, why)
    return kind


def build_feedback(
    config: OperatorConfig,
    fetch_rules: fetch_policy.FetchPolicy,
    feedback_metrics: metrics.FeedbackMetrics,
    cluster: kube.KubeCluster,
) -> operator_hook.OperatorFeedback:
    """The learning loop: the observation store (if configured), read back into the margins.

    A store that cannot be read at start is logged, not fatal: the operator serves DLJobs with
    the checkpoint's margins and writes records again once the store answers.

    Raises:
        ConfigError: the store's location is malformed.
    """
    records = None
    if config.observation_store:
        endpoint, credentials = fetch_rules.s3_endpoint, fetch_rules.s3_credentials
        settings = observation_store.S3Settings(
            endpoint_url=endpoint.url if endpoint else None,
            region=endpoint.region if endpoint else "us-east-1",
            access_key_id=credentials.access_key_id if credentials else None,
            secret_access_key=credentials.secret_access_key if credentials else None,
            session_token=credentials.session_token if credentials else None,
        )
        try:
            records = observation_store.open_store(config.observation_store, settings)
        except observation_store.StoreError as e:
            raise ConfigError(f"KUBESEER_OBSERVATION_STORE: {e}") from e
    recorder = feedback.FeedbackRecorder(
        records,
        recalibration.Recalibrator(
            window=config.recalibration_window, min_samples=config.recalibration_min_samples
        ),
        feedback_metrics,
    )
    try:
        found = recorder.warm_start()
    except observation_store.StoreError as e:
        log.warning("observation store unreadable at start, margins start empty: %s", e)
    else:
        if found is not None:
            log.info("observation store %s: %d observations read", records, len(found.observations))

    def labels(namespace: str, name: str) -> Mapping[str, str] | None:
        body = cluster.get_dljob(namespace, name)
        return None if body is None else (body.get("metadata") or {}).get("labels") or {}

    return operator_hook.OperatorFeedback(recorder, labels)


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the kubernetes client's configuration (token or client cert)."""
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


class LeaseLostError(RuntimeError):
    """The operator stopped because another may now hold its Lease; restart to wait again."""


def run(
    operator: Operator,
    *,
    namespaces: Sequence[str] = (),
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Serve `/metrics`, take the leader Lease, then run kopf until stopped.

    Cluster-wide unless namespaces are given. Without the Lease, the operator waits (serving
    metrics) until the holder stops renewing it or `stop_flag` is set; `ready_flag` is set once
    kopf watches, so a waiting operator is not ready.

    Raises:
        ConfigError: a port is in use or the Lease cannot be read at all.
        LeaseLostError: the Lease could not be renewed, so kopf was stopped.
    """
    config = operator.config
    stop = stop_flag or threading.Event()
    lost = threading.Event()
    _require_free_port(config.health_port, "KUBESEER_HEALTH_PORT")
    server = _serve_metrics(operator)
    finished = threading.Event()
    leader = (
        lease.LeaderLease(
            operator.context.cluster,
            config.operator_namespace,
            config.lease_name,
            lease.identity(),
            config.lease_duration_s,
        )
        if config.leader_election
        else None
    )
    try:
        if leader is not None:
            try:
                if not leader.acquire(stop):
                    return
            except errors.ApiError as e:
                raise ConfigError(
                    f"cannot take Lease {config.operator_namespace}/{config.lease_name}: {e} "
                    "(KUBESEER_LEADER_ELECTION=false runs without one: a single process only)"
                ) from e

            def give_up() -> None:
                lost.set()
                stop.set()

            threading.Thread(
                target=leader.hold,
                args=(finished, give_up),
                name="kubeseer-lease",
                daemon=True,
            ).start()
        follows = config.predictor_checkpoint and config.checkpoint_check_s > 0
        if operator.checkpoint is not None and follows:
            # A new checkpoint at KUBESEER_PREDICTOR_CHECKPOINT serves without a restart.
            threading.Thread(
                target=operator.checkpoint.watch,
                args=(finished, config.checkpoint_check_s),
                name="kubeseer-checkpoint",
                daemon=True,
            ).start()
        # Attempts whose Job lacks pods, or whose pods wait unschedulable, are looked at from
        # the watches' record of them, apart from any one object's events.
        threading.Thread(
            target=_sweep_stalls,
            args=(operator.context.reconciler, finished),
            name="kubeseer-stalls",
            daemon=True,
        ).start()
        if namespaces:
            # kopf then watches pods of these namespaces only; GPU pods elsewhere hold GPUs.
            threading.Thread(
                target=_resync_inventory,
                args=(operator.context, config.inventory_resync_s, finished),
                name="kubeseer-inventory-resync",
                daemon=True,
            ).start()
        liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
        # kopf waits for `stop` in a thread of the loop's default executor, which `asyncio.run`
        # joins on the way out: after a SIGTERM nobody set the flag, and the process hung until
        # kopf's last resort, a SIGKILL 10 minutes later. On a loop of our own the flag is set
        # once kopf has stopped, whatever stopped it, and then the executor is joined.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(
                _kopf(operator, namespaces, stop=stop, ready=ready_flag, liveness=liveness)
            )
        finally:
            stop.set()
            _close_loop(loop)
    finally:
        finished.set()
        reconciler = operator.context.reconciler
        if reconciler.work_pool is not None:
            reconciler.work_pool.shutdown(wait=False, cancel_futures=True)
        if reconciler.fetch_pool is not None:
            reconciler.fetch_pool.shutdown(cancel_futures=True)
        if leader is not None and not lost.is_set():
            leader.release()
        if server is not None:
            server.shutdown()
            server.server_close()
    if lost.is_set():
        raise LeaseLostError(
            f"Lease {config.operator_namespace}/{config.lease_name} was not renewed in time"
        )


async def _kopf(
    operator: Operator,
    namespaces: Sequence[str],
    *,
    stop: threading.Event,
    ready: threading.Event | None,
    liveness: str | None,
) -> None:
    """kopf until `stop` is set; in the main thread SIGTERM and SIGINT set it.

    kopf's own signal handlers stop it through a flag of their own and leave its task waiting
    for `stop` pending, so its shutdown spent its whole 5 s wait for unfinished handlers on that
    task. Set by the signal, `stop` ends that task at once, and the wait lasts only as long as
    the reconciles in flight (every step of which is safe to repeat).
    """
    existing = asyncio.all_tasks()  # this task among them: kopf must not wait for it
    tasks = await kopf.spawn_tasks(
        registry=operator.registry,
        settings=operator.settings,
        memo=operator.context,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
        stop_flag=stop,
        ready_flag=ready,
    )
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)  # replaces kopf's
    await kopf.run_tasks(tasks, ignored=existing)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What `asyncio.run` does after its coroutine: cancel what is left, then close."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


def _serve_metrics(operator: Operator) -> WSGIServer | None:
    port = operator.config.metrics_port
    if not port:
        return None
    try:
        server, _ = start_http_server(port, registry=operator.metrics_registry)
    except OSError as e:
        raise ConfigError(f"KUBESEER_METRICS_PORT={port}: cannot listen: {e.strerror or e}") from e
    log.info("metrics on :%d/metrics", port)
    return server


def _require_free_port(port: int, variable: str) -> None:
    """Fail with one line, not kopf's traceback, when another process holds the port."""
    if not port:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            raise ConfigError(f"{variable}={port}: cannot listen: {e.strerror or e}") from e


def _sweep_stalls(reconciler: reconcile.Reconciler, finished: threading.Event) -> None:
    """`Reconciler.sweep` every `STALL_SWEEP_S` until the operator stops."""
    while not finished.wait(STALL_SWEEP_S):
        try:
            reconciler.sweep()
        except Exception:  # the thread must outlive any one bad look; the log says what
            log.exception("looking at stalled attempts failed")


def _resync_inventory(
    context: handlers.OperatorContext, period_s: float, finished: threading.Event
) -> None:
    """Re-list the inventory cluster-wide every `period_s` (namespaced operators only): nodes
    and pods, or under DRA slices and claims, since claims of other namespaces hold devices."""
    while not finished.wait(period_s):
        cluster = context.cluster
        try:
            if context.devices is None:
                context.inventory.replace_all(cluster.list_nodes(), cluster.list_pods())
            else:
                context.devices.replace_all(
                    cluster.list_resource_slices(),
                    cluster.list_resource_claims(),
                    [inventory_cache.node_record(n) for n in cluster.list_nodes()],
                )
        except errors.ApiError as e:
            log.warning("GPU inventory resync failed, keeping the last one: %s", e)


__all__ = [
    "LeaseLostError",
    "Operator",
    "build",
    "connection_info",
    "load_checkpoint",
    "load_predictor",
    "run",
]
