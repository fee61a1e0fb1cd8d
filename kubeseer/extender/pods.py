"""What the extender reads from a pod: its GPU requests and the annotations kubeseer put on it.

The operator writes the prediction onto every pod it creates (`kubeseer.operator.workload`);
the extender only reads it. A pod without those annotations is not kubeseer's and is passed
through untouched. A kubeseer annotation that cannot be read is the user's to fix, so it becomes
the demand's `problem`, whose message reaches `kubectl describe pod`, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeseer.operator import workload
from kubeseer.placement import catalogue

__all__ = [
    "ANNOTATION_GPU_PRODUCTS",
    "Demand",
    "QuantityError",
    "gpu_requests",
    "is_gpu_resource",
    "read",
]

ANNOTATION_GPU_PRODUCTS = workload.ANNOTATION_GPU_PRODUCTS
"""The DLJob's allowed GPU products (`spec.placement.gpuProducts`), comma-separated catalogue keys
or product labels; the operator writes it when the extender chooses the device kind."""

KUBESEER_ANNOTATIONS = (workload.ANNOTATION_PREDICTED_MEMORY, ANNOTATION_GPU_PRODUCTS)
"""A pod carrying any of these is kubeseer's; the extender decides for it."""


class AnnotationError(ValueError):
    """A kubeseer annotation that cannot be read (becomes `Demand.problem`)."""


class QuantityError(ValueError):
    """A GPU resource quantity that is not a whole number (the API server should prevent it)."""


@dataclass(frozen=True)
class Demand:
    """The pod being scheduled, as far as GPU placement cares.

    `requests` holds the effective request per NVIDIA resource (`nvidia.com/gpu`,
    `nvidia.com/mig-<profile>`). `predicted_memory_bytes` is the calibrated upper bound of peak
    GPU memory per device; `allowed_models` the catalogue keys of the allowed products, None for
    any. `kubeseer` is False for a pod the extender must leave alone; `problem` says which of
    kubeseer's annotations cannot be read (the pod then fits nowhere until it is fixed).
    """

    namespace: str
    name: str
    uid: str
    scheduler_name: str
    requests: Mapping[str, int]
    kubeseer: bool
    predicted_memory_bytes: int | None = None
    allowed_models: tuple[str, ...] | None = None
    problem: str | None = None

    @property
    def key(self) -> str:
        """`namespace/name`, for logs."""
        return f"{self.namespace}/{self.name}"


def read(pod: Mapping[str, Any], *, default_scheduler: str = "default-scheduler") -> Demand:
    """Read a `v1.Pod` (Kubernetes JSON). Raises `QuantityError` for a malformed request."""
    metadata = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    annotations = {str(k): str(v) for k, v in _mapping(metadata.get("annotations")).items()}
    kubeseer = any(key in annotations for key in KUBESEER_ANNOTATIONS)
    memory: int | None = None
    models: tuple[str, ...] | None = None
    problem: str | None = None
    if kubeseer:
        try:
            memory = _predicted_memory(annotations)
            models = _allowed_models(annotations)
        except AnnotationError as e:
            problem = str(e)
    return Demand(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        scheduler_name=str(spec.get("schedulerName") or default_scheduler),
        requests=gpu_requests(spec),
        kubeseer=kubeseer,
        predicted_memory_bytes=memory,
        allowed_models=models,
        problem=problem,
    )


def gpu_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective NVIDIA requests of a pod spec, by Kubernetes' rule.

    Per resource: the larger of (every app container plus every sidecar) and, for each plain
    init container, its own request plus the sidecars started before it. Sidecars are init
    containers with `restartPolicy: Always`; they keep running beside the app. A missing
    request of an extended resource equals its limit (the API server copies it).
    """
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for container in _containers(spec, "initContainers"):
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
        else:
            for resource, units in own.items():
                during = units + sidecars.get(resource, 0)
                init_peak[resource] = max(init_peak.get(resource, 0), during)
    running = dict(sidecars)
    for container in _containers(spec, "containers"):
        _add(running, _container_requests(container))
    effective = {r: max(running.get(r, 0), init_peak.get(r, 0)) for r in running | init_peak}
    return {r: units for r, units in sorted(effective.items()) if units > 0}


def is_gpu_resource(resource: str) -> bool:
    """`nvidia.com/gpu` or a mixed-strategy `nvidia.com/mig-<profile>` resource."""
    return resource == catalogue.GPU_RESOURCE or resource.startswith(catalogue.MIG_RESOURCE_PREFIX)


def _predicted_memory(annotations: Mapping[str, str]) -> int | None:
    raw = annotations.get(workload.ANNOTATION_PREDICTED_MEMORY)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) == 0:
        raise AnnotationError(
            f"annotation {workload.ANNOTATION_PREDICTED_MEMORY}={raw!r} must be a positive "
            "whole number of bytes"
        )
    return int(text)


def _allowed_models(annotations: Mapping[str, str]) -> tuple[str, ...] | None:
    raw = annotations.get(ANNOTATION_GPU_PRODUCTS)
    if raw is None:
        return None
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    if not entries:
        raise AnnotationError(f"annotation {ANNOTATION_GPU_PRODUCTS} is empty; omit it for any GPU")
    keys: list[str] = []
    for entry in entries:
        try:
            keys.append(catalogue.resolve_product(entry).key)
        except catalogue.UnknownProductError as e:
            raise AnnotationError(f"annotation {ANNOTATION_GPU_PRODUCTS}: {e}") from e
    return tuple(sorted(set(keys)))


def _containers(spec: Mapping[str, Any], field: str) -> Sequence[Mapping[str, Any]]:
    containers = spec.get(field)
    if not isinstance(containers, list):
        return ()
    return [c for c in containers if isinstance(c, dict)]


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = _mapping(container.get("resources"))
    merged = {**_mapping(resources.get("limits")), **_mapping(resources.get("requests"))}
    return {str(r): _whole(r, q) for r, q in merged.items() if is_gpu_resource(str(r))}


def _whole(resource: object, quantity: object) -> int:
    """Extended resources are whole numbers: `"1"` (JSON string) or `1`."""
    text = str(quantity).strip()
    if isinstance(quantity, bool) or not text.isdigit():
        raise QuantityError(f"{resource} quantity {quantity!r} is not a whole number")
    return int(text)


def _add(totals: dict[str, int], more: Mapping[str, int]) -> None:
    for resource, units in more.items():
        totals[resource] = totals.get(resource, 0) + units


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
