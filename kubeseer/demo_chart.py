"""`kubeseer demo --chart`: the demo installed through the Helm chart (`make demo-chart`).

A local control plane has no kubelet, so the chart's pods cannot run their containers: KWOK marks
them Running and nothing more. What the chart decides is installed for real with `helm install`
(the DLJob CRD from its crds/, the service accounts and RBAC of each component, the scheduler's
configuration, the profiler DaemonSet that lands on the GPU nodes only); the operator, the
extender and kube-scheduler then run as processes of this machine, each with its Deployment's
arguments and environment and a token of the chart's own service account. The demo's DLJobs are
therefore predicted, placed and scheduled exactly as the chart's identities allow, through the
chart's scheduler profile and its extender.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeseer import resources
from kubeseer.devcluster import binaries, process

CHART = resources.CHECKOUT / "charts" / "kubeseer"
RELEASE = "kubeseer"
NAMESPACE = "kubeseer-system"
SCHEDULER_NAME = "kubeseer-helm"
"""The chart's scheduler profile in the demo; the local control plane's own kube-scheduler
already serves `kubeseer-scheduler`, and two schedulers must not share a profile."""


class ChartError(RuntimeError):
    """The chart could not be installed or one of its components did not start."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the components run here (the chart's are per pod, so they clash)."""

    operator_metrics: int = field(default_factory=free_port)
    operator_health: int = field(default_factory=free_port)
    extender: int = field(default_factory=free_port)
    extender_metrics: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)

    def values(self) -> dict[str, Any]:
        """The chart values that put the components on these ports."""
        return {
            "operator": {"metricsPort": self.operator_metrics, "healthPort": self.operator_health},
            "scheduler": {
                "name": SCHEDULER_NAME,
                "extender": {"port": self.extender, "metricsPort": self.extender_metrics},
            },
        }


def install(
    helm: Path,
    kubeconfig: Path,
    values: Mapping[str, Any],
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """`helm upgrade --install` the chart; returns the objects of the release's manifest."""
    if not (CHART / "Chart.yaml").is_file():
        raise ChartError(f"the chart is not at {CHART}: run the chart demo from a checkout")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(dict(values), file)
        file.flush()
        base = [str(helm), "--kubeconfig", str(kubeconfig), "--namespace", namespace]
        _helm([*base, "upgrade", "--install", release, str(CHART), "--create-namespace",
               "--values", file.name])  # fmt: skip
    manifest = _helm([*base, "get", "manifest", release])
    return [d for d in yaml.safe_load_all(manifest) if d]


def _helm(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ChartError(f"{' '.join(argv[3:6])}: {result.stderr.strip()}")
    return result.stdout


def find(objects: Sequence[Mapping[str, Any]], kind: str, name: str) -> Mapping[str, Any]:
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise ChartError(f"the release has no {kind} {name}")


def container(
    objects: Sequence[Mapping[str, Any]], kind: str, name: str, container_name: str
) -> Mapping[str, Any]:
    """One container of a Deployment or DaemonSet of the release."""
    spec = find(objects, kind, name)["spec"]["template"]["spec"]
    for c in spec["containers"]:
        if c["name"] == container_name:
            return dict(c)
    raise ChartError(f"{kind} {name} has no container {container_name}")


def environment(
    spec: Mapping[str, Any], namespace: str, node: str = "", **overrides: str
) -> dict[str, str]:
    """A container's environment as the kubelet sets it (the downward API resolved)."""
    fields = {"metadata.namespace": namespace, "spec.nodeName": node}
    # The kubelet's PATH aside, only what makes this machine's Python the image's: the same
    # interpreter search path as this process (a checkout run with PYTHONPATH stays one).
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR", "PYTHONPATH")}
    for entry in spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            path = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
            if path in fields:
                env[entry["name"]] = fields[path]
    return {**env, **overrides, "PYTHONUNBUFFERED": "1"}


def token_kubeconfig(
    admin_kubeconfig: Path, namespace: str, account: str, path: Path, *, ttl_s: int = 3600
) -> Path:
    """A kubeconfig with a token of service account `account` (TokenRequest), nothing more."""
    from kubernetes import client

    from kubeseer.operator import kube

    admin = kube.api_client(str(admin_kubeconfig), pool_size=1)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=ttl_s)
    )
    try:
        answer = client.CoreV1Api(admin).create_namespaced_service_account_token(
            account, namespace, request
        )
    finally:
        admin.close()  # type: ignore[no-untyped-call]
    if answer.status is None:
        raise ChartError(f"no token for service account {namespace}/{account}")
    token = answer.status.token
    cluster = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


