"""`LocalCluster`: a real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK
on loopback, with the fake GPU nodes of an inventory file, ready in seconds.

Start order is chosen for the 30 s budget on two cores: etcd and the apiserver start together
(the apiserver retries etcd), and once the apiserver is ready the controller manager, the
scheduler and KWOK start while this process creates the nodes and applies the CRD and RBAC
manifests. The cluster counts as up when every component is healthy and every node Ready.

A cluster either belongs to this process (`start()` ... `stop()`, or a `with` block), or is
detached (`kubeseer devcluster up`): then `state.json` in the run directory records the pids,
ports and kubeconfigs, and `read_state` / `stop_detached` find it again from another process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from kubeseer import resources
from kubeseer.devcluster import binaries, config, errors, inventory, pki, process
from kubeseer.devcluster.dra import publish as dra_publish
from kubeseer.extender import stanza

DEFAULT_INVENTORY = resources.path("deploy", "devcluster", "nodes.yaml")
DEFAULT_RUN_ROOT = binaries.cache_root() / "run"
STATE_VERSION = 1
TMPFS = Path("/dev/shm")
FIELD_MANAGER = "kubeseer-devcluster"
_POLL_S = 0.1
_LIFECYCLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
# Stopped first: everything that talks to the apiserver, then the apiserver, then etcd.
_STOP_WAVES = (
    ("kwok", "kube-scheduler", "kube-controller-manager"),
    ("kube-apiserver",),
    ("etcd",),
)


@dataclasses.dataclass(frozen=True)
class ClusterState:
    """Everything another process needs to use, check or stop a running cluster."""

    run_dir: str
    server: str
    admin_kubeconfig: str
    operator_kubeconfig: str
    ca_file: str
    etcd_data: str
    ports: config.Ports
    processes: tuple[process.ProcessRecord, ...]
    startup_s: float

    def to_json(self) -> str:
        """The state file's content."""
        body = dataclasses.asdict(self)
        body["version"] = STATE_VERSION
        return json.dumps(body, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str) -> ClusterState:
        """Parse a state file written by `to_json`."""
        try:
            body = json.loads(text)
            if body.pop("version") != STATE_VERSION:
                raise ValueError("unsupported state version")
            body["ports"] = config.Ports(**body["ports"])
            body["processes"] = tuple(process.ProcessRecord(**p) for p in body["processes"])
            return cls(**body)
        except (ValueError, KeyError, TypeError) as e:
            raise errors.ClusterStateError(f"{source}: not a devcluster state file ({e})") from e


