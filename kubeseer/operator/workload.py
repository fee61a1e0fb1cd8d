"""Pure builders of the workload a DLJob runs as: one batch/v1 Job per attempt.

Nothing here talks to the API server. Names are a function of the DLJob's name and the attempt
number only, so an operator that restarts half-way through creating a workload computes the same
name again and the API server's AlreadyExists tells it the work was done. A DLJob's name may be
253 characters, a label value 63: where a name goes into a label it is shortened the same way.

The Job is created suspended, given its GPU, then resumed (`launch`), so that a queueing system
that admits suspended Jobs (Kueue) can sit in front of kubeseer. Its GPU is one of two
`Device`s: an extended resource (`nvidia.com/mig-1g.10gb`), which the Job receives while it is
suspended (`catch_up_patch`: KEP-5440 lets a suspended Job's pod resources change), or a
ResourceClaimTemplate of Dynamic Resource Allocation, which the pod template names from the
start (a Job's `resourceClaims` never change).

The user's template goes in as written, with two exceptions that keep the GPU kubeseer chose
the only one the pod asks for: resource quantities become the strings the API server stores
(`cpu: 2` is the quantity "2"), and GPU requests of the template (`nvidia.com/gpu`,
`nvidia.com/mig-*`) are replaced by the chosen device; `gpu_requests_replaced` names them so
that the DLJob can say so.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from kubeseer.operator import dljob
from kubeseer.placement import catalogue, inventory, policy
from kubeseer.prediction import Prediction

LABEL_DLJOB = "kubeseer.io/dljob"
"""Label on every workload object: the owning DLJob's name, shortened past 63 characters
(`label_value`); the full name is the workload's controlling owner reference."""
LABEL_ATTEMPT = "kubeseer.io/attempt"
"""Label on every workload object: the attempt (0 first, +1 per OOM escalation)."""
ANNOTATION_PREDICTED_MEMORY = "kubeseer.io/predicted-memory-bytes"
"""Calibrated upper bound of peak GPU memory, bytes (what the placement had to hold)."""
ANNOTATION_PREDICTED_MEMORY_POINT = "kubeseer.io/predicted-memory-point-bytes"
"""Point prediction of peak GPU memory, bytes."""
ANNOTATION_PREDICTED_SM_UTIL = "kubeseer.io/predicted-sm-util-percent"
"""Point prediction of SM utilisation on a whole GPU, percent."""
ANNOTATION_PREDICTED_STEP_TIME = "kubeseer.io/predicted-step-time-seconds"
"""Point prediction of one step's time on a whole GPU, seconds."""
ANNOTATION_MODEL_DIGEST = "kubeseer.io/model-digest"
"""sha256 of the model the prediction was made for."""
ANNOTATION_PREDICTOR_VERSION = "kubeseer.io/predictor-version"
"""Version of the predictor (checkpoint) that made the prediction."""
ANNOTATION_PROFILE = "kubeseer.io/profile"
"""Catalogue profile the workload was placed on (`A100-80GB/1g.10gb`, `H100-NVL/whole`)."""
ANNOTATION_GPU_PRODUCT = "kubeseer.io/gpu-product"
"""GPU product (catalogue key) the workload was placed on."""
ANNOTATION_GPU_PRODUCTS = "kubeseer.io/gpu-products"
"""On pods whose device kind the scheduler extender chooses: the DLJob's allowed GPU products
(`spec.placement.gpuProducts`, catalogue keys, comma-separated), which its filter enforces."""
ANNOTATION_DLJOB_NAME = "kubeseer.io/dljob-name"
"""On ResourceClaims made for a DLJob's pods: the DLJob's full name (its label may be short)."""

CLAIM_NAME = "gpu"
"""The pod's name for its ResourceClaim (`spec.resourceClaims[].name`, `resources.claims[]`)."""

_MAX_LABEL_VALUE = 63  # also the longest workload name: a Job's name becomes a label on its pods
_GPU_RESOURCE = "nvidia.com/gpu"
_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def profile_label(placement: policy.Placement) -> str:
    """`A100-80GB/1g.10gb`, or `H100-NVL/whole` for a GPU without MIG."""
    return f"{placement.gpu_product}/{placement.profile or 'whole'}"


