"""Where the operator, the extender and the profiler find their API server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeseer import credentials

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_kubeconfig_given_is_the_one_used(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    assert credentials.configuration(str(path)).host == "https://127.0.0.1:6443"


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    expected = f"cannot use {re.escape(missing)} to reach"
    with pytest.raises(credentials.CredentialsError, match=expected):
        credentials.configuration(missing)


def test_without_one_the_service_account_and_then_the_default_are_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(credentials.CredentialsError, match=r"service account or ~/\.kube/config"):
        credentials.configuration(None)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(KUBECONFIG)
    monkeypatch.delenv("KUBECONFIG")
    assert credentials.configuration(None).host == "https://127.0.0.1:6443"
    # A node agent never falls back to a person's kubeconfig.
    with pytest.raises(credentials.CredentialsError, match="use the in-cluster service account to"):
        credentials.configuration(None, fall_back=False)
