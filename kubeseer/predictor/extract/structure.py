"""The graph as a static data-flow graph: every node read once, control flow and dangling
inputs refused, model-local functions inlined."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import onnx

from kubeseer.predictor import errors

DEFAULT_DOMAINS: Final[frozenset[str]] = frozenset({"", "ai.onnx"})


@dataclass(frozen=True, slots=True)
class Node:
    """A graph node with its fields read out of protobuf once; every read is a C call."""

    proto: onnx.NodeProto
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


_CONTROL_FLOW_OPS: Final[frozenset[str]] = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def check(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[Node]]:
    """Refuse what is not a static ONNX graph; inline model-local functions.

    Returns the (possibly inlined) model and its nodes in file order.
    """
    if not model.HasField("graph") or not model.graph.node:
        raise errors.NotOnnxError("not an ONNX model, or a truncated one: it has no graph nodes")
    if not any(op.domain in ("", "ai.onnx") for op in model.opset_import):
        raise errors.NotOnnxError(
            "not an ONNX model, or a truncated one: it imports no version of the ONNX opset"
        )
    _refuse_negative_dimensions(model.graph)
    if model.functions:
        from onnx import inliner

        return check(inliner.inline_local_functions(model))
    available = {init.name for init in model.graph.initializer}
    available.update(vi.name for vi in model.graph.input)
    if not all(
        isinstance(name, str) for name in (*available, *(o.name for o in model.graph.output))
    ):
        raise errors.NotOnnxError("graph inputs or outputs have names that are not UTF-8 text")
    available.add("")
    nodes: list[Node] = []
    control: set[str] = set()
    for proto in model.graph.node:
        node = Node(
            proto, proto.op_type, proto.domain, proto.name, tuple(proto.input), tuple(proto.output)
        )
        if not all(isinstance(text, str) for text in (node.op_type, node.domain, node.name)) or (
            not all(isinstance(text, str) for text in node.inputs + node.outputs)
        ):
            # protobuf hands back bytes for string fields that are not valid UTF-8.
            raise errors.NotOnnxError(f"node {len(nodes)} has names that are not UTF-8 text")
        nodes.append(node)
        if (
            node.op_type in _CONTROL_FLOW_OPS
            if node.domain in DEFAULT_DOMAINS
            else any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in proto.attribute
            )
        ):
            control.add(f"{node.op_type} ({node.name or 'unnamed'})")
        missing = [name for name in node.inputs if name not in available]
        if missing and not control:
            raise errors.MalformedGraphError(
                f"{node.op_type} node {node.name or '(unnamed)'} reads {missing}, which no "
                "earlier node, initializer or graph input provides"
            )
        available.update(node.outputs)
    if control:
        raise errors.ControlFlowError(
            "the graph has control flow, whose cost depends on run-time values: "
            + ", ".join(sorted(control))
            + "; export with static shapes and unrolled loops"
        )
    return model, nodes


def _refuse_negative_dimensions(graph: onnx.GraphProto) -> None:
    """No tensor has fewer than zero elements along an axis: a declared negative dimension is a
    corrupt file, not something to estimate (it made the memory estimate non-finite)."""
    declared: list[tuple[str, list[int | str]]] = [
        (init.name, list(init.dims)) for init in graph.initializer
    ]
    for value_info in (*graph.input, *graph.output, *graph.value_info):
        if value_info.type.HasField("tensor_type"):
            shape = value_info.type.tensor_type.shape
            declared.append(
                (
                    value_info.name,
                    [d.dim_value if d.HasField("dim_value") else d.dim_param for d in shape.dim],
                )
            )
    for name, dims in declared:
        negative = [d for d in dims if isinstance(d, int) and d < 0]
        if negative:
            raise errors.MalformedGraphError(
                f"tensor {name!r} declares the negative dimension {negative[0]} (dims {dims}): "
                "the model is corrupt"
            )


def attributes(node: onnx.NodeProto) -> dict[str, int | list[int] | str]:
    """The integer, integer-list and string attributes of a node (the rest never matter)."""
    found: dict[str, int | list[int] | str] = {}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.INT:
            found[attribute.name] = int(attribute.i)
        elif attribute.type == onnx.AttributeProto.INTS:
            found[attribute.name] = [int(v) for v in attribute.ints]
        elif attribute.type == onnx.AttributeProto.STRING:
            found[attribute.name] = attribute.s.decode("utf-8", "replace")
    return found