class LocalCluster:
    """A local control plane with fake GPU nodes.

    Args:
        run_dir: where PKI, kubeconfigs, configs, logs and the state file go; a fresh
            temporary directory under `~/.cache/kubeseer/run` when omitted.
        inventory_file: the fake nodes (`deploy/devcluster/nodes.yaml` by default).
        crd_files: CustomResourceDefinition manifests applied (and waited for) at start.
        rbac_files: RBAC manifests applied at start; they bind the operator's ClusterRole to
            the service account whose identity `operator_kubeconfig` carries.
        extender_url: kubeseer's scheduler extender; without it kube-scheduler gets no
            `extenders` stanza (see `config.build_scheduler_config`).
        ready_timeout_s: how long start may take before it fails with the logs.
        detached: leave the processes running when this object is dropped (the CLI's `up`);
            otherwise they are killed if this process dies, so a crashed test run leaks nothing.
    """

    def __init__(
        self,
        *,
        run_dir: Path | None = None,
        inventory_file: Path = DEFAULT_INVENTORY,
        crd_files: Sequence[Path] = (),
        rbac_files: Sequence[Path] = (),
        extender_url: str | None = None,
        ready_timeout_s: float = 90.0,
        detached: bool = False,
        bins: binaries.Binaries | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.inventory_file = inventory_file
        self.crd_files = tuple(crd_files)
        self.rbac_files = tuple(rbac_files)
        self.extender_url = extender_url
        self.ready_timeout_s = ready_timeout_s
        self.detached = detached
        self._bins = bins
        self._children: list[subprocess.Popen[bytes]] = []
        self._records: list[process.ProcessRecord] = []
        self._layout: config.Layout | None = None
        self._state: ClusterState | None = None

    @property
    def state(self) -> ClusterState:
        """The running cluster's state; `ClusterStateError` before `start()`."""
        if self._state is None:
            raise errors.ClusterStateError("the cluster is not running")
        return self._state

    @property
    def admin_kubeconfig(self) -> Path:
        """A `system:masters` kubeconfig."""
        return Path(self.state.admin_kubeconfig)

    @property
    def operator_kubeconfig(self) -> Path:
        """The operator service account's kubeconfig, as limited as the RBAC manifests say."""
        return Path(self.state.operator_kubeconfig)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"LocalCluster(run_dir={self.run_dir!r}, inventory_file={self.inventory_file!r}, "
            f"extender_url={self.extender_url!r})"
        )

    def start(self) -> ClusterState:
        """Start every component and return once all are healthy and all nodes Ready."""
        if self._state is not None:
            raise errors.DevClusterError("the cluster is already running")
        nodes = inventory.load(self.inventory_file)
        bins = self._bins or binaries.locate()
        # The stanza kubeseer deploys (deploy/scheduler/): node names only, ignorable, every
        # GPU and MIG resource managed.
        extender = (
            config.Extender(
                url_prefix=self.extender_url,
                managed_resources=stanza.managed_resources(),
                weight=stanza.WEIGHT,
                node_cache_capable=True,
                ignorable=True,
            )
            if self.extender_url
            else None
        )
        began = time.monotonic()
        layout = self._prepare_layout()
        try:
            ports = _free_ports()
            server = f"https://{config.LOOPBACK}:{ports.apiserver}"
            _write_pki_and_configs(layout, server, extender)
            deadline = began + self.ready_timeout_s
            self._spawn("etcd", config.etcd_argv(bins, ports, layout), layout)
            self._spawn("kube-apiserver", config.apiserver_argv(bins, ports, layout), layout)
            probe = _Prober(layout)
            urls = config.health_urls(ports)
            self._wait("kube-apiserver", lambda: probe.ok(urls["kube-apiserver"]), deadline)
            self._spawn(
                "kube-controller-manager",
                config.controller_manager_argv(bins, ports, layout),
                layout,
            )
            self._spawn("kube-scheduler", config.scheduler_argv(bins, ports, layout), layout)
            self._spawn("kwok", config.kwok_argv(bins, ports, layout), layout)
            with contextlib.closing(_ApiClient(layout.admin_kubeconfig)) as api:
                api.apply_files(self.crd_files)
                for crd in _crd_names(self.crd_files):
                    established = functools.partial(api.crd_established, crd)
                    self._wait(f"CRD {crd}", established, deadline)
                api.apply_files(self.rbac_files)
                uids = api.create_nodes([inventory.build_node(n) for n in nodes.nodes])
                # DRA nodes: the driver's DeviceClasses and each node's ResourceSlices.
                api.apply_files(dra_publish.device_class_files(nodes))
                dra_publish.publish_slices(api.client, nodes, uids)
                for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                    self._wait(name, functools.partial(probe.ok, urls[name]), deadline)
                names = [n.name for n in nodes.nodes]
                self._wait(
                    "nodes Ready and untainted", functools.partial(api.nodes_ready, names), deadline
                )
            self._state = ClusterState(
                run_dir=str(layout.run_dir),
                server=server,
                admin_kubeconfig=str(layout.admin_kubeconfig),
                operator_kubeconfig=str(layout.operator_kubeconfig),
                ca_file=str(layout.pki_file("ca.crt")),
                etcd_data=str(layout.etcd_data),
                ports=ports,
                processes=tuple(self._records),
                startup_s=round(time.monotonic() - began, 2),
            )
            layout.state_file.write_text(self._state.to_json(), encoding="utf-8")
            return self._state
        except BaseException:
            self._teardown(layout)
            raise

    def stop(self) -> None:
        """Stop every component (process groups), free the ports, drop etcd's data; keep logs."""
        if self._layout is not None:
            self._teardown(self._layout)
        self._state = None

    def _prepare_layout(self) -> config.Layout:
        run_dir = self.run_dir
        if run_dir is None:
            DEFAULT_RUN_ROOT.mkdir(parents=True, exist_ok=True)
            run_dir = Path(tempfile.mkdtemp(prefix="cluster-", dir=DEFAULT_RUN_ROOT))
        run_dir.mkdir(parents=True, exist_ok=True)
        state_file = run_dir / "state.json"
        if state_file.exists():
            stale = read_state(run_dir)
            if any(process.runs(p) for p in stale.processes):
                raise errors.DevClusterError(
                    f"a cluster is already running in {run_dir}; "
                    f"stop it with `kubeseer devcluster down --dir {run_dir}`"
                )
            state_file.unlink()
        etcd_root = TMPFS if TMPFS.is_dir() and _writable(TMPFS) else run_dir
        etcd_data = Path(tempfile.mkdtemp(prefix="kubeseer-etcd-", dir=etcd_root))
        layout = config.Layout(run_dir=run_dir, etcd_data=etcd_data)
        layout.pki_dir.mkdir(mode=0o700, exist_ok=True)
        layout.logs_dir.mkdir(exist_ok=True)
        for old in layout.logs_dir.glob("*.log"):
            old.unlink()
        self.run_dir, self._layout = run_dir, layout
        return layout

    def _spawn(self, name: str, argv: list[str], layout: config.Layout) -> None:
        child, record = process.spawn(
            name, argv, layout.log(name), die_with_parent=not self.detached
        )
        self._children.append(child)
        self._records.append(record)

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        """Poll `ready` until it holds; fail with the logs if a component dies or time runs out.

        Errors from `ready` count as "not yet": a component that is still starting refuses
        connections, answers 500 or 403 before its RBAC is bootstrapped, and so on.
        """
        last: Exception | None = None
        while True:
            self._check_alive()
            try:
                if ready():
                    return
            except errors.DevClusterError:
                raise
            except Exception as e:
                last = e
            if time.monotonic() > deadline:
                detail = f" (last error: {last})" if last else ""
                raise errors.ClusterStartError(
                    f"{what} not ready within {self.ready_timeout_s:g} s{detail}; "
                    f"logs in {self.run_dir}:\n" + self._all_log_tails()
                )
            time.sleep(_POLL_S)

    def _check_alive(self) -> None:
        for child, record in zip(self._children, self._records, strict=True):
            if child.poll() is not None:
                raise errors.ClusterStartError(
                    f"{record.name} exited with status {child.returncode}; "
                    f"last lines of {record.log}:\n{process.log_tail(Path(record.log))}"
                )

    def _all_log_tails(self) -> str:
        return "\n".join(
            f"--- {r.name} ({r.log})\n{process.log_tail(Path(r.log), 15)}" for r in self._records
        )

    def _teardown(self, layout: config.Layout) -> None:
        by_name = {r.name: r for r in self._records}
        for wave in _STOP_WAVES:
            records = [by_name[n] for n in wave if n in by_name]
            process.stop(records, self._children)
        self._children.clear()
        self._records.clear()
        shutil.rmtree(layout.etcd_data, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            layout.state_file.unlink()


def read_state(run_dir: Path) -> ClusterState:
    """The state of the cluster started (detached) in `run_dir`."""
    path = run_dir / "state.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise errors.ClusterStateError(
            f"no cluster state in {run_dir} (not started, or stopped)"
        ) from e
    return ClusterState.from_json(text, source=str(path))


