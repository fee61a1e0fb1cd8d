"""What GPU capacity the cluster has free right now, as a plain typed value.

The operator reads nodes and pods from the API server and hands them here as `NodeRecord` and
`PodRecord` TypedDicts; `build` turns them into an `Inventory` without touching Kubernetes, so
the arithmetic (allocatable minus what bound pods already request, Kubernetes' effective-request
rule for init containers, MIG strategies, GPU Feature Discovery labels) is tested on plain data.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from kubeseer.placement import catalogue

__all__ = [
    "PRODUCT_LABEL",
    "ContainerResources",
    "Inventory",
    "InventoryError",
    "NodeRecord",
    "Offer",
    "PodRecord",
    "SkippedNode",
    "build",
    "selects",
]

PRODUCT_LABEL = "nvidia.com/gpu.product"
"""GPU Feature Discovery's label naming the node's GPU product."""

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class InventoryError(ValueError):
    """Node or pod data that cannot be read as GPU capacity (a malformed quantity)."""


class NodeRecord(TypedDict):
    """The parts of a Node that placement reads.

    `allocatable` is `status.allocatable` as the API returns it (quantities as strings);
    `schedulable` is False for cordoned or NotReady nodes, whose capacity is not on offer.
    """

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    schedulable: bool


class ContainerResources(TypedDict):
    """One container's `resources`; an extended resource's missing request defaults to its limit."""

    requests: NotRequired[Mapping[str, str]]
    limits: NotRequired[Mapping[str, str]]


class PodRecord(TypedDict):
    """The parts of a Pod that hold GPU capacity.

    `node_name` is `spec.nodeName` ("" while unscheduled). Unscheduled, non-terminal pods will
    take a unit of their resource on some node their `node_selector` (`spec.nodeSelector`)
    matches, so they are charged to the GPU products of those nodes: two DLJobs placed in the
    same second do not both count on the last free slice, and a pod pinned to H100s does not
    make A100s look busy.
    """

    node_name: str
    phase: str
    containers: Sequence[ContainerResources]
    init_containers: NotRequired[Sequence[ContainerResources]]
    node_selector: NotRequired[Mapping[str, str]]


@dataclass(frozen=True)
class Offer:
    """Units of one GPU resource on one node, with what each unit gives a job.

    `usable_memory_bytes` and `compute_share` start from the catalogue and are tightened by the
    node's GPU Feature Discovery labels where present (see `build`).
    """

    node: str
    product_label: str
    model_key: str
    profile: catalogue.Profile
    resource: str
    allocatable: int
    free: int
    usable_memory_bytes: int
    compute_share: float


@dataclass(frozen=True)
class SkippedNode:
    """A node with NVIDIA resources that placement cannot use, and why (shown in NoFit messages)."""

    node: str
    reason: str


@dataclass(frozen=True)
class Inventory:
    """Free GPU capacity per node and resource, plus the demand of pods not yet bound.

    `pending` counts unbound pods' units per (product label, resource) they could land on;
    `node_labels` are the labels of every node with offers, for matching node selectors.
    """

    offers: tuple[Offer, ...]
    pending: Mapping[tuple[str, str], int]
    skipped: tuple[SkippedNode, ...] = ()
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def free_units(
        self, product_label: str, resource: str, nodes: Container[str] | None = None
    ) -> int:
        """Units of `resource` on nodes with this product label that are free for a new pod.

        `nodes` restricts the count to those nodes (the ones a pod's selector matches). Pending
        pods that could land on this product are subtracted: a pod is charged to every product
        its node selector allows, so a pod without one (not kubeseer's) is charged everywhere,
        conservatively, and one pinned to a product only there.
        """
        free = sum(
            o.free
            for o in self.offers
            if o.product_label == product_label
            and o.resource == resource
            and (nodes is None or o.node in nodes)
        )
        return max(0, free - self.pending_units(product_label, resource))

    def pending_units(self, product_label: str, resource: str) -> int:
        """Units of `resource` that unbound pods may take on nodes of this product."""
        return self.pending.get((product_label, resource), 0)


def build(nodes: Iterable[NodeRecord], pods: Iterable[PodRecord]) -> Inventory:
    """Compute free GPU capacity: allocatable minus the effective requests of live bound pods,
    and the units unbound pods may take per product."""
    used: dict[tuple[str, str], int] = {}
    unbound: list[tuple[Mapping[str, str], dict[str, int]]] = []
    for pod in pods:
        if pod["phase"] in _TERMINAL_PHASES:
            continue
        requests = _effective_requests(pod)
        if not pod["node_name"]:
            unbound.append((pod.get("node_selector", {}), requests))
            continue
        for resource, amount in requests.items():
            key = (pod["node_name"], resource)
            used[key] = used.get(key, 0) + amount

    offers: list[Offer] = []
    skipped: list[SkippedNode] = []
    labels: dict[str, Mapping[str, str]] = {}
    for node in sorted(nodes, key=lambda n: n["name"]):
        node_offers, reason = _node_offers(node, used)
        offers.extend(node_offers)
        if node_offers:
            labels[node["name"]] = dict(node["labels"])
        if reason is not None:
            skipped.append(SkippedNode(node=node["name"], reason=reason))
    return Inventory(
        offers=tuple(offers),
        pending=_charge_unbound(unbound, offers, labels),
        skipped=tuple(skipped),
        node_labels=labels,
    )


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a `nodeSelector` matches a node's labels (every pair present and equal)."""
    return all(labels.get(key) == value for key, value in selector.items())


def _charge_unbound(
    unbound: Sequence[tuple[Mapping[str, str], Mapping[str, int]]],
    offers: Sequence[Offer],
    labels: Mapping[str, Mapping[str, str]],
) -> dict[tuple[str, str], int]:
    """Charge each unbound pod's units to every product whose nodes its selector matches."""
    pending: dict[tuple[str, str], int] = {}
    for selector, requests in unbound:
        for resource, amount in requests.items():
            products = {
                o.product_label
                for o in offers
                if o.resource == resource and selects(selector, labels[o.node])
            }
            for product in products:
                key = (product, resource)
                pending[key] = pending.get(key, 0) + amount
    return pending


def _node_offers(
    node: NodeRecord, used: Mapping[tuple[str, str], int]
) -> tuple[list[Offer], str | None]:
    gpu_resources = {
        r: q for r, q in node["allocatable"].items() if _is_nvidia_resource(r) and _quantity(q) > 0
    }
    if not gpu_resources:
        return [], None
    if not node["schedulable"]:
        return [], "cordoned or not ready"
    label = node["labels"].get(PRODUCT_LABEL)
    if label is None:
        return (
            [],
            f"NVIDIA resources but no {PRODUCT_LABEL} label (is GPU Feature Discovery running?)",
        )
    try:
        model, single_profile = catalogue.parse_product_label(label)
    except catalogue.UnknownProductError as e:
        return [], str(e)

    offers: list[Offer] = []
    ignored: list[str] = []
    for resource, quantity in sorted(gpu_resources.items()):
        if resource == catalogue.GPU_RESOURCE:
            profile = single_profile if single_profile is not None else model.whole
        else:
            found = model.profile_for_resource(resource)
            if found is None:
                ignored.append(resource)
                continue
            profile = found
        allocatable = _quantity(quantity)
        memory, share = _observed_capacity(node["labels"], resource, profile, model)
        offers.append(
            Offer(
                node=node["name"],
                product_label=label,
                model_key=model.key,
                profile=profile,
                resource=resource,
                allocatable=allocatable,
                free=max(0, allocatable - used.get((node["name"], resource), 0)),
                usable_memory_bytes=memory,
                compute_share=share,
            )
        )
    reason = f"resources not in the catalogue ignored: {', '.join(ignored)}" if ignored else None
    return offers, reason


def _observed_capacity(
    labels: Mapping[str, str],
    resource: str,
    profile: catalogue.Profile,
    model: catalogue.GpuModel,
) -> tuple[int, float]:
    """Tighten catalogue figures with GFD's per-device labels.

    GFD publishes memory (MiB) and multiprocessors per MIG profile (`nvidia.com/mig-<p>.memory`)
    under strategy `mixed`, and per device (`nvidia.com/gpu.memory`) otherwise. Memory labels can
    only lower the figure: some GFD versions publish the nominal size, and a too-large figure
    means an OOM. An SM count is a measurement, so it replaces the catalogue's share outright.
    """
    prefix = resource + "." if resource != catalogue.GPU_RESOURCE else "nvidia.com/gpu."
    memory = profile.usable_memory_bytes
    label_mib = labels.get(prefix + "memory")
    if label_mib is not None and label_mib.isdigit() and int(label_mib) > 0:
        memory = min(memory, int(label_mib) * catalogue.MIB)
    share = profile.compute_share
    label_sms = labels.get(prefix + "multiprocessors")
    if label_sms is not None and label_sms.isdigit() and 0 < int(label_sms) <= model.sms:
        share = int(label_sms) / model.sms
    return memory, share


def _effective_requests(pod: PodRecord) -> dict[str, int]:
    """Kubernetes' rule: max(sum over app containers, max over init containers), per resource."""
    totals: dict[str, int] = {}
    for container in pod["containers"]:
        for resource, amount in _container_requests(container).items():
            totals[resource] = totals.get(resource, 0) + amount
    for container in pod.get("init_containers", ()):
        for resource, amount in _container_requests(container).items():
            totals[resource] = max(totals.get(resource, 0), amount)
    return {r: a for r, a in totals.items() if a > 0}


def _container_requests(container: ContainerResources) -> dict[str, int]:
    merged = {**container.get("limits", {}), **container.get("requests", {})}
    return {r: _quantity(q) for r, q in merged.items() if _is_nvidia_resource(r)}


def _is_nvidia_resource(resource: str) -> bool:
    return resource == catalogue.GPU_RESOURCE or resource.startswith(catalogue.MIG_RESOURCE_PREFIX)


def _quantity(value: str) -> int:
    """Extended resources are whole numbers; anything else is a malformed object."""
    text = str(value).strip()
    if not text.isdigit():
        raise InventoryError(f"GPU resource quantity {value!r} is not a whole number")
    return int(text)
