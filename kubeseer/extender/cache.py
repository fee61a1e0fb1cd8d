"""Nodes and the GPU units pods hold on them, kept in memory from watches.

kube-scheduler calls the extender once or twice per pod it schedules; listing nodes and pods
from the API server on each call would cost tens of milliseconds at a thousand nodes and load
the API server in proportion to the scheduling rate. Instead the informers (`informer.py`) feed
this cache and a call only reads it.

Binding is asynchronous: kube-scheduler binds the pod after the extender answered, so for a
moment the watch has not seen a decision yet. When `prioritize` picked a node the pod is
*assumed* there, counted as holding its units for scoring until the watch shows it bound (or
`assume_ttl_s` passes: the scheduler may have bound elsewhere, or not at all). The filter's
capacity check never counts assumed pods, so a stale assumption cannot fail a node;
kube-scheduler's own resource filter already counts the pods it assumed.

Every method takes the one lock: watch threads write while request threads read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kubeseer.extender import decide, nodes, pods

__all__ = ["ClusterCache"]

log = logging.getLogger(__name__)

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_NOTHING: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class _Holding:
    """The NVIDIA units one pod holds on one node."""

    node: str
    units: Mapping[str, int]


@dataclass(frozen=True)
class _Assumption:
    holding: _Holding
    expires: float


class ClusterCache:
    """Watch-fed node and pod state; thread-safe.

    Args:
        assume_ttl_s: how long a prioritize decision counts before the watch confirms it.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self, *, assume_ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.assume_ttl_s = assume_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, nodes.NodeGpus] = {}
        self._holdings: dict[str, _Holding] = {}
        self._used: dict[str, dict[str, int]] = {}
        self._assumed: dict[str, _Assumption] = {}

    # -- node informer sink ------------------------------------------------------------------

    def replace_nodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of every node: forget nodes no longer listed."""
        fresh = {gpus.name: gpus for gpus in map(nodes.from_node, objects) if gpus.name}
        with self._lock:
            self._nodes = fresh

    def apply_node(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of a node."""
        gpus = nodes.from_node(obj)
        if not gpus.name:
            return
        with self._lock:
            if event_type == "DELETED":
                self._nodes.pop(gpus.name, None)
            else:
                self._nodes[gpus.name] = gpus

    # -- pod informer sink -------------------------------------------------------------------

    def replace_pods(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of bound pods: rebuild what every node holds."""
        holdings = {}
        for obj in objects:
            uid, holding = _holding(obj)
            if holding is not None:
                holdings[uid] = holding
        with self._lock:
            self._holdings = {}
            self._used = {}
            for uid, holding in holdings.items():
                self._hold(uid, holding)

    def apply_pod(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event of a pod: a pod bound, finished or deleted changes what is held."""
        uid, holding = _holding(obj)
        if not uid:
            return
        with self._lock:
            self._release(uid)
            if holding is not None:
                self._assumed.pop(uid, None)
                if event_type != "DELETED":
                    self._hold(uid, holding)

    # -- what calls read ---------------------------------------------------------------------

    def assume(self, demand: pods.Demand, node: str) -> None:
        """Count `demand`'s units on `node` for scoring until the watch sees the pod bound."""
        if not demand.uid or not demand.requests:
            return
        with self._lock:
            if demand.uid in self._holdings:
                return
            holding = _Holding(node=node, units=dict(demand.requests))
            self._assumed[demand.uid] = _Assumption(holding, self._clock() + self.assume_ttl_s)

    def candidates(
        self, names: Sequence[str], *, with_assumed: bool
    ) -> tuple[list[decide.Candidate], list[str]]:
        """The named nodes as candidates, and the names the cache does not know (yet)."""
        found: list[decide.Candidate] = []
        missing: list[str] = []
        with self._lock:
            extra = self._assumed_units() if with_assumed else {}
            known = self._nodes
            holding = self._used
            for name in names:
                gpus = known.get(name)
                if gpus is None:
                    missing.append(name)
                    continue
                # Not copied: decisions only look counts up (never iterate), and a watch event
                # changing one during the call is no different from one arriving just after.
                used = holding.get(name, _NOTHING)
                more = extra.get(name)
                if more:
                    used = {r: used.get(r, 0) + more.get(r, 0) for r in used.keys() | more.keys()}
                found.append(decide.Candidate(gpus, used))
        return found, missing

    def counts(self) -> tuple[int, int]:
        """(nodes, pods holding NVIDIA units) in the cache."""
        with self._lock:
            return len(self._nodes), len(self._holdings)

    # -- under the lock ----------------------------------------------------------------------

    def _hold(self, uid: str, holding: _Holding) -> None:
        self._holdings[uid] = holding
        used = self._used.setdefault(holding.node, {})
        for resource, units in holding.units.items():
            used[resource] = used.get(resource, 0) + units

    def _release(self, uid: str) -> None:
        holding = self._holdings.pop(uid, None)
        if holding is None:
            return
        used = self._used.get(holding.node, {})
        for resource, units in holding.units.items():
            left = used.get(resource, 0) - units
            if left > 0:
                used[resource] = left
            else:
                used.pop(resource, None)
        if not used:
            self._used.pop(holding.node, None)

    def _assumed_units(self) -> dict[str, dict[str, int]]:
        now = self._clock()
        for uid in [u for u, a in self._assumed.items() if a.expires <= now]:
            del self._assumed[uid]
        per_node: dict[str, dict[str, int]] = {}
        for assumption in self._assumed.values():
            node = per_node.setdefault(assumption.holding.node, {})
            for resource, units in assumption.holding.units.items():
                node[resource] = node.get(resource, 0) + units
        return per_node


def _holding(obj: Mapping[str, Any]) -> tuple[str, _Holding | None]:
    """The pod's uid and the NVIDIA units it holds on its node (None: holds nothing)."""
    metadata = obj.get("metadata")
    uid = str(metadata.get("uid") or "") if isinstance(metadata, dict) else ""
    spec = obj.get("spec")
    status = obj.get("status")
    if not isinstance(spec, dict):
        return uid, None
    node = spec.get("nodeName")
    phase = status.get("phase") if isinstance(status, dict) else None
    if not node or phase in _TERMINAL_PHASES:
        return uid, None
    try:
        units = pods.gpu_requests(spec)
    except pods.QuantityError as e:
        log.warning("pod %s: %s; not counted", uid, e)
        return uid, None
    return uid, (_Holding(node=str(node), units=units) if units else None)
