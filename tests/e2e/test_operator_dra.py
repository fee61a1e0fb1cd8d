"""The operator on Dynamic Resource Allocation, end to end on the real 1.37 scheduler.

A cluster of its own runs `deploy/devcluster/dra-nodes.yaml`: an H100 node with static MIG
(GPU 0 as 2 x 1g.10gb + 2g.20gb + 3g.40gb, GPU 1 whole), an H100 node (2 GPUs) and an A100-40GB
node with dynamic MIG, their ResourceSlices published as NVIDIA's DRA driver would (the only
fake). The real operator, with the least-privilege identity of deploy/rbac/ and its GPU backend
on `auto`, finds the driver's DeviceClasses and no device plugin and so uses DRA: each DLJob
attempt is a Job whose pods claim the plan's ladder, the real kube-scheduler allocates a device
and KWOK runs the pod. Predictions are the shipped checkpoint's, for MLPs of several sizes (no
SM utilisation learned: the ladder is ordered by the share of the GPU each rung holds). What
the scheduler allocated is checked against the slices (`devcluster.dra.allocation.Ledger`) and
the claims themselves, and must be what the DLJob's status says.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from operator_support import (
    SMALL,
    configmap,
    dljob,
    get,
    mlp,
    oom_kill,
    operator_config,
    operator_thread,
    phase_is,
    pods_of,
    submit,
    table,
)

from kubeseer import resources
from kubeseer.devcluster import binaries, cluster
from kubeseer.devcluster.dra import allocation
from kubeseer.operator import main
from kubeseer.operator.config import GpuBackend
from kubeseer.placement import claims

pytestmark = pytest.mark.e2e

GROUP, VERSION = "resource.k8s.io", "v1"
DEPLOY = resources.path("deploy")
DRA_INVENTORY = resources.path("deploy", "devcluster", "dra-nodes.yaml")
STATIC = "gpu-h100-dra-static-0"
H100_DYNAMIC = "gpu-h100-dra-dynamic-0"
A100_DYNAMIC = "gpu-a100-40-dra-dynamic-0"
MIB = 1 << 20
# Upper bounds the shipped checkpoint predicts for them (GiB), for the reader: 0.6, 4.4, 9.5, 16.
MODELS = {
    "small": (SMALL, "infer", 8),
    "mid": (mlp(8192, 4), "train", 256),
    "large": (mlp(8192, 8), "train", 512),
    "huge": (mlp(16384, 4), "train", 256),
}


@pytest.fixture(scope="module")
def dra_cluster(
    tmp_path_factory: pytest.TempPathFactory, control_plane: binaries.Binaries
) -> Iterator[cluster.LocalCluster]:
    local = cluster.LocalCluster(
        run_dir=tmp_path_factory.mktemp("operator-dra"),
        inventory_file=DRA_INVENTORY,
        crd_files=sorted((DEPLOY / "crds").glob("*.yaml")),
        rbac_files=sorted((DEPLOY / "rbac").glob("*.yaml")),
        bins=control_plane,
    )
    with local:
        yield local


@pytest.fixture(scope="module")
def api(dra_cluster: cluster.LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(dra_cluster.admin_kubeconfig))


@pytest.fixture(scope="module")
def operator(
    dra_cluster: cluster.LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[main.Operator]:
    built = main.build(
        operator_config(tmp_path_factory.mktemp("operator"), max_attempts=3),
        kubeconfig=str(dra_cluster.operator_kubeconfig),
    )
    with operator_thread(built):
        yield built


class Lab:
    """One test's namespace: its models as ConfigMaps, DLJobs pinned to nodes, and reads of what
    the scheduler allocated to them."""

    def __init__(self, api: client.ApiClient, namespace: str, wait_for: Any) -> None:
        self.api = api
        self.namespace = namespace
        self.wait_for = wait_for
        self.custom = client.CustomObjectsApi(api)
        self.models: dict[str, dict[str, str]] = {}

    def submit(self, name: str, model: str, *nodes: str) -> None:
        """A DLJob of one of `MODELS`, its pods pinned to one node (a nodeSelector, which the
        plan honours as well as the scheduler)."""
        data, mode, batch = MODELS[model]
        if model not in self.models:
            self.models[model] = configmap(self.api, self.namespace, model, data)
        source = {"configMapRef": self.models[model]}
        template = dljob(name, source, mode=mode, batch=batch)["spec"]["template"]
        if nodes:
            (node,) = nodes
            template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        body = dljob(name, source, mode=mode, batch=batch, template=template)
        submit(self.api, self.namespace, body)

    def allocated(self, name: str, attempt: int = 0) -> dict[str, Any]:
        """The DLJob once its attempt's claim is allocated and its pod runs."""

        def probe() -> dict[str, Any] | None:
            body = get(self.api, self.namespace, name)
            status = body.get("status", {})
            done = (status.get("allocation") or {}).get("attempt") == attempt
            return body if done and status.get("phase") == "Running" else None

        return dict(self.wait_for(f"{name} attempt {attempt} allocated and running", probe, 90))

    def claims(self) -> dict[str, claims.Allocation]:
        """Every allocated claim of the namespace, by claim name."""
        items = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims"
        )["items"]
        found = {}
        for item in items:
            made = claims.read_allocation(item)
            if made is not None:
                found[item["metadata"]["name"]] = made
        return found

    def describe(self, name: str) -> str:
        """The DLJob's Jobs and pods in a line, for a failure message."""
        jobs = (
            client.BatchV1Api(self.api)
            .list_namespaced_job(self.namespace, label_selector=f"kubeseer.io/dljob={name}")
            .items
        )
        parts = [
            f"job {j.metadata.name} suspend={j.spec.suspend} active={j.status.active} "
            f"ready={j.status.ready} failed={j.status.failed} "
            f"conditions={[(c.type, c.status) for c in j.status.conditions or ()]}"
            for j in jobs
        ]
        for pod in pods_of(self.api, self.namespace, name):
            conditions = [f"{c.type}={c.status}/{c.reason}" for c in pod.status.conditions or ()]
            parts.append(f"pod {pod.metadata.name} {pod.status.phase} {conditions}")
        return "; ".join(parts) or "no Job"

    def waiting(self, name: str) -> bool:
        """The DLJob's pod was found unschedulable: no rung of its claim has a free device."""
        for pod in pods_of(self.api, self.namespace, name):
            for c in pod.status.conditions or ():
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    return True
        return False


