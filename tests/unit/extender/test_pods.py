"""Reading the pod: effective GPU requests by Kubernetes' rule, and kubeseer's annotations."""

from __future__ import annotations

import pytest
from extender_fixtures import GIB, gpu_pod

from kubeseer.extender import pods
from kubeseer.operator import workload


def container(name: str, resources: dict[str, str], **extra: str) -> dict:
    return {"name": name, "resources": {"limits": resources}, **extra}


def test_a_pod_with_the_prediction_annotation_is_kubeseers():
    demand = pods.read(gpu_pod(predicted=12 * GIB))
    assert demand.kubeseer
    assert demand.predicted_memory_bytes == 12 * GIB
    assert demand.requests == {"nvidia.com/gpu": 1}
    assert demand.scheduler_name == "kubeseer-scheduler"
    assert demand.key == "default/job-0"
    assert demand.problem is None


def test_a_pod_without_kubeseer_annotations_is_left_alone():
    demand = pods.read(gpu_pod(predicted=None, annotations={"team": "vision"}))
    assert not demand.kubeseer
    assert demand.predicted_memory_bytes is None and demand.allowed_models is None


def test_scheduler_name_defaults_like_the_api_server():
    pod = gpu_pod()
    del pod["spec"]["schedulerName"]
    assert pods.read(pod).scheduler_name == "default-scheduler"


@pytest.mark.parametrize("value", ["", "12GiB", "-5", "0", "1.5e9"])
def test_an_unreadable_prediction_is_a_problem_not_a_guess(value):
    demand = pods.read(
        gpu_pod(predicted=None, annotations={workload.ANNOTATION_PREDICTED_MEMORY: value})
    )
    assert demand.kubeseer
    assert demand.predicted_memory_bytes is None
    assert demand.problem is not None
    assert workload.ANNOTATION_PREDICTED_MEMORY in demand.problem
    assert "positive whole number of bytes" in demand.problem


def test_allowed_products_accept_catalogue_keys_and_gfd_labels():
    note = {pods.ANNOTATION_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3, a100-80gb,H100-80GB-SXM"}
    demand = pods.read(gpu_pod(annotations=note))
    assert demand.allowed_models == ("A100-80GB", "H100-80GB-SXM")


def test_an_unknown_allowed_product_is_a_problem_naming_what_is_known():
    demand = pods.read(gpu_pod(annotations={pods.ANNOTATION_GPU_PRODUCTS: "Tesla-K80"}))
    assert demand.problem is not None
    assert "Tesla-K80" in demand.problem and "A100-40GB" in demand.problem


def test_an_empty_allowed_products_annotation_is_a_problem():
    demand = pods.read(gpu_pod(annotations={pods.ANNOTATION_GPU_PRODUCTS: " , "}))
    assert (
        demand.problem == f"annotation {pods.ANNOTATION_GPU_PRODUCTS} is empty; omit it for any GPU"
    )


def test_a_missing_request_is_the_limit_and_only_nvidia_resources_count():
    spec = {
        "containers": [
            container("a", {"nvidia.com/gpu": "1", "cpu": "4", "example.com/dongle": "1"}),
            {"name": "b", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "2"}}},
        ]
    }
    assert pods.gpu_requests(spec) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2}


def test_init_containers_count_at_their_peak_not_their_sum():
    spec = {
        "initContainers": [
            container("i1", {"nvidia.com/gpu": "2"}),
            container("i2", {"nvidia.com/gpu": "3"}),
        ],
        "containers": [
            container("a", {"nvidia.com/gpu": "1"}),
            container("b", {"nvidia.com/gpu": "1"}),
        ],
    }
    assert pods.gpu_requests(spec) == {"nvidia.com/gpu": 3}


def test_sidecars_add_to_the_app_containers_and_to_later_init_containers():
    spec = {
        "initContainers": [
            container("side", {"nvidia.com/gpu": "1"}, restartPolicy="Always"),
            container("init", {"nvidia.com/gpu": "2"}),
        ],
        "containers": [container("a", {"nvidia.com/gpu": "1"})],
    }
    # init runs beside the sidecar (1 + 2 = 3); afterwards app + sidecar hold 2.
    assert pods.gpu_requests(spec) == {"nvidia.com/gpu": 3}


def test_a_pod_without_gpus_requests_nothing():
    assert pods.gpu_requests({"containers": [container("a", {"cpu": "1"})]}) == {}
    assert pods.gpu_requests({}) == {}


@pytest.mark.parametrize("quantity", ["1.5", "500m", "one", True])
def test_a_fractional_gpu_quantity_is_refused(quantity):
    with pytest.raises(pods.QuantityError, match="not a whole number"):
        pods.gpu_requests({"containers": [container("a", {"nvidia.com/gpu": quantity})]})


def test_gpu_resources_are_the_device_plugins():
    assert pods.is_gpu_resource("nvidia.com/gpu")
    assert pods.is_gpu_resource("nvidia.com/mig-3g.40gb")
    assert not pods.is_gpu_resource("nvidia.com/gpumem")
    assert not pods.is_gpu_resource("amd.com/gpu")
