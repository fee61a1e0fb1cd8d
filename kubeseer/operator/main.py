"""The composition root: builds every part of the operator from its configuration and runs kopf.

This is the one module that knows which predictor, fetcher and API client the operator uses;
everything else receives them. `run` blocks until `stop_flag` is set (or a signal arrives when it
runs in the main thread), so tests and the benchmark run the real operator in a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import kopf
import kubernetes.client
from prometheus_client import CollectorRegistry, start_http_server

from kubeseer import metrics
from kubeseer.operator import handlers, kube, models, predict, reconcile
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.placement import catalogue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Operator:
    """A built operator, ready to `run`."""

    config: OperatorConfig
    context: handlers.OperatorContext
    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    metrics_registry: CollectorRegistry


def load_predictor(config: OperatorConfig) -> predict.Predictor:
    """SeerNet-Multi from the configured (or shipped) checkpoint, with the configured cache size.

    The predictor's cache is the operator's only one (`kubeseer.predictor.cache`).
    """
    from kubeseer.predictor import api, checkpoint  # torch loads only when the operator runs

    try:
        ckpt = checkpoint.load(config.predictor_checkpoint or api.default_checkpoint_path())
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"cannot load the predictor checkpoint: {e}") from e
    return api.Predictor(ckpt, cache_size=config.prediction_cache_size)


def build(
    config: OperatorConfig,
    *,
    kubeconfig: str | None,
    predictor: predict.Predictor | None = None,
) -> Operator:
    """Wire configuration, API client, fetcher, predictor, inventory and handlers together.

    `predictor` replaces the configured one (tests that need no checkpoint).

    Raises:
        ConfigError: the checkpoint or the S3 settings are unusable.
    """
    client = kube.api_client(kubeconfig, pool_size=config.max_workers + 4)
    cluster = kube.KubeCluster(client)
    registry_metrics = CollectorRegistry()
    profiles = sorted(
        f"{m.key}/{p.name or 'whole'}" for m in catalogue.MODELS for p in (m.whole, *m.profiles)
    )
    operator_metrics = metrics.OperatorMetrics(registry_metrics, profiles=profiles)
    inventory = inventory_cache.InventoryCache()
    reconciler = reconcile.Reconciler(
        cluster=cluster,
        models=models.ModelStore(cluster, models.fetch_policy(config, cluster)),
        predictor=predict.CachedPredictor(predictor or load_predictor(config), operator_metrics),
        inventory=inventory,
        events=handlers.KopfEvents(),
        operator_metrics=operator_metrics,
        config=config,
    )
    context = handlers.OperatorContext(
        config=config,
        cluster=cluster,
        inventory=inventory,
        reconciler=reconciler,
        login=lambda: connection_info(client.configuration),
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    settings = kopf.OperatorSettings()
    handlers.configure(settings, config)
    return Operator(config, context, registry, settings, registry_metrics)


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


def run(
    operator: Operator,
    *,
    namespaces: Sequence[str] = (),
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    """Serve `/metrics`, then run kopf until stopped; cluster-wide unless namespaces are given."""
    config = operator.config
    server = None
    if config.metrics_port:
        server, _ = start_http_server(config.metrics_port, registry=operator.metrics_registry)
        log.info("metrics on :%d/metrics", config.metrics_port)
    liveness = f"http://0.0.0.0:{config.health_port}/healthz" if config.health_port else None
    finished = threading.Event()
    if namespaces:
        # kopf then watches pods of these namespaces only; GPU pods elsewhere still hold GPUs.
        threading.Thread(
            target=_resync_inventory,
            args=(operator.context, config.inventory_resync_s, finished),
            name="kubeseer-inventory-resync",
            daemon=True,
        ).start()
    try:
        kopf.run(
            registry=operator.registry,
            settings=operator.settings,
            memo=operator.context,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        finished.set()
        if server is not None:
            server.shutdown()
            server.server_close()


def _resync_inventory(
    context: handlers.OperatorContext, period_s: float, finished: threading.Event
) -> None:
    """Re-list nodes and pods cluster-wide every `period_s` (namespaced operators only)."""
    while not finished.wait(period_s):
        try:
            context.inventory.replace_all(context.cluster.list_nodes(), context.cluster.list_pods())
        except reconcile.ClusterError as e:
            log.warning("GPU inventory resync failed, keeping the last one: %s", e)


__all__ = ["Operator", "build", "connection_info", "load_predictor", "run"]