@pytest.fixture
def lab(api: client.ApiClient, operator: main.Operator, wait_for: Any) -> Iterator[Lab]:
    """A namespace of its own; afterwards its DLJobs are deleted and their claims (so their
    devices) released before the next test."""
    namespace = f"dra-op-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    made = Lab(api, namespace, wait_for)
    yield made
    # DLJobs first: their Jobs go with them, so no pod deleted with the namespace looks like
    # one deleted by hand (which would start another attempt).
    made.custom.delete_collection_namespaced_custom_object(
        "kubeseer.io", "v1alpha1", namespace, "dljobs"
    )
    wait_for("the test's claims to be released", lambda: not made.claims(), 60)
    core.delete_namespace(namespace)


def ledger(api: client.ApiClient) -> allocation.Ledger:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices"
    )["items"]
    return allocation.Ledger(items)


def device_of(body: dict[str, Any]) -> tuple[str, str]:
    found = body["status"]["allocation"]
    return found["claims"][0]["node"], found["claims"][0]["device"]


def test_auto_detection_picks_dra_where_only_the_dra_driver_serves_gpus(
    operator: main.Operator,
) -> None:
    assert operator.backend is GpuBackend.DRA


@pytest.mark.parametrize("node", [STATIC, H100_DYNAMIC])
def test_a_dljobs_claim_is_allocated_a_device_whose_usable_memory_holds_the_bound(
    api: client.ApiClient, lab: Lab, node: str
) -> None:
    lab.submit("job", "mid", node)
    body = lab.allocated("job")
    status = body["status"]
    need = status["plan"]["needMiB"] * MIB
    assert need >= status["prediction"]["memoryUpperBytes"]
    pool, device = device_of(body)
    assert pool == node
    held = ledger(api).capacity((pool, device), "memory")
    assert held is not None and held >= need
    # The status says what the claim says, and the placement is the device allocated.
    (claim_name, found), *_ = lab.claims().items()
    assert status["allocation"]["claims"][0]["claim"] == claim_name
    assert (found.pool, found.device, found.rung) == (pool, device, status["allocation"]["rung"])
    assert status["placement"]["usableMemoryBytes"] == held
    assert status["placement"]["costRank"] == status["allocation"]["rank"]
    (chosen,) = [r for r in status["plan"]["rows"] if r["chosen"]]
    assert chosen["rank"] == status["allocation"]["rank"]
    # 4.4 GiB: the H100's 1g.10gb is the cheapest rung on this node, and one is free.
    assert (found.first_choice, status["placement"]["migProfile"]) == (True, "1g.10gb")
    (pod,) = pods_of(api, lab.namespace, "job")
    assert pod.spec.resource_claims[0].resource_claim_template_name == "job-0"
    # `kubectl get dlj -o wide`: the rung, its rank and the device.
    rendered = table(api, lab.namespace)
    columns = [c["name"] for c in rendered["columnDefinitions"]]
    (row,) = rendered["rows"]
    wide = dict(zip(columns, row["cells"], strict=True))
    assert (wide["Rung"], wide["Rank"], wide["Device"]) == (
        status["placement"]["profile"],
        status["allocation"]["rank"],
        f"{pool}/{device}",
    )


