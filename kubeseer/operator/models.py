"""Where a DLJob's model bytes come from: a URL (through `fetch`) or a ConfigMap key.

Both paths end in the same checks (size limit, sha256 when given) and the same typed failure,
`reconcile.ModelError`, whose reason lands in the DLJob's `ModelReady` condition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from kubeseer import metrics
from kubeseer.operator import dljob, kube
from kubeseer.operator.config import OperatorConfig
from kubeseer.operator.reconcile import ClusterError, LoadedModel, ModelError

UrlFetcher = Callable[[str, str | None], LoadedModel]
"""(url, expected sha256 or None) -> the model; raises `ModelError`."""


class ModelStore:
    """`reconcile.ModelLoader` over URLs and ConfigMaps.

    Args:
        config: size limit for ConfigMap models (URLs are limited by the fetcher).
        cluster: reads ConfigMaps.
        fetch_url: the URL fetcher (SSRF guard, timeouts, retries and digest cache live there).
    """

    def __init__(
        self, config: OperatorConfig, cluster: kube.KubeCluster, fetch_url: UrlFetcher
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.fetch_url = fetch_url

    def load(self, source: dljob.ModelSource, namespace: str) -> LoadedModel:
        """The model bytes and digest; raises `ModelError`."""
        if source.url is not None:
            return self.fetch_url(source.url, source.sha256)
        assert source.config_map is not None
        ref = source.config_map
        where = f"ConfigMap {namespace}/{ref.name}"
        try:
            data = self.cluster.read_config_map_key(namespace, ref.name, ref.key)
        except ClusterError as e:
            if e.transient:
                raise ModelError(
                    dljob.Reason.MODEL_UNREACHABLE,
                    metrics.FetchFailure.UNREACHABLE,
                    f"cannot read {where}: {e}",
                    transient=True,
                ) from e
            raise ModelError(
                dljob.Reason.MODEL_NOT_FOUND,
                metrics.FetchFailure.NOT_FOUND,
                f"cannot read {where}: {e}",
                transient=False,
            ) from e
        if data is None:
            raise ModelError(
                dljob.Reason.MODEL_NOT_FOUND,
                metrics.FetchFailure.NOT_FOUND,
                f"{where} has no key {ref.key!r} in binaryData or data",
                transient=False,
            )
        return check(data, source.sha256, self.config.fetch_max_bytes, where)


def check(data: bytes, sha256: str | None, max_bytes: int, where: str) -> LoadedModel:
    """Apply the size limit and the expected digest to bytes already in memory."""
    if len(data) > max_bytes:
        raise ModelError(
            dljob.Reason.MODEL_TOO_LARGE,
            metrics.FetchFailure.TOO_LARGE,
            f"the model in {where} has {len(data)} bytes, more than the limit of {max_bytes}",
            transient=False,
        )
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ModelError(
            dljob.Reason.DIGEST_MISMATCH,
            metrics.FetchFailure.DIGEST_MISMATCH,
            f"the model in {where} has sha256 {digest}, not the {sha256} the DLJob names",
            transient=False,
        )
    return LoadedModel(data=data, digest=digest)
