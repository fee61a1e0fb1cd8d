"""Errors of the local control plane, one small hierarchy so callers can tell bad input
(an inventory, a missing build) from a cluster that failed to come up."""

from __future__ import annotations


class DevClusterError(Exception):
    """Base class of every error raised by `kubeseer.devcluster`."""


class InventoryError(DevClusterError, ValueError):
    """The fake-node inventory file is malformed or describes impossible hardware."""


class ConfigError(DevClusterError, ValueError):
    """A launcher option kube-scheduler or the apiserver would refuse (say, an extender URL)."""


class BinariesMissingError(DevClusterError):
    """A control-plane binary is not in the cache; the message says how to build it."""


class ClusterStartError(DevClusterError):
    """A component exited or did not become ready in time; the message carries its log tail."""


class ClusterStateError(DevClusterError):
    """No usable state file: no cluster was started in that run directory, or it is stale."""
