"""The scheduler configuration kubeseer ships agrees with `kubeseer.extender.stanza`, and so does
the local control plane's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kubeseer.devcluster import config
from kubeseer.extender import stanza
from kubeseer.placement import catalogue

DEPLOY = Path(__file__).parents[3] / "deploy" / "scheduler"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def scheduler_config() -> dict[str, Any]:
    (config_map,) = documents("10-config.yaml")
    return yaml.safe_load(config_map["data"]["scheduler.yaml"])


def test_the_shipped_extenders_entry_is_the_stanza():
    assert scheduler_config()["extenders"] == [stanza.extender_config("http://127.0.0.1:8888")]


def test_the_shipped_scheduler_has_only_the_kubeseer_profile_and_its_own_lease():
    cfg = scheduler_config()
    assert cfg["profiles"] == [{"schedulerName": stanza.SCHEDULER_NAME}]
    lease = cfg["leaderElection"]
    rules = {d["metadata"]["name"]: d for d in documents("00-rbac.yaml") if d["kind"] == "Role"}[
        "kubeseer-scheduler-leader-election"
    ]["rules"]
    assert [lease["resourceName"]] in [r.get("resourceNames") for r in rules]
    assert lease["resourceNamespace"] == "kubeseer-system"


def test_the_extender_may_only_list_and_watch_nodes_and_pods():
    (role,) = [d for d in documents("00-rbac.yaml") if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}
    ]


def test_the_sidecar_serves_the_protocol_on_loopback_only():
    deployment = next(d for d in documents("20-deployment.yaml") if d["kind"] == "Deployment")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    args = containers["extender"]["args"]
    assert "--listen=127.0.0.1:8888" in args
    assert stanza.extender_config("http://127.0.0.1:8888")["urlPrefix"].endswith(":8888")
    for container in containers.values():
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_devcluster_renders_the_same_entry():
    url = "http://127.0.0.1:8888/kubeseer"
    extender = config.Extender(
        url_prefix=url,
        managed_resources=stanza.managed_resources(),
        weight=stanza.WEIGHT,
        node_cache_capable=True,
        ignorable=True,
    )
    rendered = config.build_scheduler_config(Path("/k"), extender)
    assert rendered["extenders"] == [stanza.extender_config(url)]
    assert config.KUBESEER_SCHEDULER == stanza.SCHEDULER_NAME


def test_every_catalogue_resource_is_managed_and_valid():
    managed = stanza.managed_resources()
    assert managed[0] == catalogue.GPU_RESOURCE
    assert len(set(managed)) == len(managed)
    for model in catalogue.MODELS:
        for profile in model.profiles:
            assert profile.resource_name in managed
    assert all(r.startswith("nvidia.com/") and len(r) <= 63 + len("nvidia.com/") for r in managed)


def test_https_is_enabled_by_the_url():
    assert stanza.extender_config("https://extender:8443")["enableHTTPS"] is True