def stop_detached(run_dir: Path) -> ClusterState:
    """Stop the cluster recorded in `run_dir` (process groups, etcd data, state file)."""
    state = read_state(run_dir)
    by_name = {r.name: r for r in state.processes}
    for wave in _STOP_WAVES:
        process.stop([by_name[n] for n in wave if n in by_name])
    shutil.rmtree(state.etcd_data, ignore_errors=True)
    (run_dir / "state.json").unlink(missing_ok=True)
    return state


def health(state: ClusterState) -> dict[str, bool]:
    """Per component: is the process ours and alive, and does its health endpoint answer ok."""
    layout = config.Layout(run_dir=Path(state.run_dir), etcd_data=Path(state.etcd_data))
    probe = _Prober(layout)
    urls = config.health_urls(state.ports)
    report = {}
    for record in state.processes:
        alive = process.runs(record)
        try:
            report[record.name] = alive and probe.ok(urls[record.name])
        except OSError:
            report[record.name] = False
    return report


def _write_pki_and_configs(
    layout: config.Layout, server: str, extender: config.Extender | None
) -> None:
    ca = pki.Authority()
    serving = ca.issue_server("kubeseer-devcluster", ips=(config.LOOPBACK,), dns=("localhost",))
    admin = ca.issue_client(pki.Identity("kubeseer-admin", ("system:masters",)))
    scheduler = ca.issue_client(pki.Identity("system:kube-scheduler"))
    operator = ca.issue_client(
        pki.service_account_identity(config.OPERATOR_NAMESPACE, config.OPERATOR_SERVICE_ACCOUNT)
    )
    signing = pki.service_account_signing_key()
    files = {
        "ca.crt": ca.cert_pem,
        "serving.crt": serving.cert_pem,
        "serving.key": serving.key_pem,
        "admin.crt": admin.cert_pem,
        "admin.key": admin.key_pem,
        "sa.key": signing.private_pem,
        "sa.pub": signing.public_pem,
    }
    for name, data in files.items():
        _write_private(layout.pki_file(name), data)
    kubeconfigs = {
        layout.admin_kubeconfig: ("kubeseer-admin", admin),
        layout.scheduler_kubeconfig: ("kube-scheduler", scheduler),
        layout.operator_kubeconfig: ("kubeseer-operator", operator),
    }
    for path, (name, pair) in kubeconfigs.items():
        document = config.build_kubeconfig(name, server, ca.cert_pem, pair)
        _write_private(path, yaml.safe_dump(document, sort_keys=False).encode())
    scheduler_config = config.build_scheduler_config(layout.scheduler_kubeconfig, extender)
    layout.scheduler_config.write_text(yaml.safe_dump(scheduler_config, sort_keys=False))


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def _free_ports() -> config.Ports:
    """Six distinct loopback ports the kernel says are free now.

    All sockets stay open until every port is chosen, so the kernel cannot hand out one twice.
    """
    with contextlib.ExitStack() as stack:
        chosen = []
        for _ in range(6):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((config.LOOPBACK, 0))
            chosen.append(sock.getsockname()[1])
    return config.Ports(*chosen)


