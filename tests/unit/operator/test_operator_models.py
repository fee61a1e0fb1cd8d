"""The model store: ConfigMaps and URLs through the fetch rules, failures as typed fetch errors,
and a pinned digest that never stands in for the bytes its own source serves."""

from __future__ import annotations

import functools
import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubeseer.operator import dljob, errors, models
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.operator.fetch import errors as fetch_errors
from kubeseer.operator.fetch import policy as fetch_policy

MODEL = b"\x08\x07 pretend this is an ONNX protobuf"


class Cluster:
    """ConfigMaps and Secrets by name."""

    def __init__(self) -> None:
        self.config_maps: dict[str, dict[str, bytes] | errors.ApiError] = {"cm": {"k": MODEL}}
        self.secrets: dict[str, dict[str, bytes]] = {}

    def read_config_map_key(self, namespace: str, name: str, key: str) -> bytes | None:
        found = self.config_maps[name]
        if isinstance(found, errors.ApiError):
            raise found
        return found.get(key)

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        if name not in self.secrets:
            raise errors.NotFoundError(f"404 secrets {name!r} not found", status=404)
        return self.secrets[name]


def store(tmp_path: Path, cluster: Cluster | None = None, **config: Any) -> models.ModelStore:
    values: dict[str, Any] = {"fetch_cache_dir": tmp_path / "cache", **config}
    the_cluster: Any = cluster or Cluster()
    policy = models.fetch_policy(OperatorConfig(**values), the_cluster)
    return models.ModelStore(the_cluster, replace(policy, retries=0))


def source(
    url: str | None = None, cm: tuple[str, str] | None = None, sha256: str | None = None
) -> dljob.ModelSource:
    ref = dljob.ConfigMapRef(*cm) if cm else None
    return dljob.ModelSource(url=url, config_map=ref, sha256=sha256)


def failure_of(store_: models.ModelStore, src: dljob.ModelSource) -> fetch_errors.FetchError:
    with pytest.raises(fetch_errors.FetchError) as raised:
        store_.load(src, "ml")
    return raised.value


def test_a_configmap_model_is_loaded_with_its_digest(tmp_path: Path) -> None:
    loaded = store(tmp_path).load(source(cm=("cm", "k")), "ml")
    assert loaded.path.read_bytes() == MODEL
    assert loaded.digest == hashlib.sha256(MODEL).hexdigest()


def test_a_loaded_model_stays_readable_after_the_cache_evicts_it(tmp_path: Path) -> None:
    s = store(tmp_path)
    loaded = s.load(source(cm=("cm", "k")), "ml")
    (tmp_path / "cache" / loaded.digest).unlink()  # what eviction by another fetch does
    assert loaded.path.read_bytes() == MODEL
    loaded.release()
    assert not loaded.path.exists()


