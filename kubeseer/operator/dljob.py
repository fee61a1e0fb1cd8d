"""The DLJob resource as typed values: its spec, its phases, its condition types and reasons.

The API server already validates a DLJob against the CRD schema; `parse_spec` checks again
because the operator must not trust that the installed CRD is the one it was built with, and
its errors name the field so that they read well in a status condition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from kubeseer import digests
from kubeseer.placement import catalogue, policy
from kubeseer.prediction import Attention, Mode, Precision

GROUP = "kubeseer.io"
VERSION = "v1alpha1"
PLURAL = "dljobs"
KIND = "DLJob"
API_VERSION = f"{GROUP}/{VERSION}"


@dataclass(frozen=True)
class DLJobRef:
    """Which DLJob: enough to patch it, own its workloads and attach events to it."""

    namespace: str
    name: str
    uid: str


class Phase(StrEnum):
    """Where a DLJob is in its life; the reconcile only ever moves it forward (an attempt that
    ends in an OOM or a deleted pod takes it back to Placed for the next attempt)."""

    PENDING = "Pending"
    FETCHING = "Fetching"
    PREDICTING = "Predicting"
    PLACED = "Placed"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        """Nothing happens to a DLJob after a terminal phase."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    """Condition types in `status.conditions`, each True once its step succeeded."""

    ACCEPTED = "Accepted"
    MODEL_READY = "ModelReady"
    PREDICTED = "Predicted"
    PLACED = "Placed"
    WORKLOAD_READY = "WorkloadReady"


class Reason(StrEnum):
    """Machine-readable reasons of conditions and events."""

    ACCEPTED = "Accepted"
    FETCHED = "Fetched"
    PREDICTED = "Predicted"
    PLACED = "Placed"
    CREATED = "WorkloadCreated"
    ALLOCATED = "DeviceAllocated"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    ESCALATED = "OOMEscalated"
    OOM = "OOMKilled"
    WORKLOAD_FAILED = "WorkloadCreateFailed"
    INVALID_TEMPLATE = "InvalidTemplate"
    QUOTA_EXCEEDED = "QuotaExceeded"
    PODS_REFUSED = "PodsRefused"
    PODS_NOT_CREATED = "PodsNotCreated"
    PODS_CREATED = "PodsCreated"
    MOVED = "Moved"
    WORKLOAD_DELETED = "WorkloadDeleted"
    GPU_LIMIT_REPLACED = "GPULimitReplaced"
    LAUNCH_LIMIT = "KernelLaunchLimit"
    INVALID_SPEC = "InvalidSpec"
    MODEL_UNREACHABLE = "ModelUnreachable"
    MODEL_REFUSED = "ModelRefused"
    MODEL_TOO_LARGE = "ModelTooLarge"
    DIGEST_MISMATCH = "DigestMismatch"
    MODEL_NOT_FOUND = "ModelNotFound"
    MODEL_SOURCE_INVALID = "ModelSourceInvalid"
    MODEL_TOO_SLOW = "ModelTooSlow"
    CORRUPT_MODEL = "CorruptModel"
    UNSUPPORTED_MODEL = "UnsupportedModel"
    INVALID_INPUTS = "InvalidInputs"
    COVERAGE_UNAVAILABLE = "CoverageUnavailable"
    PREDICTION_FAILED = "PredictionFailed"
    NO_FIT = "NoFit"
    GPU_PRODUCT_NOT_IN_CLUSTER = "GPUProductNotInCluster"
    NO_MATCHING_NODE = "NoMatchingGPUNode"
    TOO_MANY_REPLICAS = "ReplicasExceedCapacity"
    OOM_RETRIES_EXHAUSTED = "OOMRetriesExhausted"
    POD_FAILED = "PodFailed"


class InvalidSpecError(ValueError):
    """The DLJob's spec cannot be acted on; the message names the field."""


@dataclass(frozen=True)
class ConfigMapRef:
    """A model stored in a ConfigMap of the DLJob's namespace."""

    name: str
    key: str


@dataclass(frozen=True)
class ModelSource:
    """Exactly one of `url` and `config_map`, and the digest the bytes must have."""

    url: str | None
    config_map: ConfigMapRef | None
    sha256: str | None

    def describe(self) -> str:
        """A short name for the printer column: the URL's last segment or the ConfigMap key."""
        if self.config_map is not None:
            return f"{self.config_map.name}/{self.config_map.key}"
        assert self.url is not None
        tail = self.url.rstrip("/").rsplit("/", 1)[-1]
        return tail.split("?", 1)[0] or self.url


@dataclass(frozen=True)
class DLJobSpec:
    """A validated DLJob spec. `template` stays a plain mapping: it is the user's pod template
    and goes into the workload as written, plus the GPU resource."""

    model: ModelSource
    mode: Mode
    batch_size: int
    inputs: tuple[tuple[str, int], ...]
    precision: Precision
    replicas: int
    template: Mapping[str, Any]
    placement: policy.Request
    attention: Attention = Attention.AUTO