class OwnerReference(TypedDict):
    """`metadata.ownerReferences[]` as the API expects it."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


def _shortened(name: str, suffix: str) -> str:
    """`name + suffix` within 63 characters: a long name keeps its start and gains a stable hash
    of the whole (two long names that share a start still differ)."""
    if len(name) + len(suffix) <= _MAX_LABEL_VALUE:
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    keep = _MAX_LABEL_VALUE - len(suffix) - len(digest) - 1
    return f"{name[:keep].rstrip('-.')}-{digest}{suffix}"


def workload_name(dljob_name: str, attempt: int) -> str:
    """`<dljob>-<attempt>`, shortened with a stable hash when the DLJob's name is long."""
    return _shortened(dljob_name, f"-{attempt}")


def label_value(dljob_name: str) -> str:
    """The DLJob's name as a label value: itself up to 63 characters, else shortened."""
    return _shortened(dljob_name, "")


def owning_dljob(body: Mapping[str, Any]) -> str | None:
    """The name of the DLJob that controls a workload object, from its owner references."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("kind") == dljob.KIND and ref.get("apiVersion") == dljob.API_VERSION:
            return str(ref.get("name"))
    return None


def is_gpu_resource(name: str) -> bool:
    """`nvidia.com/gpu` or a MIG profile resource."""
    return name == _GPU_RESOURCE or name.startswith(_MIG_RESOURCE_PREFIX)


def gpu_requests_replaced(template: Mapping[str, Any]) -> tuple[str, ...]:
    """The template's own GPU requests, which the workload replaces with the chosen resource
    (`container main limits nvidia.com/gpu=2`)."""
    found = []
    for container in _containers(template.get("spec") or {}):
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (resources.get(section) or {}).items():
                if is_gpu_resource(str(name)):
                    found.append(f"container {container.get('name')} {section} {name}={value}")
    return tuple(found)


def _containers(pod_spec: Mapping[str, Any]) -> list[Any]:
    return [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]


def quantity(value: object) -> object:
    """A resource quantity as the API server stores it: numbers become their decimal string
    (`2` -> "2", `0.5` -> "0.5", which it reads as 500m); anything else is left for the API
    server to judge."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return value


def _normalise_resources(pod_spec: dict[str, Any]) -> None:
    """Quantities as strings, and no GPU but the one kubeseer adds."""
    for container in _containers(pod_spec):
        if not isinstance(container, dict):
            continue
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for section in ("limits", "requests"):
            values = resources.get(section)
            if isinstance(values, dict):
                resources[section] = {
                    str(k): quantity(v) for k, v in values.items() if not is_gpu_resource(str(k))
                }
    overhead = pod_spec.get("overhead")
    if isinstance(overhead, dict):
        pod_spec["overhead"] = {str(k): quantity(v) for k, v in overhead.items()}


def owner_reference(dljob_name: str, uid: str) -> OwnerReference:
    """The DLJob as the controlling owner, so deleting it garbage-collects its workloads."""
    return {
        "apiVersion": dljob.API_VERSION,
        "kind": dljob.KIND,
        "name": dljob_name,
        "uid": uid,
        "controller": True,
    }


def build_annotations(prediction: Prediction, placement: policy.Placement) -> dict[str, str]:
    """The prediction and placement as pod annotations, for the extender and the profiler."""
    return {
        ANNOTATION_PREDICTED_MEMORY: str(round(prediction.memory_bytes.upper)),
        ANNOTATION_PREDICTED_MEMORY_POINT: str(round(prediction.memory_bytes.point)),
        ANNOTATION_PREDICTED_SM_UTIL: f"{prediction.sm_util_percent.point:.1f}",
        ANNOTATION_PREDICTED_STEP_TIME: f"{prediction.step_time_s.point:.6g}",
        ANNOTATION_MODEL_DIGEST: prediction.model_digest,
        ANNOTATION_PREDICTOR_VERSION: prediction.predictor_version,
        ANNOTATION_PROFILE: profile_label(placement),
        ANNOTATION_GPU_PRODUCT: placement.gpu_product,
    }


@dataclass(frozen=True)
class ExtendedResource:
    """One unit of a device plugin's extended resource (`nvidia.com/mig-1g.10gb`)."""

    name: str

    def describe(self) -> str:
        """How an event names it."""
        return f"1 {self.name}"


@dataclass(frozen=True)
class ClaimTemplate:
    """A ResourceClaim made for each pod from the named ResourceClaimTemplate (DRA)."""

    name: str

    def describe(self) -> str:
        """How an event names it."""
        return f"a claim from ResourceClaimTemplate {self.name}"


Device = ExtendedResource | ClaimTemplate
"""How the pods of a workload get their GPU."""


