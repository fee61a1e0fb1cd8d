"""Pure builders for everything the local cluster writes or runs: the run-directory layout,
kubeconfigs, the kube-scheduler configuration and each component's command line.

Nothing here touches the disk or starts a process, so the flags that make the cluster behave
(RBAC on, loopback only, the scheduler profiles, the extender stanza) are pinned by unit tests.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeseer.devcluster import binaries, errors, pki

LOOPBACK = "127.0.0.1"
DEFAULT_SCHEDULER = "default-scheduler"
KUBESEER_SCHEDULER = "kubeseer-scheduler"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
# The operator's in-cluster identity; the RBAC manifests bind their ClusterRole to it.
OPERATOR_NAMESPACE = "kubeseer-system"
OPERATOR_SERVICE_ACCOUNT = "kubeseer-operator"
_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")


@dataclass(frozen=True)
class Ports:
    """The loopback TCP ports of one cluster's components."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    def all(self) -> tuple[int, ...]:
        """Every port, to check they are distinct and released after teardown."""
        return (
            self.etcd_client,
            self.etcd_peer,
            self.apiserver,
            self.controller_manager,
            self.scheduler,
            self.kwok,
        )


@dataclass(frozen=True)
class Layout:
    """Where one cluster keeps its files. etcd's data sits apart, on tmpfs when available."""

    run_dir: Path
    etcd_data: Path

    @property
    def pki_dir(self) -> Path:
        """Certificates and keys (mode 0700)."""
        return self.run_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        """One log file per component, kept after teardown for post-mortems."""
        return self.run_dir / "logs"

    @property
    def state_file(self) -> Path:
        """What `kubeseer devcluster status|down` read to find a detached cluster."""
        return self.run_dir / "state.json"

    @property
    def admin_kubeconfig(self) -> Path:
        """A `system:masters` kubeconfig: tests, the demo, and the components themselves."""
        return self.run_dir / "admin.kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """The operator's service-account identity, limited by its ClusterRole."""
        return self.run_dir / "operator.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        """kube-scheduler's own identity (`system:kube-scheduler`, bound by bootstrap RBAC)."""
        return self.run_dir / "scheduler.kubeconfig"

    @property
    def scheduler_config(self) -> Path:
        """The `KubeSchedulerConfiguration` with both profiles."""
        return self.run_dir / "scheduler.yaml"

    def pki_file(self, name: str) -> Path:
        """A file of the PKI directory (`ca.crt`, `serving.key`, `sa.pub` ...)."""
        return self.pki_dir / name

    def log(self, component: str) -> Path:
        """The log file of one component."""
        return self.logs_dir / f"{component}.log"


@dataclass(frozen=True)
class Extender:
    """kube-scheduler's HTTP extender stanza (fields of `KubeSchedulerConfiguration.extenders`).

    `managed_resources` limits which pods are sent to the extender: only those requesting one
    of them. The resources are real device-plugin resources, so the scheduler keeps counting
    them (`ignoredByScheduler: false`).
    """

    url_prefix: str
    managed_resources: tuple[str, ...]
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    weight: int = 1
    node_cache_capable: bool = False
    http_timeout_s: float = 5.0
    ignorable: bool = False

    def __post_init__(self) -> None:
        if not _URL.match(self.url_prefix):
            raise errors.ConfigError(
                f"extender URL must be http(s)://host[:port][/path], not {self.url_prefix!r}"
            )
        if self.prioritize_verb and self.weight < 1:
            raise errors.ConfigError(
                "kube-scheduler requires a positive weight when prioritizeVerb is set"
            )
        if self.http_timeout_s <= 0:
            raise errors.ConfigError("the extender HTTP timeout must be positive")
        if len(set(self.managed_resources)) != len(self.managed_resources):
            raise errors.ConfigError("managed resources must be distinct")


def build_kubeconfig(name: str, server: str, ca_pem: bytes, client: pki.KeyPair) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded) with one cluster, user and context."""
    user = {
        "name": name,
        "user": {
            "client-certificate-data": _b64(client.cert_pem),
            "client-key-data": _b64(client.key_pem),
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kubeseer-dev",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [user],
        "contexts": [{"name": name, "context": {"cluster": "kubeseer-dev", "user": name}}],
        "current-context": name,
        "preferences": {},
    }


def build_scheduler_config(kubeconfig: Path, extender: Extender | None) -> dict[str, Any]:
    """Two profiles, `default-scheduler` and `kubeseer-scheduler`, and the extender if given.

    `extenders` is a top-level field shared by every profile: kube-scheduler cannot scope an
    extender to one profile. With an extender configured, pods of `default-scheduler` that
    request a managed GPU resource are sent to it too, so the extender must pass through pods
    whose `spec.schedulerName` is not `kubeseer-scheduler`. We accept that over running a second
    kube-scheduler process because it keeps the start inside the 30 s budget and is exactly
    what a single-scheduler cluster would see; the Helm chart runs a dedicated scheduler with
    only the kubeseer profile, where the question does not arise.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        # One scheduler per cluster: skip the election so scheduling starts at once.
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": DEFAULT_SCHEDULER}, {"schedulerName": KUBESEER_SCHEDULER}],
    }
    if extender is not None:
        stanza: dict[str, Any] = {
            "urlPrefix": extender.url_prefix,
            "filterVerb": extender.filter_verb,
            "prioritizeVerb": extender.prioritize_verb,
            "weight": extender.weight,
            "nodeCacheCapable": extender.node_cache_capable,
            "enableHTTPS": extender.url_prefix.startswith("https://"),
            "httpTimeout": f"{extender.http_timeout_s:g}s",
            "ignorable": extender.ignorable,
            "managedResources": [
                {"name": name, "ignoredByScheduler": False} for name in extender.managed_resources
            ],
        }
        config["extenders"] = [stanza]
    return config


