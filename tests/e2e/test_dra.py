"""Dynamic Resource Allocation on the real kube-scheduler, on both MIG layouts.

A cluster of its own runs `deploy/devcluster/dra-nodes.yaml`: an H100 node with static MIG (GPU0
as 2 x 1g.10gb + 2g.20gb + 3g.40gb, GPU1 whole), an H100 node and an A100-40GB node with dynamic
MIG. Their ResourceSlices are the only fake (what NVIDIA's DRA driver would publish); the
claims are kubeseer's own (`placement.plan` -> `placement.claims.build_claim_template`), the
pods are created directly (no operator), and the real scheduler allocates. What it allocated is
read back from each claim's `status.allocation.devices.results`.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from kubeseer import prediction, resources
from kubeseer.devcluster import binaries, cluster, inventory
from kubeseer.devcluster.dra import allocation
from kubeseer.placement import catalogue, claims, plan

pytestmark = pytest.mark.e2e

GROUP, VERSION = "resource.k8s.io", "v1"
GIB = catalogue.GIB
DRA_INVENTORY = resources.path("deploy", "devcluster", "dra-nodes.yaml")
STATIC = "gpu-h100-dra-static-0"
H100_DYNAMIC = "gpu-h100-dra-dynamic-0"
A100_DYNAMIC = "gpu-a100-40-dra-dynamic-0"
H100 = catalogue.model_by_key("H100-80GB-SXM")
A100_40 = catalogue.model_by_key("A100-40GB")


@pytest.fixture(scope="module")
def dra_cluster(
    tmp_path_factory: pytest.TempPathFactory, control_plane: binaries.Binaries
) -> Iterator[cluster.LocalCluster]:
    local = cluster.LocalCluster(
        run_dir=tmp_path_factory.mktemp("dra"), inventory_file=DRA_INVENTORY, bins=control_plane
    )
    with local:
        yield local


@pytest.fixture(scope="module")
def api(dra_cluster: cluster.LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(dra_cluster.admin_kubeconfig))


class Jobs:
    """Pods with a ResourceClaimTemplate each, in one namespace, and what they were given."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.needs: dict[str, int] = {}

    def submit(self, name: str, made: plan.Plan, nodes: Sequence[str]) -> None:
        """The plan's ladder as a template, and a pod using it on one of `nodes`."""
        template = claims.build_claim_template(made, name, self.namespace)
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaimtemplates", dict(template)
        )
        self.core.create_namespaced_pod(self.namespace, claim_pod(name, name, nodes))
        self.needs[name] = made.need_bytes

    def pod(self, name: str) -> dict[str, Any]:
        """The pod as raw JSON (the generated models lag the DRA status fields)."""
        response = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        return dict(json.loads(response.data))

    def running(self, name: str) -> bool:
        return self.pod(name)["status"].get("phase") == "Running"

    def unschedulable(self, name: str) -> str | None:
        """The scheduler's message once it has given up on the pod for now."""
        for condition in self.pod(name)["status"].get("conditions", []):
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", "unschedulable"))
        return None

    def claim(self, pod_name: str) -> dict[str, Any] | None:
        statuses = self.pod(pod_name)["status"].get("resourceClaimStatuses", [])
        if not statuses or not statuses[0].get("resourceClaimName"):
            return None
        return dict(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "resourceclaims", statuses[0]["resourceClaimName"]
            )
        )

    def allocation(self, pod_name: str) -> claims.Allocation | None:
        found = self.claim(pod_name)
        return claims.read_allocation(found) if found else None

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def claims_left(self) -> int:
        listed = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "resourceclaims"
        )
        return len(listed["items"])


def claim_pod(name: str, template: str, nodes: Sequence[str]) -> dict[str, Any]:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
                        ]
                    }
                ]
            }
        }
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "affinity": affinity,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


@pytest.fixture
def jobs(api: client.ApiClient, wait_for: Callable[..., Any]) -> Iterator[Jobs]:
    """A namespace of its own; afterwards its pods are deleted and their claims (so their
    devices) are released before the next test."""
    core = client.CoreV1Api(api)
    name = f"dra-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    made = Jobs(api, name)
    yield made
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    wait_for("the test's claims to be released", lambda: made.claims_left() == 0)
    core.delete_namespace(name)


