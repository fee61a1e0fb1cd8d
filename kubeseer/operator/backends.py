"""How an attempt's pods get their GPU: a device plugin's extended resources, or Dynamic
Resource Allocation (the cluster-level setting `KUBESEER_GPU_BACKEND`, docs/dra.md).

Both backends create the attempt's workload the same way: a batch/v1 Job, created suspended,
given its GPU, then resumed, so that a queueing system that admits suspended Jobs can sit in
front of kubeseer. They differ in what "given its GPU" is and in where free capacity is read:

* `ExtendedResources`: the Job is created without a GPU and receives one unit of the chosen
  extended resource (`nvidia.com/mig-1g.10gb`) while suspended (KEP-5440, beta and on in
  Kubernetes 1.36 and 1.37); free capacity is node allocatable minus what pods request.
* `DynamicResources`: the Job's pods name a ResourceClaimTemplate (a Job's `resourceClaims`
  cannot change, so they are there from the start) and the template, the plan's ladder as a
  `firstAvailable` request, is created while the Job is suspended, owned by it; free capacity
  is the DRA driver's devices minus what claims hold.

`resolve` is the auto-detection: DRA when NVIDIA's DRA driver's DeviceClasses exist and no node
offers GPUs through a device plugin.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from kubeseer.operator import dljob, errors, ports, workload
from kubeseer.operator import inventory as inventory_cache
from kubeseer.operator import status as st
from kubeseer.operator.config import GpuBackend
from kubeseer.operator.dra import inventory as dra_inventory
from kubeseer.operator.dra import ladder
from kubeseer.placement import claims, plan, policy
from kubeseer.placement import inventory as placement_inventory
from kubeseer.prediction import Prediction

DRIVER_DEVICE_CLASSES = (claims.GPU_DEVICE_CLASS, claims.MIG_DEVICE_CLASS)
"""The DeviceClasses NVIDIA's DRA driver installs; kubeseer's claims name them."""


def resolve(
    setting: GpuBackend,
    device_classes: Collection[str],
    nodes: Iterable[Mapping[str, Any]],
) -> tuple[GpuBackend, str]:
    """The backend to use and why: the setting, unless it is `auto`.

    Auto picks DRA when both driver DeviceClasses exist and no node's allocatable carries a
    device plugin's `nvidia.com/gpu` or `nvidia.com/mig-*`: a claim cannot be served by a
    device plugin, so a cluster with such nodes (device plugin only, or mixed) stays on extended
    resources unless the admin chooses DRA.
    """
    if setting is not GpuBackend.AUTO:
        return setting, f"KUBESEER_GPU_BACKEND={setting.value}"
    missing = [c for c in DRIVER_DEVICE_CLASSES if c not in device_classes]
    if missing:
        return GpuBackend.EXTENDED, f"auto: no DeviceClass {', '.join(missing)}"
    plugin_nodes = sorted(
        str((n.get("metadata") or {}).get("name"))
        for n in nodes
        if any(
            workload.is_gpu_resource(str(r))
            for r in ((n.get("status") or {}).get("allocatable") or {})
        )
    )
    if plugin_nodes:
        return GpuBackend.EXTENDED, (
            f"auto: the DRA driver's DeviceClasses exist, but {len(plugin_nodes)} nodes offer "
            f"GPUs through a device plugin ({', '.join(plugin_nodes[:3])}); set "
            "KUBESEER_GPU_BACKEND=dra to use DRA anyway"
        )
    return GpuBackend.DRA, "auto: the DRA driver's DeviceClasses exist and no device plugin"


class Launched(StrEnum):
    """What `Backend.launch` found and did."""

    CREATED = "created"
    """The Job was created, given its GPU and resumed."""
    RESUMED = "resumed"
    """The Job existed, suspended (an operator stopped half-way): given its GPU and resumed."""
    RUNNING = "running"
    """The Job existed and was resumed before: nothing to do."""


@dataclass(frozen=True)
class Attempt:
    """An attempt whose workload is to be created.

    `plan` is the plan the placement was just chosen from; None when the attempt was placed by
    an earlier run of the operator, whose `status.plan` (`recorded_plan`) says what it needed.
    `open_kinds`: the scheduler extender chooses the device kind (`kinds`).
    """

    ref: dljob.DLJobRef
    spec: dljob.DLJobSpec
    prediction: Prediction
    placed: st.PlacedAttempt
    scheduler_name: str
    plan: plan.Plan | None = None
    recorded_plan: Mapping[str, Any] | None = None
    open_kinds: bool = False

    @property
    def kinds(self) -> tuple[str, ...]:
        """The products an extended-resource pod may land on, () for the placement's own only.

        With `open_kinds`, every kind of the plan's ladder that shares the placement's resource
        (`workload.ladder_kinds`), so that the extender's best fit chooses among them and, when
        the extender is down, default scoring still sees only kinds that hold the job. Kept to
        the placement's kind for policies that name one (`fixed`, `dippm`) and for several
        replicas, which the plan promises devices of one kind.
        """
        placement = self.placed.placement
        if (
            not self.open_kinds
            or placement.policy is not policy.PolicyName.AUTO
            or self.spec.replicas > 1
        ):
            return ()
        recorded = plan.to_status(self.plan) if self.plan is not None else self.recorded_plan
        return workload.ladder_kinds(recorded, placement) if recorded else ()

    @property
    def name(self) -> str:
        """The Job's name."""
        return workload.workload_name(self.ref.name, self.placed.attempt)

    @property
    def key(self) -> str:
        """Which attempt of which DLJob."""
        return f"{self.ref.namespace}/{self.ref.name}#{self.placed.attempt}"

    def job(self, device: workload.Device) -> dict[str, Any]:
        """The attempt's Job with this device, suspended."""
        return workload.build_job(
            self.spec,
            self.ref.name,
            self.ref.namespace,
            self.ref.uid,
            self.prediction,
            self.placed.placement,
            self.placed.attempt,
            scheduler_name=self.scheduler_name,
            device=device,
            kinds=self.kinds,
        )


