"""The ResourceClaimTemplate that asks Dynamic Resource Allocation for a plan's ladder.

Under DRA (`resource.k8s.io/v1`) a pod does not name a device: it points at a claim, and the
scheduler allocates a device that the claim's request selects. A plan's ladder (its fitting
rows, cheapest first) becomes one request whose `firstAvailable` list has one sub-request per
rung, so the scheduler takes the cheapest rung with a free device. Each rung selects devices by
CEL on what the NVIDIA DRA driver publishes (docs/placement.md, "DRA"): the device class
(`gpu.nvidia.com` for whole GPUs, `mig.nvidia.com` for MIG devices), the `productName`
attribute, and the `memory` (usable) and `multiprocessors` capacities, never by profile name:

* usable memory at least the plan's need, which is what makes the device hold the job;
* for a MIG rung, memory below the next larger MIG size of that GPU and no more SMs than the
  profile has, which keeps a cheap rung from being filled by a larger, costlier device;
* and no fewer SMs than the profile has either: the plan judged the rung's slowdown on its
  SMs, and a smaller device that holds the memory may be off the ladder as too slow. Without
  this bound the scheduler fills a `3g.40gb` rung with the first device that matches, which on
  dynamic MIG is a `1g.10gb` placement (devices are listed by name).

Pure: manifests are plain dicts typed as `TypedDict`s; the DRA backend creates them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from kubeseer.placement import catalogue, plan

__all__ = [
    "DRIVER",
    "GPU_DEVICE_CLASS",
    "MAX_RUNGS",
    "MIG_DEVICE_CLASS",
    "REQUEST_NAME",
    "Allocation",
    "ResourceClaimTemplate",
    "build_claim_template",
    "read_allocation",
    "rung_name",
    "rung_selectors",
]

DRIVER = "gpu.nvidia.com"
"""The NVIDIA DRA driver's name: the domain of its attributes and capacities in CEL."""

GPU_DEVICE_CLASS = "gpu.nvidia.com"
"""DeviceClass of whole GPUs (the driver's `type == 'gpu'`)."""

MIG_DEVICE_CLASS = "mig.nvidia.com"
"""DeviceClass of MIG devices (`type == 'mig'`)."""

MAX_RUNGS = 8
"""`resource.k8s.io/v1` allows at most 8 `firstAvailable` sub-requests; the cheapest are kept."""

REQUEST_NAME = "gpu"
"""Name of the claim's one request; containers reference the claim, the allocation this name."""

API_VERSION = "resource.k8s.io/v1"


class CelSelector(TypedDict):
    """`DeviceSelector.cel`."""

    expression: str


class DeviceSelector(TypedDict):
    """`DeviceSelector`: only CEL selectors exist in v1."""

    cel: CelSelector


class DeviceSubRequest(TypedDict):
    """One rung: `DeviceSubRequest` of a `firstAvailable` list."""

    name: str
    deviceClassName: str
    selectors: list[DeviceSelector]
    allocationMode: str
    count: int


class DeviceRequest(TypedDict):
    """`DeviceRequest` with a prioritized list instead of an exact request."""

    name: str
    firstAvailable: list[DeviceSubRequest]


class DeviceClaim(TypedDict):
    """`DeviceClaim`: the requests of a claim."""

    requests: list[DeviceRequest]


class ClaimSpec(TypedDict):
    """`ResourceClaimSpec`."""

    devices: DeviceClaim


class TemplateSpec(TypedDict):
    """`ResourceClaimTemplateSpec`: metadata and spec of every claim made from it."""

    spec: ClaimSpec


class Metadata(TypedDict):
    """The metadata kubeseer sets."""

    name: str
    namespace: str
    labels: NotRequired[dict[str, str]]


class ResourceClaimTemplate(TypedDict):
    """A `resource.k8s.io/v1` ResourceClaimTemplate."""

    apiVersion: str
    kind: str
    metadata: Metadata
    spec: TemplateSpec


