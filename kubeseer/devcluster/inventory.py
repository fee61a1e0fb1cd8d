"""The fake GPU inventory: `deploy/devcluster/nodes.yaml` parsed into typed values and turned
into Node manifests that look like what NVIDIA's GPU Operator publishes.

Each GPU node says who publishes its GPUs (`gpuDriver`): NVIDIA's device plugin (the default:
extended resources on the Node), or NVIDIA's DRA driver with pre-made MIG partitions
(`draStatic`) or with partitions made on demand (`draDynamic`). A DRA node carries no
`nvidia.com/*` resources; its devices are ResourceSlices (`kubeseer.devcluster.dra`).

The extender, the placement policy and the demo all read GPUs through node labels and
allocatable resources, so the fake nodes must carry the real names: GFD's `nvidia.com/gpu.*`,
`nvidia.com/mig.*` and `nvidia.com/mig-<profile>.*` labels and the device plugin's
`nvidia.com/gpu` / `nvidia.com/mig-<profile>` resources (see the notes in
`../shared/notes/kubernetes-gpu.md`, section 1.2). Parsing rejects hardware that cannot exist
(a layout over the GPU's 7 compute or 8 memory slices, a profile the product lacks) so that a
typo in the inventory fails loudly instead of producing a node no real cluster would have.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import yaml

from kubeseer.devcluster import errors
from kubeseer.devcluster.dra import geometry

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
COMPUTE_SLICES_PER_GPU = 7
MEMORY_SLICES_PER_GPU = 8
# Annotation KWOK's controller selects on (`--manage-nodes-with-annotation-selector`).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
DEFAULT_PODS = "110"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb$")
_CAPABILITY = re.compile(r"^([0-9]+)\.([0-9]+)$")


class MigStrategy(enum.StrEnum):
    """The device plugin's `--mig-strategy`: how MIG devices become node resources."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class GpuDriver(enum.StrEnum):
    """Who publishes a node's GPUs to the scheduler."""

    DEVICE_PLUGIN = "devicePlugin"
    """NVIDIA's device plugin: `nvidia.com/gpu` and `nvidia.com/mig-*` extended resources."""
    DRA_STATIC = "draStatic"
    """NVIDIA's DRA driver with MIG partitions made beforehand (its default)."""
    DRA_DYNAMIC = "draDynamic"
    """NVIDIA's DRA driver with its `DynamicMIG` gate: every placement, made on demand."""

    @property
    def is_dra(self) -> bool:
        """Whether the GPUs are ResourceSlices rather than extended resources."""
        return self is not GpuDriver.DEVICE_PLUGIN