def need(gib: float, *models: catalogue.GpuModel, learned_util: float | None = None) -> plan.Plan:
    """The plan of a job whose calibrated upper bound is `gib`, as the shipped checkpoint makes
    it (no utilisation evidence: rungs in order of the share of the GPU they hold), or with
    `learned_util` % SM utilisation learned on an H100 (rungs too slow for it left out)."""
    bytes_ = gib * GIB
    util = 100.0 if learned_util is None else learned_util
    made = prediction.Prediction(
        mode=prediction.Mode.TRAIN,
        batch_size=32,
        precision=prediction.Precision.FP32,
        memory_bytes=prediction.Estimate(bytes_, bytes_),
        sm_util_percent=prediction.Estimate(util, util),
        step_time_s=prediction.Estimate(0.1, 0.1),
        coverage=0.95,
        model_digest="sha256:" + "0" * 64,
        predictor_version="e2e",
        label_device="AMD EPYC" if learned_util is None else "NVIDIA-H100-80GB-HBM3",
        unlearned=("sm_util_percent",) if learned_util is None else (),
    )
    return plan.build(made, plan.from_catalogue(models), max_slowdown=2.0)


def slices_ledger(api: client.ApiClient) -> allocation.Ledger:
    listed = client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, "resourceslices"
    )
    return allocation.Ledger(listed["items"])


def place(jobs: Jobs, name: str, made: plan.Plan, nodes: Sequence[str], wait_for: Any) -> Any:
    """Submit one job and wait for it to run; its allocation."""
    jobs.submit(name, made, nodes)
    wait_for(f"{name} to run", lambda: jobs.running(name))
    return jobs.allocation(name)


def rank(found: claims.Allocation) -> int:
    return int(found.rung.split("-", 1)[0].removeprefix("r"))


def test_the_apiserver_keeps_the_slices_as_the_driver_publishes_them_without_feature_gates(
    api: client.ApiClient, dra_cluster: cluster.LocalCluster
):
    """Kubernetes 1.37 serves partitionable devices (beta, on by default): counters survive."""
    custom = client.CustomObjectsApi(api)
    items = custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    pools: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        pools.setdefault(item["spec"]["pool"]["name"], []).append(item)
    expected = inventory.load(Path(dra_cluster.inventory_file))
    assert set(pools) == {n.name for n in expected.dra_nodes()}
    for name, members in pools.items():
        assert {m["spec"]["pool"]["resourceSliceCount"] for m in members} == {len(members)}
        assert {m["metadata"]["ownerReferences"][0]["name"] for m in members} == {name}
    counters = [m for m in pools[H100_DYNAMIC] if "sharedCounters" in m["spec"]]
    assert [len(m["spec"]["sharedCounters"]) for m in counters] == [2]
    devices = [d for m in pools[H100_DYNAMIC] for d in m["spec"].get("devices", [])]
    assert len(devices) == 2 * 19
    assert all(d["consumesCounters"] for d in devices)
    classes = custom.list_cluster_custom_object(GROUP, VERSION, "deviceclasses")["items"]
    by_name = {c["metadata"]["name"]: c["spec"] for c in classes}
    assert by_name[claims.GPU_DEVICE_CLASS]["extendedResourceName"] == "nvidia.com/gpu"
    assert claims.MIG_DEVICE_CLASS in by_name
    for node in client.CoreV1Api(api).list_node().items:
        if node.metadata.name in pools:
            assert not [r for r in node.status.allocatable if r.startswith("nvidia.com/")]