_E = TypeVar("_E", bound=StrEnum)
_URL = re.compile(r"^(https?|s3)://\S+$")


def parse_spec(spec: Mapping[str, Any]) -> DLJobSpec:
    """Validate a DLJob's `spec` and apply the defaults the CRD would have applied."""
    return DLJobSpec(
        model=_model(_mapping(spec, "model", required=True)),
        mode=_enum(Mode, spec.get("mode"), "mode"),
        batch_size=_int(spec.get("batchSize"), "batchSize", minimum=1),
        inputs=_inputs(_mapping(spec, "inputs", required=False)),
        precision=_enum(Precision, spec.get("precision", "fp32"), "precision"),
        replicas=_int(spec.get("replicas", 1), "replicas", minimum=1),
        template=_template(_mapping(spec, "template", required=True)),
        placement=_placement(_mapping(spec, "placement", required=False), spec),
        attention=_enum(Attention, spec.get("attention", "auto"), "attention"),
    )


def _mapping(parent: Mapping[str, Any], key: str, *, required: bool) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpecError(f"spec.{key} must be an object")
    return value


def _int(value: object, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpecError(f"spec.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidSpecError(f"spec.{name} must be at least {minimum}, got {value}")
    return value


def _enum(cls: type[_E], value: object, name: str) -> _E:
    try:
        return cls(str(value))
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise InvalidSpecError(f"spec.{name} must be one of {allowed}, got {value!r}") from None


def _model(model: Mapping[str, Any]) -> ModelSource:
    url = model.get("url")
    ref = model.get("configMapRef")
    if (url is None) == (ref is None):
        raise InvalidSpecError(
            "exactly one of spec.model.url and spec.model.configMapRef is needed"
        )
    sha256 = model.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and digests.is_sha256(sha256)):
        raise InvalidSpecError("spec.model.sha256 must be 64 lower-case hex digits")
    if url is not None:
        if not (isinstance(url, str) and _URL.match(url)):
            raise InvalidSpecError(f"spec.model.url must be http(s):// or s3://, got {url!r}")
        return ModelSource(url=url, config_map=None, sha256=sha256)
    if not isinstance(ref, Mapping):
        raise InvalidSpecError("spec.model.configMapRef must be an object")
    name, key = ref.get("name"), ref.get("key")
    if not (isinstance(name, str) and name and isinstance(key, str) and key):
        raise InvalidSpecError("spec.model.configMapRef needs a name and a key")
    return ModelSource(url=None, config_map=ConfigMapRef(name=name, key=key), sha256=sha256)


def _inputs(inputs: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((str(k), _int(v, f"inputs.{k}", minimum=1)) for k, v in inputs.items()))


def _template(template: Mapping[str, Any]) -> Mapping[str, Any]:
    pod_spec = template.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        raise InvalidSpecError("spec.template.spec.containers must list at least one container")
    for i, c in enumerate(containers):
        if not (isinstance(c, Mapping) and c.get("name") and c.get("image")):
            raise InvalidSpecError(f"spec.template.spec.containers[{i}] needs a name and an image")
    return template


def _placement(placement: Mapping[str, Any], spec: Mapping[str, Any]) -> policy.Request:
    """`spec.placement` with what else of the spec constrains the device: the replicas that
    run at once and the template's nodeSelector (both validated before this is called)."""
    products = placement.get("gpuProducts", [])
    if not isinstance(products, list) or not all(isinstance(p, str) and p for p in products):
        raise InvalidSpecError("spec.placement.gpuProducts must be a list of product names")
    allow_whole = placement.get("allowWholeGPU", True)
    if not isinstance(allow_whole, bool):
        raise InvalidSpecError("spec.placement.allowWholeGPU must be true or false")
    profile = placement.get("profile")
    try:
        return policy.Request(
            policy=_enum(policy.PolicyName, placement.get("policy", "auto"), "placement.policy"),
            profile=str(profile) if profile else None,
            coverage=_number(placement.get("coverage", 0.95), "placement.coverage"),
            max_slowdown=_number(placement.get("maxSlowdown", 2.0), "placement.maxSlowdown"),
            gpu_products=tuple(products),
            allow_whole_gpu=allow_whole,
            replicas=int(spec.get("replicas", 1)),
            node_selector=_node_selector(spec["template"]),
        )
    except (policy.RequestError, catalogue.CatalogueError) as e:
        raise InvalidSpecError(f"spec.placement: {e}") from e


def _node_selector(template: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise InvalidSpecError("spec.template.spec.nodeSelector must be a map of labels")
    return tuple(sorted((str(k), str(v)) for k, v in selector.items()))


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSpecError(f"spec.{name} must be a number, got {value!r}")
    return float(value)