@dataclass(frozen=True)
class Engines:
    """The engines a MIG instance owns (`nvidia-smi mig -lgip`: CE, DEC, ENC, JPEG, OFA).

    NVIDIA's DRA driver publishes them as capacities of each MIG device and, under dynamic
    MIG, as counters each placement consumes from its GPU.
    """

    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of one GPU product, with the figures GFD publishes for it.

    `engines` is needed only where the DRA driver publishes the profile.
    """

    name: str
    memory_mib: int
    multiprocessors: int
    compute_slices: int
    memory_slices: int
    max_per_gpu: int
    engines: Engines | None = None

    @property
    def resource_name(self) -> str:
        """The mixed-strategy extended resource, e.g. `nvidia.com/mig-2g.20gb`."""
        return MIG_RESOURCE_PREFIX + self.name


@dataclass(frozen=True)
class GpuModel:
    """A GPU product as GFD describes it; `key` is the inventory's name for it.

    `product_name` is the NVML device name (`NVIDIA H100 80GB HBM3`), which the DRA driver
    publishes as `productName`; GFD's `product` label is the same with dashes for spaces, a
    substitution that cannot be undone, so DRA nodes need it spelt out.
    """

    key: str
    product: str
    memory_mib: int
    family: str
    compute_major: int
    compute_minor: int
    multiprocessors: int
    mig_profiles: Mapping[str, MigProfile]
    product_name: str | None = None

    @property
    def architecture(self) -> str:
        """NVML's architecture name (`Ampere`, `Hopper`), the driver's `architecture`."""
        return self.family.capitalize()


@dataclass(frozen=True)
class NodeSpec:
    """One fake node. `mig_layouts` has one mapping (profile -> instances) per MIG-enabled GPU."""

    name: str
    gpu_model: GpuModel | None
    gpus: int
    mig_strategy: MigStrategy
    mig_layouts: tuple[Mapping[str, int], ...]
    cpu: str
    memory: str
    pods: str = DEFAULT_PODS
    gpu_driver: GpuDriver = GpuDriver.DEVICE_PLUGIN

    @property
    def whole_gpus(self) -> int:
        """GPUs with MIG disabled, which the device plugin advertises as `nvidia.com/gpu`."""
        return self.gpus - len(self.mig_layouts)

    def mig_instances(self) -> dict[str, int]:
        """Instances per profile over all GPUs of the node, in profile order."""
        totals: dict[str, int] = {}
        for layout in self.mig_layouts:
            for profile, count in layout.items():
                totals[profile] = totals.get(profile, 0) + count
        order = list(self.gpu_model.mig_profiles) if self.gpu_model else []
        return {p: totals[p] for p in order if p in totals}

    def extended_resources(self) -> dict[str, int]:
        """The device plugin's resources: what `status.capacity` and `allocatable` carry.

        None on a DRA node: one node cannot back a name with both a device plugin and DRA,
        and the DRA driver publishes ResourceSlices instead.
        """
        if self.gpu_model is None or self.gpu_driver.is_dra:
            return {}
        instances = self.mig_instances()
        if self.mig_strategy is MigStrategy.SINGLE:
            return {GPU_RESOURCE: sum(instances.values())}
        resources = {GPU_RESOURCE: self.whole_gpus}
        for profile, count in instances.items():
            resources[self.gpu_model.mig_profiles[profile].resource_name] = count
        return resources

    def labels(self) -> dict[str, str]:
        """Node labels: the kubelet's well-known ones plus GFD's `nvidia.com/*` set."""
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        model = self.gpu_model
        if model is None:
            return labels
        labels |= {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.family": model.family,
            "nvidia.com/gpu.compute.major": str(model.compute_major),
            "nvidia.com/gpu.compute.minor": str(model.compute_minor),
        }
        if self.gpu_driver.is_dra:
            # GFD still labels the node; the device plugin's strategy and sharing do not apply.
            return labels | {
                "nvidia.com/gpu.product": model.product,
                "nvidia.com/gpu.memory": str(model.memory_mib),
                "nvidia.com/gpu.count": str(self.gpus),
                "nvidia.com/mig.capable": str(bool(model.mig_profiles)).lower(),
            }
        labels |= {
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/mig.capable": str(bool(model.mig_profiles)).lower(),
            "nvidia.com/mig.strategy": self.mig_strategy.value,
        }
        instances = self.mig_instances()
        if self.mig_strategy is MigStrategy.SINGLE:
            # GFD rewrites the GPU labels to describe the one MIG device type.
            (name,) = instances
            profile = model.mig_profiles[name]
            return labels | {
                "nvidia.com/gpu.product": f"{model.product}-MIG-{name}",
                "nvidia.com/gpu.memory": str(profile.memory_mib),
                "nvidia.com/gpu.count": str(instances[name]),
                "nvidia.com/gpu.multiprocessors": str(profile.multiprocessors),
                "nvidia.com/gpu.slices.gi": str(profile.compute_slices),
                "nvidia.com/gpu.slices.ci": str(profile.compute_slices),
            }
        labels |= {
            "nvidia.com/gpu.product": model.product,
            "nvidia.com/gpu.memory": str(model.memory_mib),
            "nvidia.com/gpu.count": str(self.gpus),
        }
        for name, count in instances.items():
            profile = model.mig_profiles[name]
            prefix = f"nvidia.com/mig-{name}."
            labels |= {
                prefix + "count": str(count),
                prefix + "memory": str(profile.memory_mib),
                prefix + "multiprocessors": str(profile.multiprocessors),
                prefix + "product": f"{model.product}-MIG-{name}",
                prefix + "replicas": "1",
                prefix + "sharing-strategy": "none",
                prefix + "slices.gi": str(profile.compute_slices),
                prefix + "slices.ci": str(profile.compute_slices),
            }
        return labels


@dataclass(frozen=True)
class Inventory:
    """Every GPU model and fake node of one inventory file."""

    models: Mapping[str, GpuModel]
    nodes: tuple[NodeSpec, ...]

    def extended_resources(self) -> tuple[str, ...]:
        """Every GPU resource name some node advertises: the extender's `managedResources`."""
        names = {name for node in self.nodes for name in node.extended_resources()}
        return tuple(sorted(names))

    def dra_nodes(self) -> tuple[NodeSpec, ...]:
        """The GPU nodes whose devices NVIDIA's DRA driver publishes."""
        return tuple(n for n in self.nodes if n.gpu_model and n.gpu_driver.is_dra)