def rung_selectors(row: plan.Row, need_bytes: int) -> list[str]:
    """CEL expressions selecting the devices of one rung that hold `need_bytes`."""
    c = row.candidate
    gpu, profile = c.gpu, c.profile
    names = ", ".join(_cel_string(n) for n in gpu.product_names)
    expressions = [
        f"device.attributes['{DRIVER}'].productName in [{names}]",
        _capacity("memory", ">=", f"{math.ceil(need_bytes / catalogue.MIB)}Mi"),
    ]
    if profile.is_whole_gpu:
        return expressions
    larger = [
        p.usable_memory_bytes
        for p in gpu.profiles
        if p.usable_memory_bytes > profile.usable_memory_bytes
    ]
    if larger:
        expressions.append(_capacity("memory", "<", f"{min(larger) // catalogue.MIB}Mi"))
    if profile.sms is not None:
        expressions.append(_capacity("multiprocessors", "<=", str(profile.sms)))
        expressions.append(_capacity("multiprocessors", ">=", str(profile.sms)))
    return expressions


def build_claim_template(
    ladder_plan: plan.Plan,
    name: str,
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
) -> ResourceClaimTemplate:
    """The template whose one request is the plan's ladder, cheapest rung first.

    Rungs that would select the same devices (two product labels of one GPU model) appear
    once; at most `MAX_RUNGS` are kept. Raises ValueError for a plan with an empty ladder:
    a claim that selects nothing would wait forever.
    """
    rungs: list[DeviceSubRequest] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for row in ladder_plan.ladder:
        device_class = GPU_DEVICE_CLASS if row.candidate.profile.is_whole_gpu else MIG_DEVICE_CLASS
        expressions = tuple(rung_selectors(row, ladder_plan.need_bytes))
        if (device_class, expressions) in seen:
            continue
        seen.add((device_class, expressions))
        rungs.append(
            {
                "name": rung_name(row),
                "deviceClassName": device_class,
                "selectors": [{"cel": {"expression": e}} for e in expressions],
                "allocationMode": "ExactCount",
                "count": 1,
            }
        )
    if not rungs:
        raise ValueError("the plan has no rung that holds the job; there is nothing to claim")
    metadata: Metadata = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": REQUEST_NAME, "firstAvailable": rungs[:MAX_RUNGS]}]
                }
            }
        },
    }


def _capacity(name: str, operator: str, quantity: str) -> str:
    return f"device.capacity['{DRIVER}'].{name}.compareTo(quantity('{quantity}')) {operator} 0"


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Allocation:
    """The device the scheduler allocated to a claim of `build_claim_template`'s shape.

    `rung` is the `firstAvailable` sub-request that was satisfied (`rung_name` of a plan row);
    `first_choice` says whether it was the claim's first rung. `pool` and `device` name the
    device in the driver's ResourceSlices (for NVIDIA's driver: the node, `gpu-0-mig-...`).
    """

    rung: str
    driver: str
    pool: str
    device: str
    first_choice: bool


def read_allocation(claim: Mapping[str, Any]) -> Allocation | None:
    """What a ResourceClaim (as the API returns it, a plain dict) was allocated, if anything.

    The result's `request` is `<request>/<sub-request>` when a `firstAvailable` rung was chosen
    (`status.allocation.devices.results`, KEP-4816). None while the claim is unallocated;
    ValueError for a claim that is not one request of one device from a ladder.
    """
    results = (
        ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    )
    if not results:
        return None
    requests = claim.get("spec", {}).get("devices", {}).get("requests", [])
    if len(results) != 1 or len(requests) != 1 or "firstAvailable" not in requests[0]:
        raise ValueError("not a claim of one request of one device from a firstAvailable ladder")
    (result,) = results
    request, _, rung = str(result["request"]).partition("/")
    if request != requests[0]["name"] or not rung:
        raise ValueError(f"allocation result for {result['request']!r} names no rung")
    return Allocation(
        rung=rung,
        driver=str(result["driver"]),
        pool=str(result["pool"]),
        device=str(result["device"]),
        first_choice=rung == requests[0]["firstAvailable"][0]["name"],
    )


def rung_name(row: plan.Row) -> str:
    """`r<rank>-<gpu>-<profile>` as a DNS label (what sub-request names must be)."""
    c = row.candidate
    raw = f"r{row.rank}-{c.gpu.key}-{c.profile.name or 'whole'}".lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")[:63]