def etcd_argv(bins: binaries.Binaries, ports: Ports, layout: Layout) -> list[str]:
    """A single-member etcd on loopback. Its data is throw-away, so fsync is skipped."""
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(bins.path("etcd")),
        "--name=kubeseer-dev",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kubeseer-dev={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_argv(bins: binaries.Binaries, ports: Ports, layout: Layout) -> list[str]:
    """kube-apiserver with RBAC, client-certificate auth and service-account tokens."""
    return [
        str(bins.path("kube-apiserver")),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={layout.pki_file('serving.crt')}",
        f"--tls-private-key-file={layout.pki_file('serving.key')}",
        f"--client-ca-file={layout.pki_file('ca.crt')}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer=https://{LOOPBACK}:{ports.apiserver}",
        f"--service-account-key-file={layout.pki_file('sa.pub')}",
        f"--service-account-signing-key-file={layout.pki_file('sa.key')}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        # The default ServiceAccount of a new namespace is made by the controller manager a
        # moment after the namespace; admission would reject pods created in that gap.
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        # A loopback address cannot go into the `kubernetes` Endpoints (validation rejects it).
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_argv(bins: binaries.Binaries, ports: Ports, layout: Layout) -> list[str]:
    """kube-controller-manager: Jobs, garbage collection, namespace deletion, service accounts."""
    kubeconfig = str(layout.admin_kubeconfig)
    return [
        str(bins.path("kube-controller-manager")),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.controller_manager}",
        f"--tls-cert-file={layout.pki_file('serving.crt')}",
        f"--tls-private-key-file={layout.pki_file('serving.key')}",
        f"--service-account-private-key-file={layout.pki_file('sa.key')}",
        f"--root-ca-file={layout.pki_file('ca.crt')}",
        "--use-service-account-credentials=false",
        *_delegated_authentication(layout),
        "--controllers=*",
        "--profiling=false",
        "--v=1",
    ]


def scheduler_argv(bins: binaries.Binaries, ports: Ports, layout: Layout) -> list[str]:
    """kube-scheduler reading `scheduler.yaml`, serving health on loopback with our cert."""
    kubeconfig = str(layout.scheduler_kubeconfig)
    return [
        str(bins.path("kube-scheduler")),
        f"--config={layout.scheduler_config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.scheduler}",
        *_delegated_authentication(layout),
        f"--tls-cert-file={layout.pki_file('serving.crt')}",
        f"--tls-private-key-file={layout.pki_file('serving.key')}",
        "--profiling=false",
        "--v=2",
    ]


NODE_LEASE_S = 40
"""The node Leases KWOK renews for its nodes, as a kubelet does (the kubelet's default
duration). Without them KWOK's only heartbeat is the node status stage, every 10 minutes, and
kube-controller-manager takes every node for unreachable after its 50 s grace period: it marks
the nodes' pods not Ready (KWOK never readies a Running pod again) and taints the nodes."""


def kwok_argv(bins: binaries.Binaries, ports: Ports, layout: Layout) -> list[str]:
    """KWOK managing only the nodes annotated as fake, with health served on loopback."""
    return [
        str(bins.path("kwok")),
        f"--kubeconfig={layout.admin_kubeconfig}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={POD_CIDR}",
        f"--node-ip={LOOPBACK}",
        f"--server-address={LOOPBACK}:{ports.kwok}",
        f"--config={bins.kwok_stages}",
        f"--node-lease-duration-seconds={NODE_LEASE_S}",
    ]


def health_urls(ports: Ports) -> dict[str, str]:
    """The endpoint that says each component is ready (all but etcd speak TLS with our CA)."""
    return {
        "etcd": f"http://{LOOPBACK}:{ports.etcd_client}/health",
        "kube-apiserver": f"https://{LOOPBACK}:{ports.apiserver}/readyz",
        "kube-controller-manager": f"https://{LOOPBACK}:{ports.controller_manager}/healthz",
        "kube-scheduler": f"https://{LOOPBACK}:{ports.scheduler}/healthz",
        "kwok": f"http://{LOOPBACK}:{ports.kwok}/healthz",
    }


def _delegated_authentication(layout: Layout) -> list[str]:
    """Trust our CA directly instead of reading it from the `extension-apiserver-authentication`
    ConfigMap: there is no front proxy, so the lookup only finds an empty request-header CA and
    logs an error every few seconds."""
    return [f"--client-ca-file={layout.pki_file('ca.crt')}", "--authentication-skip-lookup=true"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
