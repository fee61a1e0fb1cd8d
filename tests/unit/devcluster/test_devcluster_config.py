"""Config rendering: kubeconfigs, the two scheduler profiles, the optional extender stanza and
the component command lines (RBAC on, loopback only)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from kubeseer.devcluster import binaries, config, errors, pki

PORTS = config.Ports(
    etcd_client=2379,
    etcd_peer=2380,
    apiserver=6443,
    controller_manager=10257,
    scheduler=10259,
    kwok=10247,
)
LAYOUT = config.Layout(run_dir=Path("/run/k"), etcd_data=Path("/dev/shm/etcd-x"))
BINS = binaries.Binaries(
    directory=Path("/bins"), versions=binaries.Versions("v1.34.4", "v3.6.16", "v0.7.0", "v3.19.5")
)
ALL_ARGV = {
    "etcd": config.etcd_argv(BINS, PORTS, LAYOUT),
    "kube-apiserver": config.apiserver_argv(BINS, PORTS, LAYOUT),
    "kube-controller-manager": config.controller_manager_argv(BINS, PORTS, LAYOUT),
    "kube-scheduler": config.scheduler_argv(BINS, PORTS, LAYOUT),
    "kwok": config.kwok_argv(BINS, PORTS, LAYOUT),
}


def test_scheduler_config_without_extender_has_both_profiles_and_no_extenders():
    cfg = config.build_scheduler_config(Path("/k/scheduler.kubeconfig"), None)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in cfg["profiles"]] == [
        "default-scheduler",
        "kubeseer-scheduler",
    ]
    assert "extenders" not in cfg
    assert cfg["clientConnection"] == {"kubeconfig": "/k/scheduler.kubeconfig"}
    assert cfg["leaderElection"] == {"leaderElect": False}


def test_scheduler_config_with_extender_renders_the_kube_scheduler_field_names():
    extender = config.Extender(
        url_prefix="http://127.0.0.1:8888/scheduler",
        managed_resources=("nvidia.com/gpu", "nvidia.com/mig-2g.20gb"),
        http_timeout_s=2.5,
    )
    cfg = config.build_scheduler_config(Path("/k"), extender)
    assert cfg["extenders"] == [
        {
            "urlPrefix": "http://127.0.0.1:8888/scheduler",
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 1,
            "nodeCacheCapable": False,
            "enableHTTPS": False,
            "httpTimeout": "2.5s",
            "ignorable": False,
            "managedResources": [
                {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
                {"name": "nvidia.com/mig-2g.20gb", "ignoredByScheduler": False},
            ],
        }
    ]


def test_https_extender_url_enables_https():
    extender = config.Extender(url_prefix="https://127.0.0.1:8443", managed_resources=())
    assert (
        config.build_scheduler_config(Path("/k"), extender)["extenders"][0]["enableHTTPS"] is True
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url_prefix": "127.0.0.1:8888"}, "must be http"),
        ({"url_prefix": "http://x", "weight": 0}, "positive weight"),
        ({"url_prefix": "http://x", "http_timeout_s": 0}, "timeout must be positive"),
        ({"url_prefix": "http://x", "managed_resources": ("a/b", "a/b")}, "distinct"),
    ],
)
def test_extender_rejects_what_kube_scheduler_validation_would(kwargs, message):
    kwargs.setdefault("managed_resources", ())
    with pytest.raises(errors.ConfigError, match=message):
        config.Extender(**kwargs)


def test_kubeconfig_embeds_ca_and_client_pair_and_selects_its_context():
    pair = pki.KeyPair(cert_pem=b"CERT", key_pem=b"KEY")
    doc = config.build_kubeconfig("ops", "https://127.0.0.1:6443", b"CA", pair)
    assert doc["current-context"] == "ops"
    (cluster,) = doc["clusters"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == b"CA"
    (user,) = doc["users"]
    assert base64.b64decode(user["user"]["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["user"]["client-key-data"]) == b"KEY"
    (context,) = doc["contexts"]
    assert context["context"] == {"cluster": cluster["name"], "user": "ops"}


def test_apiserver_enforces_rbac_and_client_certificates_against_our_etcd():
    argv = ALL_ARGV["kube-apiserver"]
    assert argv[0] == "/bins/kube-apiserver"
    assert "--authorization-mode=RBAC" in argv
    assert "--client-ca-file=/run/k/pki/ca.crt" in argv
    assert "--etcd-servers=http://127.0.0.1:2379" in argv
    assert "--secure-port=6443" in argv
    assert "--service-account-signing-key-file=/run/k/pki/sa.key" in argv
    assert "--service-account-key-file=/run/k/pki/sa.pub" in argv


def test_etcd_keeps_data_on_the_given_tmpfs_dir_without_fsync():
    argv = ALL_ARGV["etcd"]
    assert "--data-dir=/dev/shm/etcd-x" in argv
    assert "--unsafe-no-fsync=true" in argv


@pytest.mark.parametrize("component", sorted(ALL_ARGV))
def test_every_component_listens_on_loopback_only(component):
    listen_flags = re.compile(
        r"^--(bind-address|advertise-address|server-address|listen-\S+-urls)="
    )
    values = [a.split("=", 1)[1] for a in ALL_ARGV[component] if listen_flags.match(a)]
    assert values
    for value in values:
        hosts = re.findall(r"(?:^|//)([0-9.]+)", value)
        assert hosts == ["127.0.0.1"], value


def test_kwok_manages_only_nodes_annotated_fake():
    argv = ALL_ARGV["kwok"]
    assert "--manage-all-nodes=false" in argv
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in argv


def test_kwok_is_given_the_stages_cached_with_the_binaries():
    assert f"--config={BINS.kwok_stages}" in ALL_ARGV["kwok"]


def test_scheduler_and_controller_manager_skip_leader_election_and_use_our_config():
    assert "--config=/run/k/scheduler.yaml" in ALL_ARGV["kube-scheduler"]
    assert "--leader-elect=false" in ALL_ARGV["kube-controller-manager"]
    assert "--controllers=*" in ALL_ARGV["kube-controller-manager"]


def test_health_urls_cover_every_component_at_its_own_port():
    urls = config.health_urls(PORTS)
    assert set(urls) == set(ALL_ARGV)
    assert urls["kube-apiserver"] == "https://127.0.0.1:6443/readyz"
    assert urls["etcd"] == "http://127.0.0.1:2379/health"
    assert len({u.split("/")[2] for u in urls.values()}) == len(urls)