def _writable(path: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


class _Prober:
    """HTTPS health checks that trust the cluster CA and present the admin certificate."""

    def __init__(self, layout: config.Layout) -> None:
        self._context = ssl.create_default_context(cafile=str(layout.pki_file("ca.crt")))
        self._context.load_cert_chain(
            str(layout.pki_file("admin.crt")), str(layout.pki_file("admin.key"))
        )

    def ok(self, url: str) -> bool:
        context = self._context if url.startswith("https://") else None
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return response.status == 200 and response.read().strip() in (
                    b"ok",
                    b'{"health":"true","reason":""}',
                )
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


class _ApiClient:
    """The few API calls the launcher makes, through the `kubernetes` client."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client
        from kubernetes import config as kube_config

        self._api = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig)
        )
        self._core = client.CoreV1Api(self._api)
        self._ext = client.ApiextensionsV1Api(self._api)

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._api.close()

    def apply_files(self, files: Sequence[Path]) -> None:
        """Server-side apply every document of every file, in order.

        A document the apiserver rejects (an invalid CRD schema, an unknown kind) fails the
        start with the file, the object and the apiserver's own message.
        """
        from kubernetes import dynamic
        from kubernetes.dynamic import exceptions

        documents = [(path, doc) for path in files for doc in _documents(path)]
        if not documents:
            return
        client = dynamic.DynamicClient(self._api)  # type: ignore[no-untyped-call]
        for path, doc in documents:
            metadata = doc.get("metadata", {})
            what = f"{doc['kind']} {metadata.get('name')!r} from {path}"
            try:
                resource = client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                namespace = metadata.get("namespace", "default") if resource.namespaced else None
                resource.server_side_apply(
                    body=doc,
                    name=metadata["name"],
                    namespace=namespace,
                    field_manager=FIELD_MANAGER,
                    force_conflicts=True,
                )
            except exceptions.DynamicApiError as e:
                raise errors.ClusterStartError(
                    f"the apiserver rejected {what}: {_status_message(e)}"
                ) from e
            except exceptions.ResourceNotFoundError as e:
                raise errors.ClusterStartError(f"the apiserver does not serve {what}") from e

    @property
    def client(self) -> Any:
        """The underlying `kubernetes.client.ApiClient`."""
        return self._api

    def create_nodes(self, manifests: Sequence[inventory.NodeManifest]) -> dict[str, str]:
        """Create the Nodes with their status; re-send the status if the apiserver dropped it.

        Returns each node's UID, which the DRA driver's slices name as their owner.
        """
        uids = {}
        for manifest in manifests:
            # The generated client serialises plain dicts as they are.
            body: Any = manifest
            created = self._core.create_node(body=body)
            kept = created.status.allocatable if created.status else None
            if any(k not in (kept or {}) for k in manifest["status"]["allocatable"]):
                self._core.patch_node_status(
                    manifest["metadata"]["name"], body={"status": manifest["status"]}
                )
            if created.metadata is not None and created.metadata.uid:
                uids[manifest["metadata"]["name"]] = created.metadata.uid
        return uids

    def nodes_ready(self, names: Sequence[str]) -> bool:
        """Whether every named node is Ready and free of the node-lifecycle taints.

        The controller manager taints a node `node.kubernetes.io/not-ready:NoSchedule` until
        its Ready condition holds and lifts it a moment after KWOK reports Ready; until then
        the scheduler skips the node, so "Ready" alone would let a test race the taint.
        """
        ready = set()
        for node in self._core.list_node().items:
            conditions = node.status.conditions if node.status else None
            taints = node.spec.taints if node.spec else None
            lifecycle = [t for t in taints or () if t.key in _LIFECYCLE_TAINTS]
            if (
                node.metadata
                and not lifecycle
                and any(c.type == "Ready" and c.status == "True" for c in conditions or ())
            ):
                ready.add(node.metadata.name)
        return all(n in ready for n in names)

    def crd_established(self, name: str) -> bool:
        """Whether the CRD reports Established, i.e. its kind can be served."""
        crd = self._ext.read_custom_resource_definition(name)
        conditions = crd.status.conditions if crd.status else None
        return any(c.type == "Established" and c.status == "True" for c in conditions or ())


def _status_message(error: Exception) -> str:
    """The `message` of the Kubernetes Status in an API error body, else the error itself."""
    body = getattr(error, "body", None)
    if not isinstance(body, str | bytes):
        return str(error)
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(error)


def _crd_names(files: Sequence[Path]) -> list[str]:
    return [
        doc["metadata"]["name"]
        for path in files
        for doc in _documents(path)
        if doc.get("kind") == "CustomResourceDefinition"
    ]


def _documents(path: Path) -> Iterator[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise errors.DevClusterError(f"cannot read manifest {path}: {e}") from e
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            raise errors.DevClusterError(f"{path}: every document must have apiVersion and kind")
        if doc["kind"].endswith("List"):
            yield from doc.get("items", [])
        else:
            yield doc
