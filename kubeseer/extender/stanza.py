"""What kube-scheduler must be told about the extender: its `extenders` entry, written once.

The deployment manifest (deploy/scheduler/), the local control plane (`kubeseer.devcluster`)
and the tests all take these values from here; a unit test pins the manifest to them.

Why these values:

* `managedResources`: `nvidia.com/gpu` and every `nvidia.com/mig-<profile>` the catalogue knows.
  kube-scheduler only sends a pod to an extender with managed resources when one of its
  containers names one of them, so CPU-only pods never pay for the call, and neither do pods
  whose GPUs come only from DRA claims (their containers name no extended resource). The
  resources are real device-plugin resources, so `ignoredByScheduler` stays false and
  kube-scheduler keeps counting free units itself.
* `nodeCacheCapable: true`: the scheduler sends node names only; the extender has its own
  watch-fed cache (a thousand full Node objects per call would cost more than the decision).
* `ignorable: true`: an extender that is down, slow or answering errors is skipped and the
  pod is scheduled by the default plugins alone, never left pending because of us.
* `weight`: kube-scheduler adds `score x weight x 10` to the plugins' sum. With 30, one step of
  the extender's 0..10 scale is worth 300 points, more than the resource-balancing plugins can
  differ by together (NodeResourcesFit and NodeResourcesBalancedAllocation, 100 each), which
  otherwise spread GPU pods over idle nodes; the extender's best node therefore wins.
"""

from __future__ import annotations

from typing import Any

from kubeseer.placement import catalogue

__all__ = [
    "FILTER_VERB",
    "HTTP_TIMEOUT",
    "PRIORITIZE_VERB",
    "SCHEDULER_NAME",
    "WEIGHT",
    "extender_config",
    "managed_resources",
]

SCHEDULER_NAME = "kubeseer-scheduler"
"""The scheduler profile kubeseer pods name in `spec.schedulerName`."""
FILTER_VERB = "filter"
PRIORITIZE_VERB = "prioritize"
WEIGHT = 30
HTTP_TIMEOUT = "5s"
"""kube-scheduler's default: a filter call that times out is skipped (ignorable)."""


def managed_resources() -> tuple[str, ...]:
    """`nvidia.com/gpu`, then every MIG resource of the catalogue, sorted."""
    mig = {p.resource_name for m in catalogue.MODELS for p in m.profiles}
    return (catalogue.GPU_RESOURCE, *sorted(mig))


def extender_config(url_prefix: str) -> dict[str, Any]:
    """The `extenders[]` entry of a `KubeSchedulerConfiguration` for an extender at `url_prefix`."""
    return {
        "urlPrefix": url_prefix,
        "filterVerb": FILTER_VERB,
        "prioritizeVerb": PRIORITIZE_VERB,
        "weight": WEIGHT,
        "nodeCacheCapable": True,
        "enableHTTPS": url_prefix.startswith("https://"),
        "httpTimeout": HTTP_TIMEOUT,
        "ignorable": True,
        "managedResources": [{"name": r, "ignoredByScheduler": False} for r in managed_resources()],
    }
