"""kube-scheduler's HTTP extender protocol, written down once.

The types mirror `k8s.io/kube-scheduler/extender/v1/types.go` (v0.37.2). Those Go structs have
no JSON tags, so the keys on the wire are the Go field names themselves (`Pod`, `NodeNames`,
`FailedNodes`, `Host`, `Score`); the objects inside (`Pod`, `Nodes.items[]`) are ordinary
Kubernetes JSON in camelCase. kube-scheduler always sends capitalised keys; its decoder is
case-insensitive, but we answer with the exact names so that a reader can grep for them.

Only the verbs kubeseer configures are here: `filter` and `prioritize`. The `preempt` and `bind`
verbs (`ExtenderPreemptionArgs`, `ExtenderBindingArgs`) are left unset in the scheduler
configuration, so kube-scheduler never sends them.

Any change to this module is an API change: tests/unit/extender/test_wire.py pins the JSON both
ways, against request bodies captured from the real kube-scheduler.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, cast

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "MIN_EXTENDER_PRIORITY",
    "ExtenderArgs",
    "ExtenderFilterResult",
    "HostPriority",
    "HostPriorityList",
    "NodeList",
    "WireError",
    "candidate_names",
    "clamp_score",
    "encode",
    "error_filter_result",
    "filter_result",
    "host_priorities",
    "parse_args",
]

MIN_EXTENDER_PRIORITY = 0
"""`extenderv1.MinExtenderPriority`: the lowest score a prioritize answer may give."""
MAX_EXTENDER_PRIORITY = 10
"""`extenderv1.MaxExtenderPriority`: the highest score; kube-scheduler multiplies it by the
extender's weight and by `MaxNodeScore / MaxExtenderPriority` (= 10)."""


class WireError(ValueError):
    """A request body that is not an `ExtenderArgs` (answered with HTTP 400)."""


class NodeList(TypedDict, total=False):
    """`v1.NodeList` as Go encodes it; only `items` is read."""

    apiVersion: str  # "v1" when set; kube-scheduler leaves TypeMeta empty
    kind: str  # "NodeList" when set
    metadata: dict[str, Any]  # ListMeta, empty from kube-scheduler
    items: list[dict[str, Any]]  # whole v1.Node objects


class ExtenderArgs(TypedDict):
    """The body of `POST <urlPrefix>/filter` and `POST <urlPrefix>/prioritize`."""

    Pod: dict[str, Any]  # the v1.Pod being scheduled (metadata, spec, status), read-only
    Nodes: NodeList | None  # candidate nodes in full; only when nodeCacheCapable is false
    NodeNames: list[str] | None  # candidate node names; only when nodeCacheCapable is true


class ExtenderFilterResult(TypedDict):
    """The answer to `filter`.

    The passing nodes go in `NodeNames` (nodeCacheCapable) or `Nodes`; kube-scheduler rejects an
    answer that names a node it did not send. A node in neither list nor a failed map is simply
    dropped. Messages are what `kubectl describe pod` shows in the FailedScheduling event,
    counted per distinct message ("3 <message>"), so they should not name the node.
    """

    Nodes: NodeList | None  # nodes that pass, in full; only when nodeCacheCapable is false
    NodeNames: list[str] | None  # names of nodes that pass; only when nodeCacheCapable is true
    FailedNodes: dict[str, str]  # node -> why it fails; preemption might make room there
    FailedAndUnresolvableNodes: dict[str, str]  # node -> why; preemption cannot help (wins)
    Error: str  # non-empty fails the whole call (the pod then waits, unless ignorable)


class HostPriority(TypedDict):
    """One node's score in the answer to `prioritize`."""

    Host: str  # node name, one of the candidates sent
    Score: int  # MIN_EXTENDER_PRIORITY..MAX_EXTENDER_PRIORITY, higher is better


HostPriorityList = list[HostPriority]
"""The answer to `prioritize`: a JSON array of `HostPriority`; nodes left out score 0."""


def parse_args(body: bytes) -> ExtenderArgs:
    """Decode and check a request body; `WireError` says what is wrong with it."""
    try:
        decoded = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"request body is not JSON: {e}") from e
    if not isinstance(decoded, dict):
        raise WireError("request body must be a JSON object (ExtenderArgs)")
    pod = decoded.get("Pod")
    if not isinstance(pod, dict):
        raise WireError("ExtenderArgs.Pod must be a v1.Pod object")
    for part in ("metadata", "spec"):
        if not isinstance(pod.get(part), dict):
            raise WireError(f"ExtenderArgs.Pod.{part} must be an object")
    names = decoded.get("NodeNames")
    nodes = decoded.get("Nodes")
    if names is not None and not (
        isinstance(names, list) and all(map(isinstance, names, itertools.repeat(str)))
    ):
        raise WireError("ExtenderArgs.NodeNames must be a list of node names")
    if nodes is not None:
        items = nodes.get("items") if isinstance(nodes, dict) else None
        if not isinstance(items, list) or not all(_node_name(n) for n in items):
            raise WireError("ExtenderArgs.Nodes must be a v1.NodeList whose items are named")
    if (names is None) == (nodes is None):
        raise WireError("ExtenderArgs needs exactly one of NodeNames and Nodes")
    return {
        "Pod": pod,
        "Nodes": cast(NodeList | None, nodes),
        "NodeNames": cast(list[str] | None, names),
    }


def candidate_names(args: ExtenderArgs) -> list[str]:
    """The candidate nodes' names, in the order sent, whichever form they came in."""
    if args["NodeNames"] is not None:
        return list(args["NodeNames"])
    nodes = args["Nodes"] or {}
    return [_node_name(n) for n in nodes.get("items", [])]


def filter_result(
    args: ExtenderArgs,
    passed: Sequence[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
) -> ExtenderFilterResult:
    """The answer to `filter`, in the form the request came in.

    With `NodeNames` the passing names are returned, as a list even when empty (kube-scheduler
    reads null `NodeNames` and null `Nodes` as "no node passes"); with `Nodes` the passing node
    objects are echoed back as sent.
    """
    if args["NodeNames"] is not None:
        return {
            "Nodes": None,
            "NodeNames": list(passed),
            "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": dict(unresolvable),
            "Error": "",
        }
    keep = set(passed)
    items = [n for n in (args["Nodes"] or {}).get("items", []) if _node_name(n) in keep]
    return {
        "Nodes": {"items": items},
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": "",
    }


def error_filter_result(message: str) -> ExtenderFilterResult:
    """A `filter` answer that fails the call with `message` (kube-scheduler logs it)."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def clamp_score(score: float) -> int:
    """A score as kube-scheduler accepts it: an integer in 0..10."""
    whole = score if isinstance(score, int) else round(score)
    return (
        MAX_EXTENDER_PRIORITY
        if whole > MAX_EXTENDER_PRIORITY
        else max(MIN_EXTENDER_PRIORITY, whole)
    )


def host_priorities(scores: Iterable[tuple[str, float]]) -> HostPriorityList:
    """The answer to `prioritize`, scores clamped to the extender range (once per distinct
    score: a thousand nodes share a handful)."""
    clamped: dict[float, int] = {}
    answer: HostPriorityList = []
    for host, score in scores:
        value = clamped.get(score)
        if value is None:
            value = clamped[score] = clamp_score(score)
        answer.append({"Host": host, "Score": value})
    return answer


def encode(answer: ExtenderFilterResult | HostPriorityList | Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON, keys in declaration order (what the golden tests pin)."""
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _node_name(node: object) -> str:
    """`metadata.name` of a node object, "" when it has none."""
    if not isinstance(node, dict):
        return ""
    metadata = node.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""
