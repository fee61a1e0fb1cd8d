"""Pure workload builders: the attempt's Job, its names, labels, annotations, GPU and owner."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from kubeseer.operator import dljob, workload
from kubeseer.placement import policy

A100_80 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture
def build(
    dljob_spec: Any, prediction: Any, mig_placement: policy.Placement
) -> Callable[..., dict[str, Any]]:
    """`build(attempt=0, scheduler="", device=, **spec_overrides)`: the pod template of the Job
    of a DLJob `resnet` (`job=True`: the whole Job)."""

    def make(
        attempt: int = 0,
        scheduler: str = "",
        device: workload.Device = MIG,
        job: bool = False,
        **spec_overrides: object,
    ) -> dict[str, Any]:
        spec = dljob.parse_spec(dljob_spec(**spec_overrides))
        made = workload.build_job(
            spec,
            "resnet",
            "ml",
            "uid-1",
            prediction(),
            mig_placement,
            attempt,
            scheduler_name=scheduler,
            device=device,
        )
        return made if job else dict(made["spec"]["template"])

    return make


MIG = workload.ExtendedResource("nvidia.com/mig-1g.10gb")
CLAIM = workload.ClaimTemplate("resnet-0")


def test_pod_gets_the_chosen_resource_in_the_first_container_only(build: Any) -> None:
    pod = build()
    main, sidecar = pod["spec"]["containers"]
    assert main["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "resources" not in sidecar


def test_under_dra_the_pod_names_the_claim_template_and_the_first_container_uses_it(
    build: Any,
) -> None:
    spec = build(device=CLAIM)["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "resnet-0"}]
    main, sidecar = spec["containers"]
    assert main["resources"] == {"claims": [{"name": "gpu"}]}
    assert "resources" not in sidecar
    # The claim's CEL selects the product; DRA nodes need carry no GPU Feature Discovery label.
    assert "nodeSelector" not in spec


def test_the_job_is_named_by_dljob_and_attempt_owned_by_the_dljob_and_suspended(
    build: Any,
) -> None:
    job = build(attempt=2, job=True)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["spec"]["suspend"] is True
    pod = job["spec"]["template"]
    assert job["metadata"]["name"] == "resnet-2"
    assert job["metadata"]["namespace"] == "ml"
    assert job["metadata"]["labels"] == pod["metadata"]["labels"]
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubeseer.io/v1alpha1",
            "kind": "DLJob",
            "name": "resnet",
            "uid": "uid-1",
            "controller": True,
        }
    ]
    assert pod["metadata"]["labels"] == {
        "team": "vision",
        workload.LABEL_DLJOB: "resnet",
        workload.LABEL_ATTEMPT: "2",
    }


def test_building_twice_gives_the_same_manifest(build: Any) -> None:
    assert build(job=True) == build(job=True)


def test_pod_carries_the_prediction_in_annotations(build: Any) -> None:
    assert build(job=True)["metadata"]["annotations"] == build()["metadata"]["annotations"]
    annotations = build()["metadata"]["annotations"]
    assert annotations[workload.ANNOTATION_PREDICTED_MEMORY] == str(4 << 30)
    assert annotations[workload.ANNOTATION_PREDICTED_MEMORY_POINT] == str(3 << 30)
    assert annotations[workload.ANNOTATION_PREDICTED_SM_UTIL] == "20.0"
    assert annotations[workload.ANNOTATION_MODEL_DIGEST] == "ab" * 32
    assert annotations[workload.ANNOTATION_PROFILE] == "A100-80GB/1g.10gb"


def test_pod_is_pinned_to_the_product_it_was_sized_for(build: Any) -> None:
    assert build()["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100_80}


def test_scheduler_name_is_set_only_when_configured_and_not_overriding_the_user(
    dljob_spec: Any, build: Any
) -> None:
    assert "schedulerName" not in build()["spec"]
    assert build(scheduler="kubeseer-scheduler")["spec"]["schedulerName"] == "kubeseer-scheduler"
    template = copy.deepcopy(dljob_spec()["template"])
    template["spec"]["schedulerName"] = "custom"
    assert build(scheduler="kubeseer-scheduler", template=template)["spec"]["schedulerName"] == (
        "custom"
    )


def test_pod_does_not_restart_and_reports_its_log_tail_on_error(build: Any) -> None:
    spec = build()["spec"]
    assert spec["restartPolicy"] == "Never"
    assert {c["terminationMessagePolicy"] for c in spec["containers"]} == {"FallbackToLogsOnError"}


def test_the_dljob_template_is_not_modified(
    dljob_spec: Any, mig_placement: Any, prediction: Any
) -> None:
    spec = dljob.parse_spec(dljob_spec())
    before = copy.deepcopy(dict(spec.template))
    for device in (MIG, CLAIM):
        workload.build_job(
            spec, "r", "ns", "u", prediction(), mig_placement, 0, scheduler_name="s", device=device
        )
    assert dict(spec.template) == before


@pytest.mark.parametrize("replicas", [1, 4])
def test_replicas_run_at_once_in_a_job_that_never_retries_on_its_own(
    build: Any, replicas: int
) -> None:
    job = build(replicas=replicas, job=True)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == replicas
    assert job["spec"]["backoffLimit"] == 0
    pod_template = job["spec"]["template"]
    assert pod_template["metadata"]["labels"][workload.LABEL_DLJOB] == "resnet"
    assert pod_template["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-1g.10gb": "1"
    }


def test_a_restart_always_template_runs_never_a_job_may_not_restart_always(build: Any) -> None:
    template = {
        "spec": {
            "restartPolicy": "Always",
            "containers": [{"name": "main", "image": "example.org/infer:1"}],
        }
    }
    assert build(template=template)["spec"]["restartPolicy"] == "Never"


def test_the_extended_resource_is_given_to_the_suspended_job_by_a_patch_of_its_own(
    build: Any,
) -> None:
    """KEP-5440: the Job is created without its GPU, which a strategic merge patch of its first
    container (merged by name) adds while it is suspended."""
    job = build(job=True, template=with_resources({"limits": {"cpu": "1"}}))
    created = workload.without_extended_resource(job, MIG)
    assert created["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"}
    }
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "1",
        "nvidia.com/mig-1g.10gb": "1",
    }
    assert workload.catch_up_patch(created, job, resume=True) == {
        "spec": {
            "suspend": False,
            "template": {
                "spec": {
                    "containers": [
                        {"name": "main", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
                    ]
                }
            },
        }
    }
    assert workload.catch_up_patch(job, job, resume=True) == {"spec": {"suspend": False}}
    bare = workload.without_extended_resource(build(job=True), MIG)
    assert "limits" not in bare["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert workload.is_suspended(created) and not workload.is_suspended({"spec": {}})


def test_a_job_moved_to_another_kind_loses_its_old_gpu_and_selects_the_new_product(
    dljob_spec: Any, prediction: Any, mig_placement: policy.Placement
) -> None:
    """A move from a busy 1g.10gb on an A100 to a whole H100: the old resource is removed (a
    strategic merge patch would otherwise keep it beside the new one), the product selector and
    the annotations naming the device change, the user's own node selector stays."""
    spec = dljob.parse_spec(
        dljob_spec(
            template={
                "spec": {
                    "nodeSelector": {"zone": "a"},
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.org/infer:1",
                            "resources": {"limits": {"cpu": "1"}},
                        }
                    ],
                }
            }
        )
    )
    whole = policy.Placement(
        **{
            **mig_placement.__dict__,
            "resource": "nvidia.com/gpu",
            "profile": None,
            "gpu_product": "H100-80GB",
            "product_label": "NVIDIA-H100-80GB-HBM3",
        }
    )

    def job(placement: policy.Placement, device: workload.ExtendedResource) -> dict[str, Any]:
        return workload.build_job(
            spec,
            "resnet",
            "ml",
            "uid-1",
            prediction(),
            placement,
            0,
            scheduler_name="",
            device=device,
        )

    stored = job(mig_placement, MIG)
    wanted = job(whole, workload.ExtendedResource("nvidia.com/gpu"))
    patch = workload.catch_up_patch(stored, wanted, resume=True)
    pod = patch["spec"]["template"]["spec"]
    assert pod["containers"] == [
        {
            "name": "main",
            "resources": {"limits": {"nvidia.com/mig-1g.10gb": None, "nvidia.com/gpu": "1"}},
        }
    ]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    changed = {
        workload.ANNOTATION_PROFILE: "H100-80GB/whole",
        workload.ANNOTATION_GPU_PRODUCT: "H100-80GB",
    }
    assert patch["spec"]["template"]["metadata"]["annotations"] == changed
    assert patch["metadata"]["annotations"] == changed
    assert patch["spec"]["suspend"] is False and workload.changes_template(patch)
    assert not workload.changes_template(workload.catch_up_patch(wanted, wanted))
    assert workload.unstarted(stored)
    assert not workload.unstarted({**stored, "status": {"startTime": "2026-11-25T14:46:34Z"}})


