"""Where a DLJob's model bytes come from: a URL (through `fetch`) or a ConfigMap key.

Both paths go through the same rules of `fetch` (size limit, sha256 when given, digest cache),
and end in the same typed failure, `reconcile.ModelError`, whose reason lands in the DLJob's
`ModelReady` condition.
"""

from __future__ import annotations

from kubeseer import metrics
from kubeseer.operator import dljob, fetch, kube
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.operator.reconcile import ClusterError, LoadedModel, ModelError

Reason = dljob.Reason

_REASONS = {
    metrics.FetchFailure.UNREACHABLE: Reason.MODEL_UNREACHABLE,
    metrics.FetchFailure.REFUSED: Reason.MODEL_REFUSED,
    metrics.FetchFailure.TOO_LARGE: Reason.MODEL_TOO_LARGE,
    metrics.FetchFailure.DIGEST_MISMATCH: Reason.DIGEST_MISMATCH,
    metrics.FetchFailure.NOT_FOUND: Reason.MODEL_NOT_FOUND,
    metrics.FetchFailure.INVALID: Reason.MODEL_SOURCE_INVALID,
}


def _model_error(e: fetch.FetchError) -> ModelError:
    return ModelError(_REASONS[e.failure], e.failure, str(e), transient=e.transient)


def fetch_policy(config: OperatorConfig, cluster: kube.KubeCluster) -> fetch.FetchPolicy:
    """The fetch rules the configuration sets, with S3 credentials read from their Secret.

    Raises:
        ConfigError: the S3 endpoint is malformed, or the named Secret cannot be read.
    """
    endpoint = None
    credentials = None
    if config.s3_endpoint:
        try:
            endpoint = fetch.S3Endpoint(config.s3_endpoint)
        except fetch.FetchError as e:
            raise ConfigError(f"KUBESEER_S3_ENDPOINT: {e}") from e
    if config.s3_secret:
        try:
            secret = cluster.read_secret(config.operator_namespace, config.s3_secret)
        except ClusterError as e:
            raise ConfigError(f"KUBESEER_S3_SECRET: {e}") from e
        if "accessKeyId" not in secret or "secretAccessKey" not in secret:
            raise ConfigError(
                f"KUBESEER_S3_SECRET: Secret {config.operator_namespace}/{config.s3_secret} "
                "needs the keys accessKeyId and secretAccessKey"
            )
        token = secret.get("sessionToken")
        credentials = fetch.S3Credentials(
            access_key_id=secret["accessKeyId"].decode(),
            secret_access_key=secret["secretAccessKey"].decode(),
            session_token=token.decode() if token else None,
        )
    return fetch.FetchPolicy(
        max_bytes=config.fetch_max_bytes,
        connect_timeout_s=config.fetch_connect_timeout_s,
        read_timeout_s=config.fetch_read_timeout_s,
        allowed_hosts=frozenset(config.fetch_allowed_hosts),
        cache_dir=config.fetch_cache_dir,
        s3_endpoint=endpoint,
        s3_credentials=credentials,
    )


class ModelStore:
    """`reconcile.ModelLoader` over URLs and ConfigMaps.

    Args:
        cluster: reads ConfigMaps.
        policy: limits, SSRF guard, retries and digest cache of `fetch`.
    """

    def __init__(self, cluster: kube.KubeCluster, policy: fetch.FetchPolicy) -> None:
        self.cluster = cluster
        self.policy = policy

    def load(self, source: dljob.ModelSource, namespace: str) -> LoadedModel:
        """The model bytes and digest; raises `ModelError`."""
        try:
            if source.url is not None:
                fetched = fetch.fetch(fetch.ModelSource(source.url, source.sha256), self.policy)
                return LoadedModel(fetched.read_bytes(), fetched.sha256)
            assert source.config_map is not None
            data = self._config_map_bytes(source.config_map, namespace)
            where = f"ConfigMap {namespace}/{source.config_map.name}"
            fetched = fetch.from_bytes(data, self.policy, sha256=source.sha256, source=where)
            return LoadedModel(data, fetched.sha256)
        except fetch.FetchError as e:
            raise _model_error(e) from e
        except OSError as e:
            raise ModelError(
                Reason.MODEL_UNREACHABLE,
                metrics.FetchFailure.UNREACHABLE,
                f"cannot read the fetched model from the cache: {e}",
                transient=True,
            ) from e

    def _config_map_bytes(self, ref: dljob.ConfigMapRef, namespace: str) -> bytes:
        where = f"ConfigMap {namespace}/{ref.name}"
        try:
            data = self.cluster.read_config_map_key(namespace, ref.name, ref.key)
        except ClusterError as e:
            failure = (
                metrics.FetchFailure.UNREACHABLE if e.transient else metrics.FetchFailure.NOT_FOUND
            )
            raise ModelError(
                _REASONS[failure], failure, f"cannot read {where}: {e}", transient=e.transient
            ) from e
        if data is None:
            raise ModelError(
                Reason.MODEL_NOT_FOUND,
                metrics.FetchFailure.NOT_FOUND,
                f"{where} has no key {ref.key!r} in binaryData or data",
                transient=False,
            )
        return data
