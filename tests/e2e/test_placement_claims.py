"""A plan's ladder as a ResourceClaimTemplate, allocated by the real kube-scheduler.

The devices are published the way NVIDIA's DRA driver publishes them (a ResourceSlice of the
driver `gpu.nvidia.com`: `productName`, `type` and `profile` attributes, usable `memory` and
`multiprocessors` capacities) on one KWOK node; that slice is the only fake. Everything else is
the real API server (which compiles the CEL selectors) and scheduler (which evaluates them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kubeseer.placement import catalogue, claims, plan
from kubeseer.prediction import Estimate, Mode, Precision, Prediction

pytestmark = pytest.mark.e2e

GROUP, VERSION = "resource.k8s.io", "v1"
NODE = "cpu-0"
H100 = catalogue.model_by_key("H100-80GB-SXM")
H100_NAME = "NVIDIA H100 80GB HBM3"


def _device(name: str, kind: str, memory: str, sms: int, profile: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": kind},
        "productName": {"string": H100_NAME},
        "uuid": {"string": f"{kind.upper()}-{name}"},
    }
    if profile is not None:
        attributes["profile"] = {"string": profile}
    return {
        "name": name,
        "attributes": attributes,
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": str(sms)}},
    }


# One H100 carved into 1g.10gb + 1g.20gb + 3g.40gb, and one whole H100, as static MIG.
DEVICES = [
    _device("gpu-0-mig-1g10", "mig", "9984Mi", 16, "1g.10gb"),
    _device("gpu-0-mig-1g20", "mig", "20096Mi", 26, "1g.20gb"),
    _device("gpu-0-mig-3g40", "mig", "40448Mi", 60, "3g.40gb"),
    _device("gpu-1", "gpu", "81559Mi", 132, None),
]


@pytest.fixture
def published(admin_api: client.ApiClient) -> Iterator[str]:
    """The driver's DeviceClasses (kept: other tests may use them) and this test's slice."""
    api = client.CustomObjectsApi(admin_api)
    for name, kind in ((claims.GPU_DEVICE_CLASS, "gpu"), (claims.MIG_DEVICE_CLASS, "mig")):
        expression = (
            f"device.driver == '{claims.DRIVER}' && "
            f"device.attributes['{claims.DRIVER}'].type == '{kind}'"
        )
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        try:
            api.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
        except ApiException as e:
            if e.status != 409:
                raise
    name = f"placement-{uuid.uuid4().hex[:8]}"
    slice_body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": claims.DRIVER,
            "nodeName": NODE,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": DEVICES,
        },
    }
    api.create_cluster_custom_object(GROUP, VERSION, "resourceslices", slice_body)
    yield name
    api.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)


def _prediction(upper_gib: float) -> Prediction:
    """What the shipped checkpoint serves: no SM utilisation learned, so memory decides."""
    upper = upper_gib * catalogue.GIB
    return Prediction(
        mode=Mode.TRAIN,
        batch_size=32,
        precision=Precision.FP32,
        memory_bytes=Estimate(upper * 0.9, upper),
        sm_util_percent=Estimate(100.0, 100.0),
        step_time_s=Estimate(0.1, 0.12),
        coverage=0.95,
        model_digest="0" * 64,
        predictor_version="e2e",
        label_device="AMD EPYC",
        unlearned=("sm_util_percent",),
    )


def _pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


def test_the_ladder_is_allocated_cheapest_free_rung_first_by_the_real_scheduler(
    admin_api: client.ApiClient, namespace: str, published: str, wait_for
):
    ladder = plan.build(_prediction(15), plan.from_catalogue([H100]), max_slowdown=2.0)
    # 15 GiB: 1g.10gb (9.75) is too small; 1g.20gb, 2g.20gb, 3g.40gb, ... whole, in cost order.
    assert [r.candidate.profile.name for r in ladder.ladder][:3] == [
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
    ]
    template = claims.build_claim_template(ladder, "ladder", namespace)
    api = client.CustomObjectsApi(admin_api)
    core = client.CoreV1Api(admin_api)
    # The API server compiles every CEL selector on create: a typo would be a 422 here.
    api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaimtemplates", dict(template)
    )
    allocated = []
    for i in range(3):
        core.create_namespaced_pod(namespace, _pod(f"job-{i}", "ladder"))
        pod = wait_for(
            f"job-{i} to be scheduled",
            lambda i=i: (p := core.read_namespaced_pod(f"job-{i}", namespace)).spec.node_name and p,
        )
        assert pod.spec.node_name == NODE
        claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
        claim = api.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", claim_name
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        allocated.append((result["device"], result["request"]))
    assert allocated == [
        ("gpu-0-mig-1g20", "gpu/r1-h100-80gb-sxm-1g-20gb"),
        ("gpu-0-mig-3g40", "gpu/r3-h100-80gb-sxm-3g-40gb"),
        ("gpu-1", "gpu/r6-h100-80gb-sxm-whole"),
    ]
    # Nothing left that holds 15 GiB (the free 1g.10gb does not): the fourth waits.
    core.create_namespaced_pod(namespace, _pod("job-3", "ladder"))
    waiting = wait_for(
        "job-3 to be found unschedulable",
        lambda: any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for c in core.read_namespaced_pod("job-3", namespace).status.conditions or ()
        ),
    )
    assert waiting
    assert core.read_namespaced_pod("job-3", namespace).spec.node_name is None