def test_when_the_first_rung_is_taken_the_next_one_is_used(api: client.ApiClient, lab: Lab) -> None:
    """The static node has two 1g.10gb devices, its plan's rung 1: the third DLJob's claim gets
    rung 2, the 2g.20gb, and the status says it was not the first choice."""
    got = []
    for i in range(3):
        lab.submit(f"job-{i}", "mid", STATIC)
        got.append(lab.allocated(f"job-{i}")["status"])
    firsts = [(s["allocation"]["rank"], s["allocation"]["firstChoice"]) for s in got]
    assert firsts == [(1, True), (1, True), (2, False)]
    assert [s["placement"]["migProfile"] for s in got] == ["1g.10gb", "1g.10gb", "2g.20gb"]
    assert len({s["allocation"]["device"] for s in got}) == 3
    held = ledger(api)
    for s in got:
        pool, device = s["allocation"]["device"].split("/")
        assert (held.capacity((pool, device), "memory") or 0) >= s["plan"]["needMiB"] * MIB


def test_a_dljob_that_fits_nothing_free_waits_and_is_placed_when_a_device_frees(
    api: client.ApiClient, lab: Lab, wait_for: Any
) -> None:
    """Seven small jobs fill the A100-40GB's seven 1g.5gb placements and its 98 SMs; the eighth
    waits (Placed, its pod unschedulable, no allocation) until one is deleted."""
    names = [f"job-{i}" for i in range(7)]
    for name in names:
        lab.submit(name, "small", A100_DYNAMIC)
    placed = {name: lab.allocated(name) for name in names}
    devices = sorted(device_of(b)[1] for b in placed.values())
    assert devices == [f"gpu-0-mig-1g5gb-19-{s}" for s in range(7)]
    lab.submit("late", "small", A100_DYNAMIC)
    wait_for("the eighth DLJob's pod to wait", lambda: lab.waiting("late"), 60)
    late = get(api, lab.namespace, "late")
    assert late["status"]["phase"] == "Placed"
    assert "allocation" not in late["status"]
    freed = next(n for n, b in placed.items() if device_of(b)[1] == "gpu-0-mig-1g5gb-19-3")
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "kubeseer.io", "v1alpha1", lab.namespace, "dljobs", freed
    )
    body = lab.allocated("late")
    assert device_of(body) == (A100_DYNAMIC, "gpu-0-mig-1g5gb-19-3")
    assert body["status"]["allocation"]["firstChoice"] is True