@pytest.mark.parametrize(
    ("node", "rung", "first_choice"),
    [(STATIC, "r2-h100-80gb-sxm-2g-20gb", False), (H100_DYNAMIC, "r1-h100-80gb-sxm-1g-20gb", True)],
)
def test_a_claim_gets_a_device_whose_usable_memory_holds_the_bound(
    api: client.ApiClient, jobs: Jobs, wait_for: Any, node: str, rung: str, first_choice: bool
):
    made = need(15, H100)
    found = place(jobs, "job", made, [node], wait_for)
    assert found is not None
    assert (found.pool, found.rung, found.first_choice) == (node, rung, first_choice)
    # The static node has no 1g.20gb; the 1g.10gb devices hold too little, so the 2g.20gb.
    assert slices_ledger(api).capacity((found.pool, found.device), "memory") >= made.need_bytes
    assert made.need_bytes == 15 * GIB


def test_static_each_job_gets_the_cheapest_rung_with_a_free_device_then_waits_until_one_frees(
    api: client.ApiClient, jobs: Jobs, wait_for: Any
):
    made = need(5, H100)
    got = [place(jobs, f"job-{i}", made, [STATIC], wait_for) for i in range(5)]
    assert [(rank(a), a.device) for a in got] == [
        (1, "gpu-0-mig-1g10gb-19-2"),
        (1, "gpu-0-mig-1g10gb-19-3"),
        (3, "gpu-0-mig-2g20gb-14-0"),  # no 1g.20gb exists on this node (rung 2)
        (4, "gpu-0-mig-3g40gb-9-4"),
        (7, "gpu-1"),  # no 4g.40gb or 7g.80gb either: the whole GPU
    ]
    ledger = slices_ledger(api)
    assert all(ledger.capacity((a.pool, a.device), "memory") >= made.need_bytes for a in got)
    jobs.submit("job-5", made, [STATIC])
    message = wait_for("job-5 to be unschedulable", lambda: jobs.unschedulable("job-5"))
    assert "claim" in message.lower()
    assert jobs.allocation("job-5") is None
    jobs.delete("job-1")
    wait_for("job-5 to run once a device frees", lambda: jobs.running("job-5"))
    freed = jobs.allocation("job-5")
    assert freed is not None
    assert (freed.device, freed.first_choice) == ("gpu-0-mig-1g10gb-19-3", True)


def test_dynamic_when_the_first_rung_is_taken_the_next_one_is_used(
    api: client.ApiClient, jobs: Jobs, wait_for: Any
):
    made = need(4, A100_40, H100)
    # Equal cost (1 of 7 compute slices); the A100's 1g.5gb strands less memory, so it is first.
    assert [r.candidate.profile.name for r in made.ladder[:2]] == ["1g.5gb", "1g.10gb"]
    nodes = [A100_DYNAMIC, H100_DYNAMIC]
    got = [place(jobs, f"job-{i}", made, nodes, wait_for) for i in range(8)]
    assert [a.rung for a in got[:7]] == ["r1-a100-40gb-1g-5gb"] * 7
    assert sorted(a.device for a in got[:7]) == [f"gpu-0-mig-1g5gb-19-{s}" for s in range(7)]
    assert {a.pool for a in got[:7]} == {A100_DYNAMIC}
    # The A100 has no SMs left (7 x 14 of 98): the next job takes the H100's 1g.10gb.
    assert (got[7].rung, got[7].pool, got[7].first_choice) == (
        "r2-h100-80gb-sxm-1g-10gb",
        H100_DYNAMIC,
        False,
    )
    ledger = slices_ledger(api)
    held = [(a.pool, a.device) for a in got]
    assert ledger.overcommitted(held) == []
    assert ledger.usage(held)[(A100_DYNAMIC, "gpu-0-counter-set")]["multiprocessors"] == 98


@pytest.mark.parametrize("node", [STATIC, H100_DYNAMIC])
def test_a_rung_is_never_filled_by_a_device_slower_than_the_plan_allows(
    api: client.ApiClient, jobs: Jobs, wait_for: Any, node: str
):
    """A job keeping 80 % of an H100's SMs busy is too slow on anything below 3g.40gb (60 of
    132 SMs: 1.76x within maxSlowdown 2), although 5 GiB fit a 1g.10gb. Dynamic MIG lists the
    1g.10gb placements first; the 3g rung must still get a 3g device."""
    made = need(5, H100, learned_util=80)
    assert [r.candidate.profile.name for r in made.ladder] == [
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
        None,
    ]
    found = place(jobs, "busy", made, [node], wait_for)
    assert found is not None
    assert found.rung == "r1-h100-80gb-sxm-3g-40gb"
    assert slices_ledger(api).capacity((found.pool, found.device), "multiprocessors") == 60


