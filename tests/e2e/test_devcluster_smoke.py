"""The local control plane behaves like a real cluster with GPU nodes: MIG resources are
scheduled by the real kube-scheduler, Jobs complete, namespaces delete, and RBAC really limits
the operator's identity."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubeseer.devcluster import cluster, config, inventory

pytestmark = pytest.mark.e2e

START_BUDGET_S = 30.0


def gpu_pod(name: str, resource: str, scheduler: str = config.KUBESEER_SCHEDULER) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {resource: "1"}}}
            ],
        },
    }


def test_cluster_was_ready_within_the_start_budget(devcluster: cluster.LocalCluster):
    assert devcluster.state.startup_s <= START_BUDGET_S


def test_every_inventory_node_is_ready_with_the_gpu_operator_labels_and_resources(
    devcluster: cluster.LocalCluster, admin_api: client.ApiClient
):
    core = client.CoreV1Api(admin_api)
    expected = inventory.load(devcluster.inventory_file)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {n.name for n in expected.nodes}
    for spec in expected.nodes:
        node = nodes[spec.name]
        assert node.metadata.labels.items() >= spec.labels().items()
        # KWOK took the node over and kept the GPU resources the device plugin would publish.
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert [c.status for c in ready] == ["True"]
        # ...and the controller manager has lifted its not-ready taint: schedulable now.
        assert not node.spec.taints
        for name, count in spec.extended_resources().items():
            assert node.status.allocatable[name] == str(count)
            assert node.status.capacity[name] == str(count)


def test_pod_asking_for_mig_2g_20gb_runs_on_the_node_that_has_that_slice(
    admin_api: client.ApiClient, namespace: str, wait_for
):
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(namespace, gpu_pod("mig-2g", "nvidia.com/mig-2g.20gb"))
    pod = wait_for(
        "the MIG pod to run",
        lambda: (
            (p := core.read_namespaced_pod("mig-2g", namespace)).status.phase == "Running" and p
        ),
    )
    assert pod.spec.node_name == "gpu-a100-80-mig-0"
    assert pod.spec.scheduler_name == "kubeseer-scheduler"


def test_default_scheduler_profile_still_schedules_whole_gpu_pods(
    admin_api: client.ApiClient, namespace: str, wait_for
):
    core = client.CoreV1Api(admin_api)
    body = gpu_pod("whole", "nvidia.com/gpu", scheduler=config.DEFAULT_SCHEDULER)
    core.create_namespaced_pod(namespace, body)
    pod = wait_for(
        "the whole-GPU pod to run",
        lambda: (p := core.read_namespaced_pod("whole", namespace)).status.phase == "Running" and p,
    )
    # Only the H100 node and the A100-80GB node have whole GPUs left unpartitioned.
    assert pod.spec.node_name in {"gpu-h100-0", "gpu-a100-80-mig-0"}


def test_pod_asking_for_a_profile_no_node_has_stays_pending_with_the_scheduler_reason(
    admin_api: client.ApiClient, namespace: str, wait_for
):
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", "nvidia.com/mig-7g.80gb"))

    def unschedulable() -> client.V1PodCondition | None:
        pod = core.read_namespaced_pod("too-big", namespace)
        for condition in pod.status.conditions or ():
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return condition
        return None

    condition = wait_for("the scheduler to give up on the pod", unschedulable)
    assert condition.status == "False"
    assert "Insufficient nvidia.com/mig-7g.80gb" in condition.message
    events = wait_for(
        "a FailedScheduling event",
        lambda: [
            e
            for e in core.list_namespaced_event(namespace).items
            if e.reason == "FailedScheduling" and e.involved_object.name == "too-big"
        ],
    )
    assert "Insufficient nvidia.com/mig-7g.80gb" in events[0].message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_batch_job_runs_to_completion_and_its_pods_are_collected_with_it(
    admin_api: client.ApiClient, namespace: str, wait_for
):
    batch, core = client.BatchV1Api(admin_api), client.CoreV1Api(admin_api)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}},
                        }
                    ],
                }
            },
        },
    }
    batch.create_namespaced_job(namespace, job)
    done = wait_for(
        "the Job to complete",
        lambda: (
            (j := batch.read_namespaced_job_status("train", namespace)).status.succeeded == 2
            and any(c.type == "Complete" and c.status == "True" for c in j.status.conditions or ())
            and j
        ),
    )
    assert done.status.failed in (None, 0)
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=train").items
    assert {p.spec.node_name for p in pods} == {"gpu-a100-40-mig-0"}
    batch.delete_namespaced_job("train", namespace, propagation_policy="Background")
    wait_for(
        "garbage collection of the Job's pods",
        lambda: not core.list_namespaced_pod(namespace, label_selector="job-name=train").items,
    )


def test_deleting_a_namespace_removes_it(admin_api: client.ApiClient, wait_for):
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": "e2e-doomed"}})
    core.create_namespaced_config_map("e2e-doomed", {"metadata": {"name": "c"}, "data": {}})
    core.delete_namespace("e2e-doomed")

    def gone() -> bool:
        try:
            core.read_namespace("e2e-doomed")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for("the namespace to be deleted", gone)


def test_operator_kubeconfig_authenticates_as_the_operator_service_account(
    operator_api: client.ApiClient,
):
    review = client.AuthenticationV1Api(operator_api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    assert review.status.user_info.username == (
        f"system:serviceaccount:{config.OPERATOR_NAMESPACE}:{config.OPERATOR_SERVICE_ACCOUNT}"
    )
    assert "system:serviceaccounts" in review.status.user_info.groups


def test_operator_role_allows_what_it_grants(operator_api: client.ApiClient, namespace: str):
    core = client.CoreV1Api(operator_api)
    assert core.list_node().items
    core.list_namespaced_pod(namespace)
    # Each DLJob attempt is a Job (created suspended, then patched); the pods are the Job's.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "dry"},
        "spec": {"suspend": True, "template": gpu_pod("dry", "nvidia.com/mig-1g.10gb")},
    }
    del job["spec"]["template"]["apiVersion"], job["spec"]["template"]["kind"]
    client.BatchV1Api(operator_api).create_namespaced_job(namespace, job, dry_run="All")
    client.BatchV1Api(operator_api).list_namespaced_job(namespace)
    client.CustomObjectsApi(operator_api).list_cluster_custom_object(
        "kubeseer.io", "v1alpha1", "dljobs"
    )


@pytest.mark.parametrize(
    "forbidden",
    [
        pytest.param(
            lambda api, ns: client.CoreV1Api(api).delete_node("cpu-0", dry_run="All"),
            id="delete-node",
        ),
        pytest.param(
            lambda api, ns: client.CoreV1Api(api).list_namespaced_secret(ns), id="list-secrets"
        ),
        pytest.param(
            lambda api, ns: client.CoreV1Api(api).delete_namespace(ns, dry_run="All"),
            id="delete-namespace",
        ),
        pytest.param(
            lambda api, ns: client.AppsV1Api(api).list_namespaced_deployment(ns),
            id="list-deployments",
        ),
        pytest.param(
            lambda api, ns: client.RbacAuthorizationV1Api(api).list_cluster_role(), id="read-rbac"
        ),
        pytest.param(
            lambda api, ns: client.CoreV1Api(api).create_namespaced_pod(
                ns, gpu_pod("dry", "nvidia.com/mig-1g.10gb"), dry_run="All"
            ),
            id="create-pod",
        ),
    ],
)
def test_operator_role_denies_what_it_does_not_grant(
    operator_api: client.ApiClient, namespace: str, forbidden
):
    with pytest.raises(ApiException) as info:
        forbidden(operator_api, namespace)
    assert info.value.status == 403
    assert "system:serviceaccount:kubeseer-system:kubeseer-operator" in info.value.body