class ObjectMeta(TypedDict):
    """The part of a Node's `metadata` the dev cluster sets."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]


class NodeStatus(TypedDict):
    """The part of a Node's `status` the dev cluster sets; KWOK fills in the rest."""

    capacity: dict[str, str]
    allocatable: dict[str, str]


class NodeManifest(TypedDict):
    """A `v1/Node` as the dev cluster creates it (status included, see `build_node`)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    status: NodeStatus


def build_node(node: NodeSpec) -> NodeManifest:
    """The Node object for one inventory entry.

    The status goes in the create body: the apiserver keeps it, and KWOK's node-initialize
    stage keeps a capacity that is already set (it only fills in defaults when absent), so the
    GPU resources survive KWOK taking the node over.
    """
    resources = {"cpu": node.cpu, "memory": node.memory, "pods": node.pods}
    resources |= {name: str(count) for name, count in node.extended_resources().items()}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": node.labels(),
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def load(path: Path) -> Inventory:
    """Read and validate an inventory file."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise errors.InventoryError(f"cannot read inventory {path}: {e}") from e
    except yaml.YAMLError as e:
        raise errors.InventoryError(f"{path}: not valid YAML: {e}") from e
    return parse(document, source=str(path))


def parse(document: object, *, source: str = "<inventory>") -> Inventory:
    """Validate a decoded inventory document (see `deploy/devcluster/nodes.yaml`)."""
    top = _mapping(document, source)
    _only_keys(top, {"gpuModels", "nodes"}, source)
    models = {
        str(key): _parse_model(str(key), value, f"{source}: gpuModels.{key}")
        for key, value in _mapping(top.get("gpuModels", {}), f"{source}: gpuModels").items()
    }
    raw_nodes = top.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise errors.InventoryError(f"{source}: `nodes` must be a non-empty list")
    nodes = tuple(_parse_node(i, raw, models, source) for i, raw in enumerate(raw_nodes))
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise errors.InventoryError(f"{source}: duplicate node names {duplicates}")
    return Inventory(models=models, nodes=nodes)


def _parse_model(key: str, raw: object, where: str) -> GpuModel:
    fields = _mapping(raw, where)
    _only_keys(
        fields,
        {
            "product",
            "productName",
            "memoryMiB",
            "family",
            "computeCapability",
            "multiprocessors",
            "migProfiles",
        },
        where,
    )
    capability = _CAPABILITY.match(_string(fields, "computeCapability", where))
    if capability is None:
        raise errors.InventoryError(f"{where}: computeCapability must look like 8.0")
    profiles = {
        str(name): _parse_profile(str(name), value, f"{where}.migProfiles.{name}")
        for name, value in _mapping(fields.get("migProfiles", {}), where).items()
    }
    return GpuModel(
        key=key,
        product=_string(fields, "product", where),
        memory_mib=_positive_int(fields, "memoryMiB", where),
        family=_string(fields, "family", where),
        compute_major=int(capability.group(1)),
        compute_minor=int(capability.group(2)),
        multiprocessors=_positive_int(fields, "multiprocessors", where),
        mig_profiles=profiles,
        product_name=_string(fields, "productName", where) if "productName" in fields else None,
    )


