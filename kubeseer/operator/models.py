"""Where a DLJob's model bytes come from: a URL (through `fetch`) or a ConfigMap key.

Both paths obey the same rules (size limit, sha256 when given, digest cache) and fail with the
same typed errors (`fetch.errors`), whose class becomes the DLJob's `ModelReady` reason.

A sha256 in the spec pins the bytes; it never stands in for them. The store remembers which
source, in which namespace, served which digest: only a source that has itself served the pinned
digest is answered from the cache without asking it again. So a digest copied from another
tenant's DLJob, with a URL or ConfigMap of one's own, gets nothing but what one's own source
serves (and a `DigestMismatch` when that differs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kubeseer.operator import dljob, errors
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.operator.fetch import cache, cancel, download, policy
from kubeseer.operator.fetch import errors as fetch_errors

_REMEMBERED_SOURCES = 4096


class ClusterReads(Protocol):
    """The API reads model loading needs (`kube.KubeCluster` has them)."""

    def read_config_map_key(self, namespace: str, name: str, key: str) -> bytes | None:
        """The bytes under `key` of a ConfigMap; None if the key is absent."""
        ...

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """A Secret's data, decoded."""
        ...


@dataclass(frozen=True)
class LoadedModel:
    """A verified model on disk under a name only its reader holds.

    `path` stays readable however the cache evicts, until `release` removes it; whoever loads a
    model releases it once the prediction is made.
    """

    path: Path
    digest: str
    size: int
    from_cache: bool

    def release(self) -> None:
        """Drop the private name (the bytes go once no one else names them)."""
        self.path.unlink(missing_ok=True)

    def describe(self) -> str:
        """`N bytes, sha256 D` for the ModelReady condition."""
        return f"{self.size} bytes, sha256 {self.digest}"


def fetch_policy(config: OperatorConfig, cluster: ClusterReads) -> policy.FetchPolicy:
    """The fetch rules the configuration sets, with S3 credentials read from their Secret.

    Raises:
        ConfigError: the S3 endpoint is malformed, or the named Secret cannot be read.
    """
    endpoint = None
    credentials = None
    if config.s3_endpoint:
        try:
            endpoint = policy.S3Endpoint(config.s3_endpoint)
        except fetch_errors.FetchError as e:
            raise ConfigError(f"KUBESEER_S3_ENDPOINT: {e}") from e
    if config.s3_secret:
        try:
            secret = cluster.read_secret(config.operator_namespace, config.s3_secret)
        except errors.ApiError as e:
            raise ConfigError(f"KUBESEER_S3_SECRET: {e}") from e
        if "accessKeyId" not in secret or "secretAccessKey" not in secret:
            raise ConfigError(
                f"KUBESEER_S3_SECRET: Secret {config.operator_namespace}/{config.s3_secret} "
                "needs the keys accessKeyId and secretAccessKey"
            )
        token = secret.get("sessionToken")
        credentials = policy.S3Credentials(
            access_key_id=secret["accessKeyId"].decode(),
            secret_access_key=secret["secretAccessKey"].decode(),
            session_token=token.decode() if token else None,
        )
    return policy.FetchPolicy(
        max_bytes=config.fetch_max_bytes,
        connect_timeout_s=config.fetch_connect_timeout_s,
        read_timeout_s=config.fetch_read_timeout_s,
        total_timeout_s=config.fetch_timeout_s,
        min_rate_bytes_s=config.fetch_min_rate_bytes_s,
        allowed_hosts=frozenset(config.fetch_allowed_hosts),
        cache_dir=config.fetch_cache_dir,
        s3_endpoint=endpoint,
        s3_credentials=credentials,
    )


class ModelStore:
    """`reconcile.ModelLoader` over URLs and ConfigMaps.

    Args:
        cluster: reads ConfigMaps.
        rules: limits, SSRF guard, retries and digest cache of `fetch`.
    """

    def __init__(self, cluster: ClusterReads, rules: policy.FetchPolicy) -> None:
        self.cluster = cluster
        self.rules = rules
        self.cache = cache.DigestCache(rules.cache_dir, rules.cache_max_bytes)
        self.cache.sweep()
        self._lock = threading.Lock()
        self._served: OrderedDict[tuple[str, str], str] = OrderedDict()

    def verified(self, source: dljob.ModelSource, namespace: str) -> str | None:
        """The pinned digest, if this source in this namespace served it and it is still cached.

        Only then may a prediction cached for the digest be used without reading the model.
        """
        if source.sha256 is None:
            return None
        with self._lock:
            served = self._served.get(_key(source, namespace))
        if served != source.sha256 or self.cache.get(served) is None:
            return None
        return served

    def load(
        self,
        source: dljob.ModelSource,
        namespace: str,
        cancellation: cancel.Cancellation | None = None,
    ) -> LoadedModel:
        """The verified model, checked out for the caller (who must `release` it).

        Raises:
            fetch.errors.FetchError: a subclass naming why the model cannot be had.
        """
        pinned = self.verified(source, namespace)
        if pinned is not None:
            hit = self.cache.get(pinned)
            if hit is not None:
                return LoadedModel(self.cache.checkout(pinned), pinned, hit[1], from_cache=True)
        if source.url is not None:
            fetched = download.fetch(
                source.url, self.rules, sha256=source.sha256, cancellation=cancellation
            )
        else:
            assert source.config_map is not None
            where = f"ConfigMap {namespace}/{source.config_map.name}"
            data = self._config_map_bytes(source.config_map, namespace, where)
            fetched = download.from_bytes(data, self.rules, sha256=source.sha256, source=where)
        with self._lock:
            self._served[_key(source, namespace)] = fetched.sha256
            self._served.move_to_end(_key(source, namespace))
            while len(self._served) > _REMEMBERED_SOURCES:
                self._served.popitem(last=False)
        return LoadedModel(
            self.cache.checkout(fetched.sha256), fetched.sha256, fetched.size, from_cache=False
        )

    def _config_map_bytes(self, ref: dljob.ConfigMapRef, namespace: str, where: str) -> bytes:
        try:
            data = self.cluster.read_config_map_key(namespace, ref.name, ref.key)
        except errors.NotFoundError as e:
            raise fetch_errors.NotFoundError(f"cannot read {where}: {e}") from e
        except errors.ApiError as e:
            if e.transient:
                raise fetch_errors.UnreachableError(f"cannot read {where}: {e}") from e
            raise fetch_errors.AccessDeniedError(f"cannot read {where}: {e}") from e
        if data is None:
            raise fetch_errors.NotFoundError(
                f"{where} has no key {ref.key!r} in binaryData or data"
            )
        return data


def _key(source: dljob.ModelSource, namespace: str) -> tuple[str, str]:
    """Which source, as the DLJob names it, in which namespace."""
    if source.url is not None:
        return namespace, source.url
    assert source.config_map is not None
    return namespace, f"configmap/{source.config_map.name}/{source.config_map.key}"
