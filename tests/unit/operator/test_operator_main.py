"""The composition root's own behaviour: credentials errors and the namespaced inventory resync."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kubeseer.operator import errors, kube, main
from kubeseer.operator.config import ConfigError, OperatorConfig
from kubeseer.operator.inventory import InventoryCache


def test_an_unusable_kubeconfig_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"cannot use {missing}"):
        kube.api_client(str(missing), pool_size=4)


class Lister:
    """Lists one GPU node; fails the first time if asked to."""

    def __init__(self, node: dict[str, Any], *, fail_first: bool) -> None:
        self.node = node
        self.fail_first = fail_first
        self.calls = 0
        self.listed = threading.Event()

    def list_nodes(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise errors.UnavailableError("503", status=503)
        return [self.node]

    def list_pods(self) -> list[dict[str, Any]]:
        self.listed.set()
        return []


@pytest.mark.parametrize("fail_first", [False, True])
def test_a_namespaced_operator_relists_the_inventory_until_it_stops(
    node: Any, fail_first: bool
) -> None:
    lister = Lister(
        node("a100", "NVIDIA-A100-SXM4-80GB", {"nvidia.com/gpu": "1"}), fail_first=fail_first
    )
    context = SimpleNamespace(inventory=InventoryCache(), cluster=lister, devices=None)
    finished = threading.Event()
    thread = threading.Thread(target=main._resync_inventory, args=(context, 0.01, finished))
    thread.start()
    assert lister.listed.wait(5)
    finished.set()
    thread.join(5)
    assert not thread.is_alive()
    assert [o.node for o in context.inventory.snapshot().offers] == ["a100"]


class _NoPredictor:
    """The operator is built without a checkpoint; nothing here predicts."""

    def cached(self, *args: Any, **kwargs: Any) -> None:
        return None

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing is predicted before the operator starts")


@pytest.mark.parametrize("port_setting", ["metrics_port", "health_port"])
def test_a_port_in_use_stops_the_start_with_one_line(tmp_path: Path, port_setting: str) -> None:
    """Issue 17: a metrics port already in use ended the operator with a traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = {"metrics_port": 0, "health_port": 0, port_setting: port}
        config = OperatorConfig(fetch_cache_dir=tmp_path / "models", **settings)
        built = main.build(config, kubeconfig=str(kubeconfig), predictor=_NoPredictor())
        with pytest.raises(ConfigError) as raised:
            main.run(built)
    message = str(raised.value)
    assert message.startswith(f"KUBESEER_{port_setting.upper()}={port}: cannot listen")
    assert "\n" not in message