def _parse_profile(name: str, raw: object, where: str) -> MigProfile:
    if not _PROFILE.match(name):
        raise errors.InventoryError(f"{where}: a MIG profile is named like 2g.20gb")
    fields = _mapping(raw, where)
    _only_keys(
        fields,
        {"memoryMiB", "multiprocessors", "computeSlices", "memorySlices", "maxPerGpu", "engines"},
        where,
    )
    profile = MigProfile(
        name=name,
        memory_mib=_positive_int(fields, "memoryMiB", where),
        multiprocessors=_positive_int(fields, "multiprocessors", where),
        compute_slices=_positive_int(fields, "computeSlices", where),
        memory_slices=_positive_int(fields, "memorySlices", where),
        max_per_gpu=_positive_int(fields, "maxPerGpu", where),
        engines=_parse_engines(fields["engines"], f"{where}.engines")
        if "engines" in fields
        else None,
    )
    if profile.compute_slices != int(name.split("g.", 1)[0]):
        raise errors.InventoryError(f"{where}: computeSlices must match the profile name")
    if profile.compute_slices > COMPUTE_SLICES_PER_GPU:
        raise errors.InventoryError(f"{where}: more than {COMPUTE_SLICES_PER_GPU} compute slices")
    if profile.memory_slices > MEMORY_SLICES_PER_GPU:
        raise errors.InventoryError(f"{where}: more than {MEMORY_SLICES_PER_GPU} memory slices")
    try:
        geometry.starts(profile.compute_slices, profile.memory_slices)
    except ValueError as e:
        raise errors.InventoryError(f"{where}: {e}") from e
    return profile


def _parse_engines(raw: object, where: str) -> Engines:
    fields = _mapping(raw, where)
    keys = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
    _only_keys(fields, set(keys), where)
    counts = []
    for key in keys:
        value = fields.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise errors.InventoryError(f"{where}: `{key}` must be a non-negative integer")
        counts.append(value)
    return Engines(*counts)


def _parse_node(index: int, raw: object, models: Mapping[str, GpuModel], source: str) -> NodeSpec:
    where = f"{source}: nodes[{index}]"
    fields = _mapping(raw, where)
    _only_keys(
        fields,
        {
            "name",
            "gpuModel",
            "gpus",
            "gpuDriver",
            "migStrategy",
            "migLayouts",
            "cpu",
            "memory",
            "pods",
        },
        where,
    )
    name = _string(fields, "name", where)
    if len(name) > 253 or not _NAME.match(name):
        raise errors.InventoryError(f"{where}: {name!r} is not a valid node name")
    where = f"{source}: node {name}"
    cpu, memory = _quantity(fields, "cpu", where), _quantity(fields, "memory", where)
    pods = _quantity(fields, "pods", where) if "pods" in fields else DEFAULT_PODS
    if "gpuModel" not in fields:
        extra = sorted({"gpus", "gpuDriver", "migStrategy", "migLayouts"} & fields.keys())
        if extra:
            raise errors.InventoryError(f"{where}: {extra} given without a gpuModel")
        return NodeSpec(name, None, 0, MigStrategy.NONE, (), cpu, memory, pods)
    model_key = _string(fields, "gpuModel", where)
    model = models.get(model_key)
    if model is None:
        raise errors.InventoryError(
            f"{where}: unknown gpuModel {model_key!r}; known: {sorted(models)}"
        )
    gpus = _positive_int(fields, "gpus", where)
    try:
        driver = GpuDriver(fields.get("gpuDriver", GpuDriver.DEVICE_PLUGIN.value))
    except ValueError as e:
        choices = [d.value for d in GpuDriver]
        raise errors.InventoryError(f"{where}: gpuDriver must be one of {choices}") from e
    try:
        strategy = MigStrategy(fields.get("migStrategy", MigStrategy.NONE.value))
    except ValueError as e:
        choices = [s.value for s in MigStrategy]
        raise errors.InventoryError(f"{where}: migStrategy must be one of {choices}") from e
    raw_layouts = fields.get("migLayouts", [])
    if not isinstance(raw_layouts, list):
        raise errors.InventoryError(f"{where}: migLayouts must be a list (one mapping per GPU)")
    layouts = tuple(
        _parse_layout(layout, model, f"{where}: migLayouts[{i}]")
        for i, layout in enumerate(raw_layouts)
    )
    if len(layouts) > gpus:
        raise errors.InventoryError(f"{where}: {len(layouts)} MIG layouts for {gpus} GPUs")
    if driver.is_dra:
        _check_dra_node(fields, model, gpus, driver, layouts, where)
        return NodeSpec(name, model, gpus, MigStrategy.NONE, layouts, cpu, memory, pods, driver)
    if strategy is MigStrategy.NONE and layouts:
        raise errors.InventoryError(f"{where}: migStrategy none exposes no MIG layouts")
    if strategy is MigStrategy.SINGLE:
        kinds = {profile for layout in layouts for profile in layout}
        if len(layouts) != gpus or len(kinds) != 1:
            raise errors.InventoryError(
                f"{where}: migStrategy single needs every GPU partitioned into one profile"
            )
    return NodeSpec(name, model, gpus, strategy, layouts, cpu, memory, pods)