class Backend(Protocol):
    """Free capacity to plan on, and the creation of an attempt's workload."""

    @property
    def kind(self) -> GpuBackend:
        """Which backend (never `auto`)."""
        ...

    def snapshot(self) -> placement_inventory.Inventory:
        """Free GPU capacity now."""
        ...

    def device(self, attempt: Attempt) -> workload.Device:
        """How the attempt's pods get their GPU."""
        ...

    def assume(self, attempt: Attempt) -> None:
        """Count the attempt's devices as taken until its pods are seen."""
        ...

    def forget(self, attempt: Attempt) -> None:
        """Stop counting the devices of an attempt whose workload was not created."""
        ...

    def launch(self, cluster: ports.Cluster, attempt: Attempt) -> Launched:
        """Create the Job suspended, give it its GPU, resume it.

        Safe to repeat: an existing Job that is suspended is given its GPU and resumed, one
        that runs is left alone.

        Raises:
            errors.ApiError: the API server refused or failed.
        """
        ...


class ExtendedResources:
    """GPUs as a device plugin's extended resources, given through KEP-5440.

    Args:
        inventory: nodes and GPU pods, kept current by the watches.
    """

    def __init__(self, inventory: inventory_cache.InventoryCache) -> None:
        self.inventory = inventory

    @property
    def kind(self) -> GpuBackend:
        """`extended`."""
        return GpuBackend.EXTENDED

    def snapshot(self) -> placement_inventory.Inventory:
        """Node allocatable minus what pods request."""
        return self.inventory.snapshot()

    def device(self, attempt: Attempt) -> workload.ExtendedResource:
        """One unit of the placement's resource."""
        return workload.ExtendedResource(attempt.placed.placement.resource)

    def assume(self, attempt: Attempt) -> None:
        """The Job's pods, counted before the watch reports them."""
        self.inventory.assume(attempt.job(self.device(attempt)))

    def forget(self, attempt: Attempt) -> None:
        """The Job's pods, no longer counted."""
        self.inventory.forget(attempt.job(self.device(attempt)))

    def launch(self, cluster: ports.Cluster, attempt: Attempt) -> Launched:
        """Create the Job without its GPU, then patch the GPU in while it is suspended and resume
        it. A Job found suspended (an operator stopped half-way, or a move to another device,
        `waiting`) is made what the attempt says, whatever GPU it had.

        Raises:
            errors.UnavailableError: the Job was suspended moments ago and the Job controller
                has not reset its start time yet, so its pods cannot change yet (transient).
        """
        device = self.device(attempt)
        job = attempt.job(device)
        created, stored = cluster.create_job(workload.without_extended_resource(job, device))
        if not workload.is_suspended(stored):
            return Launched.RUNNING
        # One update gives the GPU and resumes: the apiserver judges the change by the Job as
        # stored, which is suspended (one write fewer per attempt under a burst).
        patch = workload.catch_up_patch(stored, job, resume=True)
        if workload.changes_template(patch) and not workload.unstarted(stored):
            raise errors.UnavailableError(
                f"Job {attempt.name} is suspended but the Job controller has not reset it yet "
                "(its start time is set), so its pods cannot be given another device yet"
            )
        cluster.patch_job(attempt.ref.namespace, attempt.name, patch, strategic=True)
        return Launched.CREATED if created else Launched.RESUMED


