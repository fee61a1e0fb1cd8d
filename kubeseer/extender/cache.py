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

What a call reads of a node is its `decide.Situation` (devices and units held), kept current
here as events arrive and interned: nodes in the same situation share one object, so a call
decides once per situation, not once per node. A node's watch event that changes nothing the
extender reads (KWOK's and the kubelet's status heartbeats: conditions, timestamps) is dropped
after a comparison of its labels and allocatable, without reading the node again.

Every method takes the one lock: watch threads write while request threads read.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
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


_SituationKey = tuple[tuple[tuple[str, nodes.Device], ...], str | None, tuple[tuple[str, int], ...]]
_Fingerprint = tuple[Any, Any, Any]
"""What the extender reads of a node object: labels, allocatable, unschedulable."""


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
        self._seen: dict[str, _Fingerprint] = {}
        self._holdings: dict[str, _Holding] = {}
        self._used: dict[str, dict[str, int]] = {}
        self._assumed: dict[str, _Assumption] = {}
        self._situations: dict[str, decide.Situation] = {}
        self._interned: weakref.WeakValueDictionary[_SituationKey, decide.Situation] = (
            weakref.WeakValueDictionary()
        )

    # -- node informer sink ------------------------------------------------------------------

    def replace_nodes(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of every node: forget nodes no longer listed."""
        seen = {}
        fresh = {}
        for obj in objects:
            gpus = nodes.from_node(obj)
            if gpus.name:
                fresh[gpus.name] = gpus
                seen[gpus.name] = _fingerprint(obj)
        with self._lock:
            self._nodes = fresh
            self._seen = seen
            self._situations = {}
            for name in fresh:
                self._situate(name)

    def apply_node(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of a node."""
        metadata = obj.get("metadata")
        name = str(metadata.get("name") or "") if isinstance(metadata, dict) else ""
        if not name:
            return
        if event_type == "DELETED":
            with self._lock:
                self._nodes.pop(name, None)
                self._seen.pop(name, None)
                self._situations.pop(name, None)
            return
        fingerprint = _fingerprint(obj)
        with self._lock:
            if self._seen.get(name) == fingerprint:
                return
        gpus = nodes.from_node(obj)
        with self._lock:
            self._nodes[name] = gpus
            self._seen[name] = fingerprint
            self._situate(name)

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
            for name in self._nodes:
                self._situate(name)

    def apply_pod(self, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event of a pod: a pod bound, finished or deleted changes what is held."""
        uid, holding = _holding(obj)
        if not uid:
            return
        with self._lock:
            released = self._release(uid)
            if holding is not None:
                self._assumed.pop(uid, None)
                if event_type != "DELETED":
                    self._hold(uid, holding)
            for node in {released, holding.node if holding is not None else None}:
                if node is not None:
                    self._situate(node)

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
    ) -> tuple[list[tuple[str, decide.Situation]], list[str]]:
        """The named nodes with their situations (`decide.Candidate`s, as plain pairs), and the
        names the cache does not know (yet). `with_assumed` counts assumed pods' units."""
        with self._lock:
            known = self._situations
            situations = list(map(known.get, names))
            found = [
                (name, situation)
                for name, situation in zip(names, situations, strict=True)
                if situation is not None
            ]
            if with_assumed and self._assumed:
                found = self._with_assumed(found)
        if len(found) == len(names):
            return found, []
        return found, [n for n, s in zip(names, situations, strict=True) if s is None]

    def counts(self) -> tuple[int, int]:
        """(nodes, pods holding NVIDIA units) in the cache."""
        with self._lock:
            return len(self._nodes), len(self._holdings)

    # -- under the lock ----------------------------------------------------------------------

    def _situate(self, node: str) -> None:
        """Bring `node`'s situation up to date after its object or its holdings changed."""
        gpus = self._nodes.get(node)
        if gpus is None:
            self._situations.pop(node, None)
            return
        self._situations[node] = self._intern(
            gpus.devices, gpus.problem, self._used.get(node, _NOTHING)
        )

    def _intern(
        self, devices: Mapping[str, nodes.Device], problem: str | None, used: Mapping[str, int]
    ) -> decide.Situation:
        key = (tuple(sorted(devices.items())), problem, tuple(sorted(used.items())))
        found = self._interned.get(key)
        if found is None:
            found = decide.Situation(devices, problem, MappingProxyType(dict(used)))
            self._interned[key] = found
        return found

    def _with_assumed(
        self, found: list[tuple[str, decide.Situation]]
    ) -> list[tuple[str, decide.Situation]]:
        """`found` with the units of assumed pods added to their nodes' situations."""
        extra = self._assumed_units()
        if not extra:
            return found
        return [(n, self._plus(s, extra[n])) if n in extra else (n, s) for n, s in found]

    def _plus(self, situation: decide.Situation, more: Mapping[str, int]) -> decide.Situation:
        used = situation.used
        held = {r: used.get(r, 0) + more.get(r, 0) for r in used.keys() | more.keys()}
        return self._intern(situation.devices, situation.problem, held)

    def _hold(self, uid: str, holding: _Holding) -> None:
        self._holdings[uid] = holding
        used = self._used.setdefault(holding.node, {})
        for resource, units in holding.units.items():
            used[resource] = used.get(resource, 0) + units

    def _release(self, uid: str) -> str | None:
        """Stop counting a pod's units; returns the node that held them."""
        holding = self._holdings.pop(uid, None)
        if holding is None:
            return None
        used = self._used.get(holding.node, {})
        for resource, units in holding.units.items():
            left = used.get(resource, 0) - units
            if left > 0:
                used[resource] = left
            else:
                used.pop(resource, None)
        if not used:
            self._used.pop(holding.node, None)
        return holding.node

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


def _fingerprint(obj: Mapping[str, Any]) -> _Fingerprint:
    metadata = obj.get("metadata")
    spec = obj.get("spec")
    status = obj.get("status")
    return (
        metadata.get("labels") if isinstance(metadata, dict) else None,
        status.get("allocatable") if isinstance(status, dict) else None,
        spec.get("unschedulable") if isinstance(spec, dict) else None,
    )


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