def _check_dra_node(
    fields: Mapping[str, Any],
    model: GpuModel,
    gpus: int,
    driver: GpuDriver,
    layouts: tuple[Mapping[str, int], ...],
    where: str,
) -> None:
    """What the DRA driver needs to publish a node as the real one would."""
    if "migStrategy" in fields:
        raise errors.InventoryError(
            f"{where}: migStrategy is the device plugin's setting; a {driver.value} node has none"
        )
    if model.product_name is None:
        raise errors.InventoryError(
            f"{where}: gpuModel {model.key} needs `productName`, the NVML name the DRA driver "
            "publishes (e.g. 'NVIDIA H100 80GB HBM3')"
        )
    if driver is GpuDriver.DRA_DYNAMIC:
        if layouts:
            raise errors.InventoryError(
                f"{where}: draDynamic makes MIG partitions on demand; migLayouts are for draStatic"
            )
        if not model.mig_profiles:
            raise errors.InventoryError(f"{where}: draDynamic needs a MIG-capable gpuModel")
        # The driver puts every GPU's counter set in one ResourceSlice, which holds at most 8.
        if gpus > 8:
            raise errors.InventoryError(f"{where}: draDynamic publishes at most 8 GPUs per node")
    used = (
        set(model.mig_profiles)
        if driver is GpuDriver.DRA_DYNAMIC
        else {p for layout in layouts for p in layout}
    )
    missing = sorted(p for p in used if model.mig_profiles[p].engines is None)
    if missing:
        raise errors.InventoryError(
            f"{where}: the DRA driver publishes each MIG device's engines; "
            f"{model.key} profiles {missing} have no `engines`"
        )


def _parse_layout(raw: object, model: GpuModel, where: str) -> Mapping[str, int]:
    layout: dict[str, int] = {}
    for name, count in _mapping(raw, where).items():
        profile = model.mig_profiles.get(str(name))
        if profile is None:
            raise errors.InventoryError(
                f"{where}: {model.key} has no MIG profile {name!r}; "
                f"it has {sorted(model.mig_profiles)}"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise errors.InventoryError(f"{where}: the count of {name} must be a positive integer")
        if count > profile.max_per_gpu:
            raise errors.InventoryError(
                f"{where}: at most {profile.max_per_gpu} x {name} fit on one {model.key}"
            )
        layout[profile.name] = count
    if not layout:
        raise errors.InventoryError(f"{where}: an empty MIG layout")
    compute = sum(model.mig_profiles[p].compute_slices * n for p, n in layout.items())
    memory = sum(model.mig_profiles[p].memory_slices * n for p, n in layout.items())
    if compute > COMPUTE_SLICES_PER_GPU or memory > MEMORY_SLICES_PER_GPU:
        raise errors.InventoryError(
            f"{where}: the layout needs {compute}/{COMPUTE_SLICES_PER_GPU} compute and "
            f"{memory}/{MEMORY_SLICES_PER_GPU} memory slices; one GPU has no more"
        )
    return layout


def mig_instances(model: GpuModel, layout: Mapping[str, int]) -> tuple[geometry.Instance, ...]:
    """A GPU's layout as the instances to place, in profile order."""
    return tuple(
        geometry.Instance(name, profile.compute_slices, profile.memory_slices)
        for name, profile in model.mig_profiles.items()
        for _ in range(layout.get(name, 0))
    )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise errors.InventoryError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _only_keys(fields: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise errors.InventoryError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")


def _string(fields: Mapping[str, Any], key: str, where: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value:
        raise errors.InventoryError(f"{where}: `{key}` must be a non-empty string")
    return value


def _positive_int(fields: Mapping[str, Any], key: str, where: str) -> int:
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise errors.InventoryError(f"{where}: `{key}` must be a positive integer")
    return value


def _quantity(fields: Mapping[str, Any], key: str, where: str) -> str:
    value = fields.get(key)
    text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if not _QUANTITY.match(text):
        raise errors.InventoryError(
            f"{where}: `{key}` must be a Kubernetes quantity such as 64 or 512Gi"
        )
    return text