class DynamicResources:
    """GPUs as the DRA driver publishes them, asked for with a claim of the plan's ladder.

    Args:
        inventory: the driver's slices, the claims' allocations and the nodes.
    """

    def __init__(self, inventory: dra_inventory.DraInventoryCache) -> None:
        self.inventory = inventory

    @property
    def kind(self) -> GpuBackend:
        """`dra`."""
        return GpuBackend.DRA

    def snapshot(self) -> placement_inventory.Inventory:
        """The driver's devices minus what claims hold."""
        return self.inventory.snapshot()

    def device(self, attempt: Attempt) -> workload.ClaimTemplate:
        """A claim from the template named after the Job."""
        return workload.ClaimTemplate(attempt.name)

    def assume(self, attempt: Attempt) -> None:
        """The planned kind counted once per replica until a claim of the attempt is allocated."""
        placement = attempt.placed.placement
        kind = (placement.product_label, placement.resource)
        self.inventory.assume(attempt.key, kind, attempt.spec.replicas)

    def forget(self, attempt: Attempt) -> None:
        """The planned kind no longer counted."""
        self.inventory.forget(attempt.key)

    def launch(self, cluster: ports.Cluster, attempt: Attempt) -> Launched:
        """Create the Job (its pods name the template), then the template, then resume.

        Raises:
            ValueError: the plan has no rung, so no claim could ever be allocated.
        """
        created, stored = cluster.create_job(attempt.job(self.device(attempt)))
        if not workload.is_suspended(stored):
            return Launched.RUNNING
        made = self._ladder(attempt)
        template = ladder.build_template(made, attempt.ref, attempt.placed.attempt, stored)
        cluster.create_claim_template(template)
        cluster.patch_job(
            attempt.ref.namespace, attempt.name, workload.RESUME_PATCH, strategic=False
        )
        return Launched.CREATED if created else Launched.RESUMED

    def _ladder(self, attempt: Attempt) -> plan.Plan:
        placement = attempt.placed.placement
        if attempt.plan is not None:
            return ladder.for_claim(attempt.plan, placement)
        return ladder.recorded(
            attempt.prediction,
            self.snapshot(),
            attempt.spec.placement,
            placement,
            attempt.recorded_plan,
        )


def build(
    kind: GpuBackend,
    nodes_and_pods: inventory_cache.InventoryCache,
    devices: dra_inventory.DraInventoryCache,
) -> Backend:
    """The backend of a resolved kind."""
    if kind is GpuBackend.DRA:
        return DynamicResources(devices)
    if kind is GpuBackend.EXTENDED:
        return ExtendedResources(nodes_and_pods)
    raise ValueError(f"resolve {kind} first")
