"""What eager PyTorch keeps alive that a data-flow graph does not say: a module's inputs.

A graph frees a tensor after its last reader. Eager PyTorch frees it when the last Python
reference goes, and a module call holds one on each of its arguments until ``forward``
returns: the caller's local (``x = self.blocks(x)`` rebinds ``x`` only after the call) or the
temporary on the caller's stack (``x + self.mlp(self.norm2(x))`` keeps ``norm2``'s output while
the MLP runs). So a transformer block's normalised input stays alive through its MLP, a
window partition's copy through the window attention, and the input of a stage through every
block of the stage. On timm's torch 2 inference the estimate without this was a median 18-19 %
under the derived live peak (docs/predictor.md).

Module calls are read off the node names PyTorch's TorchScript exporter writes, the module path
of each operator (``/layer1/layer1.0/conv1/Conv`` ran in ``layer1``, then ``layer1.0``, then
``conv1``). A call is a maximal run of operators, in execution order, under one module path: a
module called twice is two calls. Graphs whose names carry no path (the dynamo exporter's
``node_Conv_3``, hand-written ONNX) have no calls and keep the graph's own lifetimes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleCall:
    """One run of a module's ``forward``: its operators, and the last of them to run (a node,
    and its position in the execution order)."""

    scope: str
    members: frozenset[int]
    last: int
    last_position: int


def scope_of(node_name: str) -> str:
    """The module path `node_name` ran under (``"layer1/layer1.0/conv1"``), ``""`` for an
    operator of the top-level ``forward`` or a name that carries no path."""
    if not node_name.startswith("/"):
        return ""
    return node_name[1:].rpartition("/")[0]


def _prefixes(scope: str) -> list[str]:
    """`scope` and every module path enclosing it, outermost first."""
    if not scope:
        return []
    parts = scope.split("/")
    return ["/".join(parts[: depth + 1]) for depth in range(len(parts))]


def module_calls(scopes: Sequence[str], order: Sequence[int]) -> list[ModuleCall]:
    """Every module call in a graph whose node `n` ran under ``scopes[n]``, run in `order`."""
    calls: list[ModuleCall] = []
    open_runs: dict[str, list[int]] = {}
    position = {node: i for i, node in enumerate(order)}

    def close(scope: str) -> None:
        run = open_runs.pop(scope)
        calls.append(ModuleCall(scope, frozenset(run), run[-1], position[run[-1]]))

    for node in order:
        enclosing = _prefixes(scopes[node])
        for scope in [s for s in open_runs if s not in enclosing]:
            close(scope)
        for scope in enclosing:
            open_runs.setdefault(scope, []).append(node)
    for scope in list(open_runs):
        close(scope)
    return calls


def held_until(calls: Sequence[ModuleCall], producers: Sequence[Sequence[int]]) -> dict[int, int]:
    """Node -> the last operator of the latest-ending call it is an argument of. A node is an
    argument of a call when an operator inside the call reads it and it ran outside."""
    held: dict[int, ModuleCall] = {}
    for call in calls:
        for member in call.members:
            for producer in producers[member]:
                if producer in call.members:
                    continue
                current = held.get(producer)
                if current is None or current.last_position < call.last_position:
                    held[producer] = call
    return {node: call.last for node, call in held.items()}