def ladder_kinds(plan_status: Mapping[str, Any], placement: policy.Placement) -> tuple[str, ...]:
    """Product labels of every kind on a plan's ladder that a pod requesting the placement's
    resource can be served by, the placement's own among them.

    `plan_status` is `status.plan` (`plan.to_status`), so an operator that restarts finds the
    same kinds in what it recorded. Every such kind holds the job's need within its slowdown
    limit, so a pod admitted to all of them is as memory-safe as one pinned to the first: under
    the device plugin's single strategy and for whole GPUs every kind is `nvidia.com/gpu` and
    has a label of its own (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`, `NVIDIA-H100-80GB-HBM3`); under
    the mixed strategy the resource names the profile and the label the product.
    """
    labels = {placement.product_label}
    for row in plan_status.get("rows") or ():
        if row.get("fits") and row.get("resource") == placement.resource:
            labels.add(str(row.get("productLabel")))
    return tuple(sorted(labels))


def admit_products(pod_spec: dict[str, Any], product_labels: Sequence[str]) -> None:
    """Require (node affinity) a node whose `nvidia.com/gpu.product` is one of `product_labels`.

    The expression is ANDed into every term of the pod's own required node affinity (terms are
    ORed, so each must carry it), or is the one term when there is none.
    """
    expression = {
        "key": inventory.PRODUCT_LABEL,
        "operator": "In",
        "values": list(product_labels),
    }
    node_affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression))
    required["nodeSelectorTerms"] = terms


def build_pod_template(
    spec: dljob.DLJobSpec,
    dljob_name: str,
    prediction: Prediction,
    placement: policy.Placement,
    attempt: int,
    *,
    scheduler_name: str,
    device: Device,
    kinds: Sequence[str] = (),
) -> dict[str, Any]:
    """The user's pod template with kubeseer's labels, annotations and GPU added.

    An extended resource goes to the first container's limits (it needs no request: the API
    server copies limits into requests) and pins the pods to the product it was sized for, or,
    given `kinds` (`ladder_kinds`, when the scheduler extender chooses the kind), admits them to
    any of those products and names the DLJob's allowed products for the extender; a
    claim is named by the pod and used by the first container, and selects the product itself.
    GPU requests of the template are dropped. A template that already names a scheduler keeps
    it. Containers report their log tail as termination message unless told otherwise, so that
    a CUDA out-of-memory error is visible to OOM escalation.
    """
    template: dict[str, Any] = copy.deepcopy(dict(spec.template))
    metadata = template.setdefault("metadata", {})
    metadata.setdefault("labels", {}).update(
        {LABEL_DLJOB: label_value(dljob_name), LABEL_ATTEMPT: str(attempt)}
    )
    metadata.setdefault("annotations", {}).update(build_annotations(prediction, placement))
    pod_spec = template["spec"]
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        pod_spec["restartPolicy"] = "Never"  # a Job's pods may not restart Always
    if scheduler_name:
        pod_spec.setdefault("schedulerName", scheduler_name)
    for c in pod_spec["containers"]:
        c.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    _normalise_resources(pod_spec)
    resources = pod_spec["containers"][0].setdefault("resources", {})
    if isinstance(device, ExtendedResource):
        if kinds:
            admit_products(pod_spec, kinds)
            allowed = sorted(
                {catalogue.resolve_product(p).key for p in spec.placement.gpu_products}
            )
            if allowed:
                metadata["annotations"][ANNOTATION_GPU_PRODUCTS] = ",".join(allowed)
        else:
            pod_spec.setdefault("nodeSelector", {}).update(placement.node_selector)
        resources.setdefault("limits", {})[device.name] = "1"
    else:
        pod_spec.setdefault("resourceClaims", []).append(
            {"name": CLAIM_NAME, "resourceClaimTemplateName": device.name}
        )
        resources.setdefault("claims", []).append({"name": CLAIM_NAME})
    return template


def build_job(
    spec: dljob.DLJobSpec,
    dljob_name: str,
    namespace: str,
    uid: str,
    prediction: Prediction,
    placement: policy.Placement,
    attempt: int,
    *,
    scheduler_name: str,
    device: Device,
    kinds: Sequence[str] = (),
) -> dict[str, Any]:
    """The batch/v1 Job of one attempt, suspended: `replicas` pods in parallel, each with the
    device (`kinds`: see `build_pod_template`).

    `backoffLimit: 0`: kubeseer, not the Job controller, decides what a failure means; an OOM
    becomes a new attempt on a larger device, a pod deleted before it finished a new attempt,
    anything else fails the DLJob.
    """
    template = build_pod_template(
        spec,
        dljob_name,
        prediction,
        placement,
        attempt,
        scheduler_name=scheduler_name,
        device=device,
        kinds=kinds,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": workload_name(dljob_name, attempt),
            "namespace": namespace,
            "labels": dict(template["metadata"]["labels"]),
            "annotations": dict(template["metadata"]["annotations"]),
            "ownerReferences": [owner_reference(dljob_name, uid)],
        },
        "spec": {
            "suspend": True,
            "parallelism": spec.replicas,
            "completions": spec.replicas,
            "backoffLimit": 0,
            "template": template,
        },
    }