def test_configmap_failures_name_the_configmap(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.config_maps["gone"] = errors.NotFoundError("404 not found", status=404)
    cluster.config_maps["busy"] = errors.UnavailableError("503", status=503)
    s = store(tmp_path, cluster)
    missing_key = failure_of(s, source(cm=("cm", "other")))
    assert isinstance(missing_key, fetch_errors.NotFoundError)
    assert "ConfigMap ml/cm has no key 'other'" in str(missing_key)
    assert isinstance(failure_of(s, source(cm=("gone", "k"))), fetch_errors.NotFoundError)
    busy = failure_of(s, source(cm=("busy", "k")))
    assert isinstance(busy, fetch_errors.UnreachableError) and busy.transient


def test_configmap_models_obey_the_size_limit_and_digest(tmp_path: Path) -> None:
    too_big = failure_of(store(tmp_path, fetch_max_bytes=8), source(cm=("cm", "k")))
    assert isinstance(too_big, fetch_errors.TooLargeError)
    wrong = failure_of(store(tmp_path), source(cm=("cm", "k"), sha256="0" * 64))
    assert isinstance(wrong, fetch_errors.DigestMismatchError)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Silence."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "m.onnx").write_bytes(MODEL)
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_url_model_is_fetched_from_an_allowed_host(tmp_path: Path, server: str) -> None:
    s = store(tmp_path, fetch_allowed_hosts=("127.0.0.1",))
    loaded = s.load(source(url=f"{server}/m.onnx"), "ml")
    assert loaded.path.read_bytes() == MODEL


def test_loopback_is_refused_unless_allowed(tmp_path: Path, server: str) -> None:
    refused = failure_of(store(tmp_path), source(url=f"{server}/m.onnx"))
    assert isinstance(refused, fetch_errors.ForbiddenAddressError) and not refused.transient


def test_a_missing_url_and_a_closed_port_have_their_own_reasons(
    tmp_path: Path, server: str
) -> None:
    s = store(tmp_path, fetch_allowed_hosts=("127.0.0.1",))
    assert isinstance(failure_of(s, source(url=f"{server}/nope.onnx")), fetch_errors.NotFoundError)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    unreachable = failure_of(s, source(url=f"http://127.0.0.1:{closed}/m.onnx"))
    assert isinstance(unreachable, fetch_errors.UnreachableError) and unreachable.transient


def test_s3_credentials_come_from_the_named_secret(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.secrets["creds"] = {"accessKeyId": b"AKIA", "secretAccessKey": b"s3cr3t"}
    config = OperatorConfig(
        s3_endpoint="http://minio.storage:9000", s3_secret="creds", fetch_cache_dir=tmp_path
    )
    policy = models.fetch_policy(config, cluster)  # type: ignore[arg-type]
    assert policy.s3_endpoint == fetch_policy.S3Endpoint("http://minio.storage:9000")
    assert policy.s3_credentials == fetch_policy.S3Credentials("AKIA", "s3cr3t")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"s3_endpoint": "minio:9000"}, "KUBESEER_S3_ENDPOINT"),
        ({"s3_secret": "absent"}, "KUBESEER_S3_SECRET: 404"),
        ({"s3_secret": "partial"}, "needs the keys accessKeyId and secretAccessKey"),
    ],
)
def test_unusable_s3_settings_stop_the_start(
    tmp_path: Path, config: dict[str, str], message: str
) -> None:
    cluster = Cluster()
    cluster.secrets["partial"] = {"accessKeyId": b"AKIA"}
    with pytest.raises(ConfigError, match=message):
        models.fetch_policy(OperatorConfig(fetch_cache_dir=tmp_path, **config), cluster)  # type: ignore[arg-type]


def test_a_pinned_source_that_served_its_digest_is_answered_from_the_cache(
    tmp_path: Path, server: str
) -> None:
    s = store(tmp_path, fetch_allowed_hosts=("127.0.0.1",))
    digest = hashlib.sha256(MODEL).hexdigest()
    pinned = source(url=f"{server}/m.onnx", sha256=digest)
    assert s.verified(pinned, "ml") is None
    assert s.load(pinned, "ml").from_cache is False
    assert s.verified(pinned, "ml") == digest
    assert s.load(pinned, "ml").from_cache is True
    assert s.verified(pinned, "other-namespace") is None


def test_another_tenants_digest_never_stands_in_for_the_bytes_of_ones_own_source(
    tmp_path: Path, server: str
) -> None:
    """Issue 17: the digest of tenant A's ConfigMap model, named with a URL that serves nothing
    (404) or something else, must not be served A's bytes from the cache."""
    cluster = Cluster()
    s = store(tmp_path, cluster, fetch_allowed_hosts=("127.0.0.1",))
    digest = hashlib.sha256(MODEL).hexdigest()
    s.load(source(cm=("cm", "k")), "tenant-a")  # A's model is now in the cache
    assert (tmp_path / "cache" / digest).exists()
    borrowed = source(url=f"{server}/nope.onnx", sha256=digest)
    assert s.verified(borrowed, "tenant-b") is None
    assert isinstance(failure_of(s, borrowed), fetch_errors.NotFoundError)
    cluster.config_maps["other"] = {"k": b"tenant b's own bytes"}
    mismatch = failure_of(s, source(cm=("other", "k"), sha256=digest))
    assert isinstance(mismatch, fetch_errors.DigestMismatchError)
    assert s.verified(source(cm=("cm", "k"), sha256=digest), "tenant-b") is None