@pytest.mark.parametrize("length", [63, 100, 253])
def test_long_dljob_names_give_distinct_valid_workload_names(length: int) -> None:
    base = "a" * length
    names = {workload.workload_name(base, 0), workload.workload_name(base[:-1] + "b", 0)}
    assert len(names) == 2
    assert all(len(n) <= 63 and n.endswith("-0") for n in names)
    assert workload.workload_name(base, 1) != workload.workload_name(base, 0)


def test_whole_gpu_profile_label(mig_placement: Any) -> None:
    whole = policy.Placement(
        **{**mig_placement.__dict__, "profile": None, "gpu_product": "H100-NVL"}
    )
    assert workload.profile_label(whole) == "H100-NVL/whole"


def with_resources(resources: dict[str, Any], sidecar: dict[str, Any] | None = None) -> Any:
    containers: list[dict[str, Any]] = [
        {"name": "main", "image": "example.org/infer:1", "resources": resources}
    ]
    if sidecar is not None:
        containers.append({"name": "sidecar", "image": "example.org/log:1", "resources": sidecar})
    return {"spec": {"containers": containers}}


def test_integer_and_fractional_quantities_become_the_strings_the_api_server_stores(
    build: Any,
) -> None:
    """Issue 17: `cpu: 2` in plain YAML wedged the DLJob (the client refused the integer)."""
    pod = build(
        template=with_resources(
            {"limits": {"cpu": 2, "memory": "4Gi"}, "requests": {"cpu": 0.5, "memory": 1e9}}
        )
    )
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/mig-1g.10gb": "1"}
    assert resources["requests"] == {"cpu": "0.5", "memory": "1000000000"}