class Processes:
    """Components run here, each in its own process group, killed if this process dies."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[subprocess.Popen[bytes]] = []
        self.records: list[process.ProcessRecord] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Path:
        """Start `argv`; with `env`, in exactly that environment."""
        log = self.logs / f"{name}.log"
        command = list(argv)
        if env is not None:
            command = ["env", "-i", *(f"{k}={v}" for k, v in sorted(env.items())), *command]
        child, record = process.spawn(name, command, log, die_with_parent=True)
        self.children.append(child)
        self.records.append(record)
        return log

    def check_alive(self) -> None:
        for child, record in zip(self.children, self.records, strict=True):
            if child.poll() is not None:
                raise ChartError(f"{record.name} exited:\n{process.log_tail(Path(record.log))}")

    def wait_http(self, url: str, what: str, timeout_s: float) -> None:
        """Until `url` answers 200; fails at once if a component has exited."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            self.check_alive()
            if time.monotonic() > deadline:
                raise ChartError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.3)

    def stop(self) -> None:
        process.stop(self.records, self.children)


@dataclass(frozen=True)
class Release:
    """An installed release and where its components listen here."""

    objects: list[dict[str, Any]]
    ports: Ports
    kubeconfigs: Mapping[str, Path]
    release: str = RELEASE
    namespace: str = NAMESPACE

    def name(self, component: str) -> str:
        prefix = self.release if "kubeseer" in self.release else f"{self.release}-kubeseer"
        return f"{prefix}-{component}"


@contextmanager
def components(
    release: Release, bins: binaries.Binaries, run_dir: Path, **operator_env: str
) -> Iterator[Processes]:
    """kube-scheduler with the chart's configuration, the extender and the operator, as their
    own processes with the chart's arguments, environment and service accounts; yields once
    the extender's caches have synced and the operator holds its Lease."""
    procs = Processes(run_dir / "logs")
    python = [sys.executable, "-m", "kubeseer.cli"]
    ports = release.ports
    try:
        scheduler = release.name("scheduler")
        config = yaml.safe_load(
            find(release.objects, "ConfigMap", f"{scheduler}-config")["data"]["scheduler.yaml"]
        )
        config["clientConnection"] = {"kubeconfig": str(release.kubeconfigs["scheduler"])}
        (run_dir / "scheduler.yaml").write_text(yaml.safe_dump(config))
        sa = release.kubeconfigs["scheduler"]
        procs.start(
            "kube-scheduler",
            [str(bins.path("kube-scheduler")), f"--config={run_dir / 'scheduler.yaml'}", "--v=2",
             f"--authentication-kubeconfig={sa}", f"--authorization-kubeconfig={sa}",
             "--bind-address=127.0.0.1", f"--secure-port={ports.scheduler}",
             f"--cert-dir={run_dir / 'scheduler-certs'}"],
        )  # fmt: skip
        extender = container(release.objects, "Deployment", scheduler, "extender")
        args = [str(a).replace("0.0.0.0", "127.0.0.1") for a in extender["args"]]
        procs.start(
            "extender",
            [*python, *args, f"--kubeconfig={sa}"],
            environment(extender, release.namespace, HOME=str(run_dir)),
        )
        operator = container(release.objects, "Deployment", release.name("operator"), "operator")
        procs.start(
            "operator",
            [*python, *operator["args"], f"--kubeconfig={release.kubeconfigs['operator']}"],
            environment(
                operator,
                release.namespace,
                HOME=str(run_dir),
                KUBESEER_FETCH_CACHE_DIR=str(run_dir / "models"),
                **operator_env,
            ),
        )
        procs.wait_http(f"http://127.0.0.1:{ports.extender_metrics}/healthz", "the extender", 60)
        procs.wait_http(f"http://127.0.0.1:{ports.operator_health}/healthz", "the operator", 240)
        yield procs
    finally:
        procs.stop()


def install_release(
    helm: Path,
    admin_kubeconfig: Path,
    run_dir: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Release:
    """Install the chart with local ports and tokens of its operator, scheduler and profiler."""
    ports = Ports()
    merged = _merge(ports.values(), dict(values or {}))
    objects = install(helm, admin_kubeconfig, merged, release=release, namespace=namespace)
    partial = Release(objects, ports, {}, release, namespace)
    kubeconfigs = {
        c: token_kubeconfig(
            admin_kubeconfig, namespace, partial.name(c), run_dir / f"{c}.kubeconfig"
        )
        for c in ("operator", "scheduler", "profiler")
    }
    return Release(objects, ports, kubeconfigs, release, namespace)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