def without_extended_resource(job: Mapping[str, Any], device: ExtendedResource) -> dict[str, Any]:
    """The Job as it is created, before it is given its extended resource: the first
    container's limits without it (an empty `limits` is dropped)."""
    made: dict[str, Any] = copy.deepcopy(dict(job))
    resources = made["spec"]["template"]["spec"]["containers"][0]["resources"]
    limits = resources["limits"]
    del limits[device.name]
    if not limits:
        del resources["limits"]
    return made


def catch_up_patch(
    stored: Mapping[str, Any], wanted: Mapping[str, Any], *, resume: bool = False
) -> dict[str, Any]:
    """The strategic merge patch that makes a suspended Job's pods what `wanted` says, and with
    `resume` also lets it run.

    Only what kubeseer decides can differ: the first container's GPU (an extended resource the
    Job was created without, or the one of a device it is moving from, removed), the pods'
    node selection (`nodeSelector`, node affinity) and the annotations that name the device.
    Containers merge by name; a key set to None is removed. The apiserver accepts the resource
    change while the Job is suspended (KEP-5440) and the rest while it is suspended and has not
    started (`unstarted`).
    """
    stored_template = stored["spec"]["template"]
    wanted_template = wanted["spec"]["template"]
    stored_pod, wanted_pod = stored_template["spec"], wanted_template["spec"]
    first = wanted_pod["containers"][0]
    limits = _changes(_gpu_limits(stored_pod["containers"][0]), _gpu_limits(first))
    pod: dict[str, Any] = {}
    if limits:
        pod["containers"] = [{"name": first["name"], "resources": {"limits": limits}}]
    selector = _changes(stored_pod.get("nodeSelector") or {}, wanted_pod.get("nodeSelector") or {})
    if selector:
        pod["nodeSelector"] = selector
    if stored_pod.get("affinity") != wanted_pod.get("affinity"):
        pod["affinity"] = copy.deepcopy(wanted_pod.get("affinity"))
    template: dict[str, Any] = {"spec": pod} if pod else {}
    pod_annotations = _annotation_changes(stored_template, wanted_template)
    if pod_annotations:
        template["metadata"] = {"annotations": pod_annotations}
    spec: dict[str, Any] = {"template": template} if template else {}
    if resume:
        spec["suspend"] = False
    patch: dict[str, Any] = {"spec": spec} if spec else {}
    job_annotations = _annotation_changes(stored, wanted)
    if job_annotations:
        patch["metadata"] = {"annotations": job_annotations}
    return patch


def changes_template(patch: Mapping[str, Any]) -> bool:
    """Whether a `catch_up_patch` changes the pods (not only the Job's suspension)."""
    return bool((patch.get("spec") or {}).get("template"))


def unstarted(job: Mapping[str, Any]) -> bool:
    """Whether a Job (as stored) has no start time: never resumed, or reset by the Job
    controller after a suspension. Only then may its pods' node selection change."""
    return not (job.get("status") or {}).get("startTime")


def _gpu_limits(container: Mapping[str, Any]) -> dict[str, Any]:
    limits = (container.get("resources") or {}).get("limits") or {}
    return {str(k): v for k, v in limits.items() if is_gpu_resource(str(k))}


def _annotation_changes(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    return _changes(
        (stored.get("metadata") or {}).get("annotations") or {},
        (wanted.get("metadata") or {}).get("annotations") or {},
    )


def _changes(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch from one string map to another: changed and new keys, None for keys
    `wanted` lacks."""
    patch: dict[str, Any] = {k: v for k, v in wanted.items() if stored.get(k) != v}
    patch.update({k: None for k in stored if k not in wanted})
    return patch


RESUME_PATCH: Mapping[str, Any] = {"spec": {"suspend": False}}
"""The merge patch that lets a suspended Job create its pods."""


def is_suspended(job: Mapping[str, Any]) -> bool:
    """Whether a Job (as stored) is suspended."""
    return bool((job.get("spec") or {}).get("suspend"))
