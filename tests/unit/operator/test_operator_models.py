"""The model store: ConfigMaps and URLs through the fetch rules, failures as DLJob reasons."""

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

from kubeseer.operator import dljob, fetch, models
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.operator.reconcile import ClusterError, ModelError

MODEL = b"\x08\x07 pretend this is an ONNX protobuf"


class Cluster:
    """ConfigMaps and Secrets by name."""

    def __init__(self) -> None:
        self.config_maps: dict[str, dict[str, bytes] | ClusterError] = {"cm": {"k": MODEL}}
        self.secrets: dict[str, dict[str, bytes]] = {}

    def read_config_map_key(self, namespace: str, name: str, key: str) -> bytes | None:
        found = self.config_maps[name]
        if isinstance(found, ClusterError):
            raise found
        return found.get(key)

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        if name not in self.secrets:
            raise ClusterError(f"404 secrets {name!r} not found", transient=False)
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


def reason_of(store_: models.ModelStore, src: dljob.ModelSource) -> ModelError:
    with pytest.raises(ModelError) as raised:
        store_.load(src, "ml")
    return raised.value


def test_a_configmap_model_is_loaded_with_its_digest(tmp_path: Path) -> None:
    loaded = store(tmp_path).load(source(cm=("cm", "k")), "ml")
    assert loaded.data == MODEL
    assert loaded.digest == hashlib.sha256(MODEL).hexdigest()


def test_configmap_failures_name_the_configmap(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.config_maps["gone"] = ClusterError("404 not found", transient=False)
    cluster.config_maps["busy"] = ClusterError("503", transient=True)
    s = store(tmp_path, cluster)
    missing_key = reason_of(s, source(cm=("cm", "other")))
    assert missing_key.reason is dljob.Reason.MODEL_NOT_FOUND
    assert "ConfigMap ml/cm has no key 'other'" in str(missing_key)
    assert reason_of(s, source(cm=("gone", "k"))).reason is dljob.Reason.MODEL_NOT_FOUND
    busy = reason_of(s, source(cm=("busy", "k")))
    assert (busy.reason, busy.transient) == (dljob.Reason.MODEL_UNREACHABLE, True)


def test_configmap_models_obey_the_size_limit_and_digest(tmp_path: Path) -> None:
    too_big = reason_of(store(tmp_path, fetch_max_bytes=8), source(cm=("cm", "k")))
    assert too_big.reason is dljob.Reason.MODEL_TOO_LARGE
    wrong = reason_of(store(tmp_path), source(cm=("cm", "k"), sha256="0" * 64))
    assert wrong.reason is dljob.Reason.DIGEST_MISMATCH


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
    assert loaded.data == MODEL


def test_loopback_is_refused_unless_allowed(tmp_path: Path, server: str) -> None:
    refused = reason_of(store(tmp_path), source(url=f"{server}/m.onnx"))
    assert (refused.reason, refused.transient) == (dljob.Reason.MODEL_REFUSED, False)


def test_a_missing_url_and_a_closed_port_have_their_own_reasons(
    tmp_path: Path, server: str
) -> None:
    s = store(tmp_path, fetch_allowed_hosts=("127.0.0.1",))
    assert reason_of(s, source(url=f"{server}/nope.onnx")).reason is dljob.Reason.MODEL_NOT_FOUND
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    unreachable = reason_of(s, source(url=f"http://127.0.0.1:{closed}/m.onnx"))
    assert (unreachable.reason, unreachable.transient) == (dljob.Reason.MODEL_UNREACHABLE, True)


def test_s3_credentials_come_from_the_named_secret(tmp_path: Path) -> None:
    cluster = Cluster()
    cluster.secrets["creds"] = {"accessKeyId": b"AKIA", "secretAccessKey": b"s3cr3t"}
    config = OperatorConfig(
        s3_endpoint="http://minio.storage:9000", s3_secret="creds", fetch_cache_dir=tmp_path
    )
    policy = models.fetch_policy(config, cluster)  # type: ignore[arg-type]
    assert policy.s3_endpoint == fetch.S3Endpoint("http://minio.storage:9000")
    assert policy.s3_credentials == fetch.S3Credentials("AKIA", "s3cr3t")


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