def test_dynamic_a_full_gpu_makes_the_next_job_wait_and_a_released_placement_is_reused(
    jobs: Jobs, wait_for: Any
):
    made = need(4, A100_40)
    got = {f"job-{i}": place(jobs, f"job-{i}", made, [A100_DYNAMIC], wait_for) for i in range(7)}
    jobs.submit("late", made, [A100_DYNAMIC])
    wait_for("the eighth job to be unschedulable", lambda: jobs.unschedulable("late"))
    freed = next(name for name, a in got.items() if a.device == "gpu-0-mig-1g5gb-19-3")
    jobs.delete(freed)
    wait_for("the eighth job to run", lambda: jobs.running("late"))
    late = jobs.allocation("late")
    assert late is not None
    assert (late.device, late.first_choice) == ("gpu-0-mig-1g5gb-19-3", True)


def test_dynamic_claims_never_get_overlapping_placements_or_exceed_a_gpus_counters(
    api: client.ApiClient, jobs: Jobs, wait_for: Any
):
    """A burst of mixed jobs, more than fit, submitted at once; then every running one is
    deleted while the rest get placed. At every look, allocations are disjoint MIG placements
    within each GPU's counters, each holding its job's need."""
    rng = random.Random(19)
    nodes = [A100_DYNAMIC, H100_DYNAMIC]
    names = []
    for i in range(18):
        gib = rng.choice([3, 4, 8, 9, 15, 18, 30, 38, 60])
        jobs.submit(f"job-{i}", need(gib, A100_40, H100), nodes)
        names.append(f"job-{i}")
    ledger = slices_ledger(api)

    def settled() -> bool:
        return all(jobs.running(n) or jobs.unschedulable(n) for n in names)

    def check() -> dict[str, claims.Allocation]:
        """Every allocated claim of the namespace, those of deleted pods still held included."""
        found = {}
        for item in jobs.custom.list_namespaced_custom_object(
            GROUP, VERSION, jobs.namespace, "resourceclaims"
        )["items"]:
            made = claims.read_allocation(item)
            if made is not None:
                found[item["metadata"]["ownerReferences"][0]["name"]] = made
        held = [(a.pool, a.device) for a in found.values()]
        assert ledger.overcommitted(held) == []
        assert ledger.overlapping(held) == []
        for name, a in found.items():
            assert ledger.capacity((a.pool, a.device), "memory") >= jobs.needs[name]
        return found

    wait_for("every job to run or wait", settled, timeout=60)
    first = check()
    waiting = [n for n in names if n not in first]
    assert first and waiting, "the burst should both fit partly and overflow"
    for name in first:
        jobs.delete(name)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(jobs.running(n) for n in waiting):
        check()
        time.sleep(0.5)
    later = check()
    assert set(later) & set(waiting), "a waiting job is placed once devices free"
    print(
        f"{len(first)} placed, {len(waiting)} waited, {len(set(later) & set(waiting))} placed later"
    )


def test_a_pod_asking_for_nvidia_com_gpu_gets_a_whole_gpu_through_the_device_class(
    jobs: Jobs, wait_for: Any
):
    """DRAExtendedResource (GA in 1.37): device-plugin style pod specs keep working on DRA nodes."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    jobs.core.create_namespaced_pod(jobs.namespace, body)
    wait_for("the legacy pod to run", lambda: jobs.running("legacy"))
    status = jobs.pod("legacy")["status"]["extendedResourceClaimStatus"]
    claim = jobs.custom.get_namespaced_custom_object(
        GROUP, VERSION, jobs.namespace, "resourceclaims", status["resourceClaimName"]
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert allocation.parse_mig_name(result["device"]) is None
    assert result["device"].startswith("gpu-")