def test_the_templates_own_gpu_requests_are_replaced_by_the_chosen_resource_and_named(
    build: Any, dljob_spec: Any
) -> None:
    """Issue 17: the user's `nvidia.com/gpu: 2` stayed beside the chosen slice, silently."""
    template = with_resources(
        {"limits": {"nvidia.com/gpu": 2, "cpu": "1"}},
        sidecar={"requests": {"nvidia.com/mig-3g.40gb": "1"}, "limits": {"memory": "1Gi"}},
    )
    pod = build(template=template)
    main, sidecar = pod["spec"]["containers"]
    assert main["resources"]["limits"] == {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}
    assert sidecar["resources"] == {"requests": {}, "limits": {"memory": "1Gi"}}
    spec = dljob.parse_spec(dljob_spec(template=template))
    assert workload.gpu_requests_replaced(spec.template) == (
        "container main limits nvidia.com/gpu=2",
        "container sidecar requests nvidia.com/mig-3g.40gb=1",
    )


def test_values_the_api_server_would_refuse_are_left_for_it_to_refuse(build: Any) -> None:
    """An env value must be a string; kubeseer does not guess, the API server says why."""
    template = with_resources({})
    template["spec"]["containers"][0]["env"] = [{"name": "WORKERS", "value": 5}]
    pod = build(template=template)
    assert pod["spec"]["containers"][0]["env"] == [{"name": "WORKERS", "value": 5}]


@pytest.mark.parametrize("length", [63, 64, 200, 253])
def test_every_dljob_name_the_api_server_accepts_gives_valid_labels_and_names(
    length: int, dljob_spec: Any, prediction: Any, mig_placement: policy.Placement
) -> None:
    """Issue 17: names of 64-253 characters failed with InvalidTemplate (label values <= 63)."""
    name = ("a." * length)[: length - 1] + "z"
    spec = dljob.parse_spec(dljob_spec())
    job = workload.build_job(
        spec, name, "ml", "uid", prediction(), mig_placement, 3, scheduler_name="", device=MIG
    )
    label = job["metadata"]["labels"][workload.LABEL_DLJOB]
    assert len(label) <= 63 and label[0].isalnum() and label[-1].isalnum()
    assert len(job["metadata"]["name"]) <= 63
    assert label == workload.label_value(name)
    assert (label == name) is (length <= 63)
    assert workload.owning_dljob(job) == name


def test_long_names_that_share_a_start_get_different_labels() -> None:
    first, second = "x" * 100 + "-first", "x" * 100 + "-second"
    assert workload.label_value(first) != workload.label_value(second)
    assert workload.workload_name(first, 0) != workload.workload_name(second, 0)
