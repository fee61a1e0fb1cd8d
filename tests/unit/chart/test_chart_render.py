"""The chart lints and renders with its defaults and with every optional feature on, and what it
renders keeps the promises of docs/install.md: restricted pods everywhere but the profiler's
hostPID, the profiler on GPU nodes only, one Recreate operator, the extender on loopback with the
stanza kube-scheduler is meant to get, monitoring objects only when asked for, and deploy/ what
the chart renders."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from chart_support import ALL_FEATURES, CHART, DASHBOARD, REPO, find, helm, render, render_deploy

from kubeseer.extender import stanza

WORKLOADS = ("Deployment", "DaemonSet", "CronJob")


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            out[o["metadata"]["name"]] = o["spec"]["template"]["spec"]
        elif o["kind"] == "CronJob":
            out[o["metadata"]["name"]] = o["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return out


@pytest.fixture(scope="module")
def defaults() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def everything() -> list[dict[str, Any]]:
    return render(ALL_FEATURES)


@pytest.mark.parametrize("values", [{}, ALL_FEATURES], ids=["defaults", "all-features"])
def test_helm_lint_passes(values, tmp_path):
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(dict(values)))
    result = subprocess.run(
        [str(helm()), "lint", "--strict", str(CHART), "--values", str(file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_defaults_install_the_three_components_and_nothing_optional(defaults):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in defaults}
    assert ("Deployment", "kubeseer-operator") in kinds
    assert ("Deployment", "kubeseer-scheduler") in kinds
    assert ("DaemonSet", "kubeseer-profiler") in kinds
    assert ("PersistentVolumeClaim", "kubeseer-store") in kinds
    assert not {"CronJob", "ServiceMonitor", "PrometheusRule", "DeviceClass"} & {
        k for k, _ in kinds
    }
    assert not any(
        o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"] for o in defaults
    )


def test_every_optional_feature_renders(everything):
    kinds = {o["kind"] for o in everything}
    assert {"CronJob", "ServiceMonitor", "PrometheusRule", "DeviceClass", "NetworkPolicy"} <= kinds
    monitors = [o for o in everything if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3
    assert all(m["spec"]["endpoints"][0]["honorLabels"] for m in monitors)
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)


@pytest.mark.parametrize("which", ["defaults", "everything"])
def test_every_pod_but_the_profiler_is_restricted(which, request):
    for name, spec in pod_specs(request.getfixturevalue(which)).items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] != 0, name
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in spec["containers"] + spec.get("initContainers", []):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert security["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert security["capabilities"] == {"drop": ["ALL"]}, (name, container["name"])
            assert not security.get("privileged"), (name, container["name"])
        assert not spec.get("hostNetwork") and not spec.get("hostIPC"), name
        assert not any("hostPath" in v for v in spec.get("volumes", [])), name
        assert bool(spec.get("hostPID")) == (name == "kubeseer-profiler"), name


def test_the_profiler_runs_on_gpu_nodes_only_and_gets_no_gpu(defaults):
    spec = pod_specs(defaults)["kubeseer-profiler"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    ]
    (container,) = spec["containers"]
    limits = container["resources"].get("limits", {})
    assert not any(k.startswith("nvidia.com/") for k in limits)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_one_operator_replaced_by_recreate_holding_the_lease_its_role_names(defaults):
    deployment = find(defaults, "Deployment", "kubeseer-operator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    role = find(defaults, "Role", "kubeseer-operator-leader-lease")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named[0]["resourceNames"] == [env["KUBESEER_LEASE_NAME"]]
    assert env["KUBESEER_SCHEDULER_NAME"] == "kubeseer-scheduler"
    assert env["KUBESEER_OBSERVATION_STORE"] == "/var/lib/kubeseer/store"


def test_the_extender_stanza_is_the_one_kubeseer_defines(defaults):
    config = find(defaults, "ConfigMap", "kubeseer-scheduler-config")
    scheduler = yaml.safe_load(config["data"]["scheduler.yaml"])
    assert scheduler["extenders"] == [stanza.extender_config("http://127.0.0.1:8888")]
    assert scheduler["profiles"] == [{"schedulerName": stanza.SCHEDULER_NAME}]
    deployment = find(defaults, "Deployment", "kubeseer-scheduler")
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert "--listen=127.0.0.1:8888" in containers["extender"]["args"]
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.37.2"


def test_a_release_with_another_name_shares_no_cluster_object_with_the_first(defaults):
    other = render(release="second", namespace="gpu-two")
    cluster_scoped = ("ClusterRole", "ClusterRoleBinding")
    first = {o["metadata"]["name"] for o in defaults if o["kind"] in cluster_scoped}
    second = {o["metadata"]["name"] for o in other if o["kind"] in cluster_scoped}
    assert first and second and not first & second


def test_the_s3_secret_is_the_only_secret_the_operator_may_read(everything):
    secret_rules = [
        (o, r)
        for o in everything
        if o["kind"] in ("Role", "ClusterRole")
        for r in o["rules"]
        if "secrets" in r.get("resources", [])
    ]
    ((role, rule),) = secret_rules
    assert role["kind"] == "Role"
    assert rule["resourceNames"] == ["kubeseer-s3-credentials"] and rule["verbs"] == ["get"]


def test_retraining_pulls_then_fine_tunes_without_api_access(everything):
    cron = find(everything, "CronJob")
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["initContainers"][0]["args"][:2] == ["dataset", "pull"]
    train = spec["containers"][0]["args"]
    assert train[0] == "train"
    assert "--init=/opt/kubeseer/checkpoints/default.pt" in train
    assert not any(arg.startswith("--replay") for arg in train)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_retraining_replays_the_rows_it_is_given_from_the_store():
    values = {
        "retraining": {"enabled": True, "replay": "replay/zoo"},
        "datasetStore": {"type": "pvc"},
    }
    cron = find(render(values), "CronJob")
    train = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--replay=/var/lib/kubeseer/store/replay/zoo" in train
    # the graphs a replay needs are extracted once and kept on the store for the next run
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pull = pod["initContainers"][0]
    assert "--cache-dir=/var/lib/kubeseer/store/cache" in pull["args"]
    for container in (pull, pod["containers"][0]):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["KUBESEER_CACHE_DIR"] == "/var/lib/kubeseer/store/cache"


def test_the_dashboard_configmap_carries_the_dashboard_unchanged(everything):
    config = find(everything, "ConfigMap", "kubeseer-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["kubeseer.json"]) == json.loads(DASHBOARD.read_text())


def test_network_policies_select_each_components_pods(everything):
    workloads = {
        o["metadata"]["name"]: o["spec"]["selector"]["matchLabels"]
        for o in everything
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    policies = {
        o["metadata"]["name"]: o["spec"]["podSelector"]["matchLabels"]
        for o in everything
        if o["kind"] == "NetworkPolicy"
    }
    for name, selector in workloads.items():
        assert policies[name] == selector


def test_the_chart_carries_the_crds_of_deploy():
    stale = render_deploy.sync_crds(check=True)
    assert not stale, f"{stale} differ from deploy/crds: run .venv/bin/python hack/render_deploy.py"
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == ["dljobs.kubeseer.io.yaml"]


def test_deploy_is_what_the_chart_renders():
    helm()
    drift = []
    for relative, text in render_deploy.rendered().items():
        path = REPO / "deploy" / relative
        if not path.exists() or path.read_text() != text:
            drift.append(relative)
    assert not drift, (
        f"deploy/ differs from the chart in {drift}: run .venv/bin/python hack/render_deploy.py"
    )