def test_dljobs_never_get_overlapping_mig_placements_on_dynamic_layouts(
    api: client.ApiClient, lab: Lab, wait_for: Any
) -> None:
    """A burst of 14 DLJobs of four sizes over the dynamic A100 and H100 nodes, submitted at once:
    every allocation is a MIG placement disjoint from the others and within its GPU's counters,
    holds its DLJob's need, and is the one the DLJob's status names."""
    sizes = ["small", "mid", "large", "huge", "mid", "small", "large"] * 2
    names = [f"job-{i}" for i in range(len(sizes))]
    for name, size in zip(names, sizes, strict=True):
        lab.submit(name, size)

    seen: dict[str, str] = {}

    def settled() -> bool:
        statuses = {n: get(api, lab.namespace, n).get("status", {}) for n in names}
        seen.update(
            {
                n: f"{s.get('phase')} {s.get('reason', '')} allocation="
                f"{(s.get('allocation') or {}).get('device')} attempt="
                f"{(s.get('placement') or {}).get('attempt')}"
                for n, s in statuses.items()
            }
        )
        running = sum(s.get("phase") == "Running" for s in statuses.values())
        return running == len(names) or (
            running > 0
            and all(s.get("phase") == "Running" or lab.waiting(n) for n, s in statuses.items())
        )

    try:
        wait_for("every DLJob running or waiting", settled, 180)
    except pytest.fail.Exception:
        stuck = {
            n: f"{phase}: {lab.describe(n)}" for n, phase in seen.items() if "Running" not in phase
        }
        pytest.fail(f"not every DLJob running or waiting after 180 s: {stuck}")
    held = lab.claims()
    slices = ledger(api)
    devices = [(a.pool, a.device) for a in held.values()]
    assert len(devices) == len(set(devices))
    assert slices.overlapping(devices) == []
    assert slices.overcommitted(devices) == []
    assert {a.pool for a in held.values()} <= {A100_DYNAMIC, H100_DYNAMIC, STATIC}
    recorded = {}
    for name in names:
        status = get(api, lab.namespace, name)["status"]
        if "allocation" in status:
            pool, device = status["allocation"]["device"].split("/")
            recorded[(pool, device)] = status["plan"]["needMiB"] * MIB
    assert set(recorded) <= set(devices)
    for key, need in recorded.items():
        assert (slices.capacity(key, "memory") or 0) >= need
    print(f"{len(held)} of {len(names)} DLJobs allocated at once, none overlapping")


def test_escalation_after_an_oom_ends_on_a_larger_device(
    api: client.ApiClient, lab: Lab, wait_for: Any
) -> None:
    lab.submit("oom", "mid", H100_DYNAMIC)
    first = lab.allocated("oom")
    before = device_of(first)
    (pod,) = pods_of(api, lab.namespace, "oom", attempt=0)
    oom_kill(api, lab.namespace, pod.metadata.name)
    second = lab.allocated("oom", attempt=1)
    after = device_of(second)
    slices = ledger(api)
    old, new = slices.capacity(before, "memory") or 0, slices.capacity(after, "memory") or 0
    assert new >= 1.5 * old > 0
    status = second["status"]
    assert [a["outcome"] for a in status["attempts"]] == ["OOMKilled"]
    assert status["attempts"][0]["observation"]["memoryBytesAtLeast"] == old
    assert status["plan"]["needBasis"].startswith("1.5x the")
    template = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, lab.namespace, "resourceclaimtemplates", "oom-1"
    )
    # Every rung of the new ladder holds 1.5x what failed: the rung that failed is gone.
    failed_rung = first["status"]["allocation"]["rung"].split("-", 1)[1]
    rungs = template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert rungs and not any(r["name"].split("-", 1)[1] == failed_rung for r in rungs)
    wait_for("attempt 1 running", phase_is(api, lab.namespace, "oom", "Running"), 30)
