"""What extraction knows about each tensor: its static shape and element type, or why it has
none (kept until a node actually needs it), and which constants carry their values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import onnx
from onnx import TensorProto

from kubeseer.predictor import errors, opcount
from kubeseer.predictor.extract import structure

# Initializers up to this size keep their values in the shape-inference copy: shape constants,
# axes and resize scales that inference must read. Larger ones are weights; only their shapes
# matter, so they travel as typed graph inputs.
SHAPE_VALUE_LIMIT_BYTES: Final[int] = 1024


def large_constant(node: structure.Node) -> onnx.TensorProto | None:
    """The tensor of a `Constant` node too large to be shape arithmetic, else None."""
    if node.op_type != "Constant" or node.domain not in structure.DEFAULT_DOMAINS:
        return None
    for attribute in node.proto.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            tensor = attribute.t
            size = (math.prod(tensor.dims) * opcount.element_bits(tensor.data_type) + 7) // 8
            return tensor if size > SHAPE_VALUE_LIMIT_BYTES else None
    return None


def has_small_inline_data(init: onnx.TensorProto) -> bool:
    """Whether an initializer is small and carries its values in the file (not stripped)."""
    if init.data_location == TensorProto.EXTERNAL or not opcount.known_element_type(init.data_type):
        return False
    size = (math.prod(init.dims) * opcount.element_bits(init.data_type) + 7) // 8
    if size > SHAPE_VALUE_LIMIT_BYTES:
        return False
    if size == 0 or init.HasField("raw_data"):
        return True
    return any(
        len(values) > 0
        for values in (
            init.float_data,
            init.int32_data,
            init.int64_data,
            init.double_data,
            init.uint64_data,
            init.string_data,
        )
    )


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Why a tensor has no static shape: kept until a node actually needs it."""

    reason: str
    symbolic: bool


TensorTable = dict[str, opcount.TensorInfo | Unresolved]


def table_of(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> TensorTable:
    table: TensorTable = {}
    for init in (*graph.initializer, *inferred.initializer):
        table[init.name] = (
            opcount.TensorInfo(tuple(init.dims), init.data_type)
            if opcount.known_element_type(init.data_type)
            else Unresolved(f"has unknown element type {init.data_type}", symbolic=False)
        )
    for value_info in (*inferred.input, *inferred.value_info, *inferred.output):
        if value_info.name not in table:
            table[value_info.name] = info_of(value_info)
    return table


def info_of(value_info: onnx.ValueInfoProto) -> opcount.TensorInfo | Unresolved:
    value_type = value_info.type
    if not value_type.HasField("tensor_type"):
        kind = value_type.WhichOneof("value")
        reason = f"is a {kind}, not a tensor" if kind else "has no inferred type"
        return Unresolved(reason, symbolic=False)
    tensor_type = value_type.tensor_type
    if not tensor_type.HasField("shape"):
        return Unresolved("has no inferred shape", symbolic=False)
    shape: list[int] = []
    symbols: list[str] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(dim.dim_value)
        else:
            symbols.append(dim.dim_param or "?")
    if symbols:
        return Unresolved(f"keeps symbolic dimensions {symbols}", symbolic=True)
    if not opcount.known_element_type(tensor_type.elem_type):
        return Unresolved(f"has unknown element type {tensor_type.elem_type}", symbolic=False)
    return opcount.TensorInfo(tuple(shape), tensor_type.elem_type)


def lookup(
    table: Mapping[str, opcount.TensorInfo | Unresolved], name: str, node: structure.Node
) -> opcount.TensorInfo:
    info = table.get(name)
    if isinstance(info, opcount.TensorInfo):
        return info
    where = f"tensor {name!r} of {node.op_type} node {node.name or '(unnamed)'}"
    if node.domain not in structure.DEFAULT_DOMAINS and name in node.outputs:
        raise errors.UnsupportedOperatorError(
            f"{node.domain}::{node.op_type} (node {node.name or '(unnamed)'}) is an operator of "
            f"the custom domain {node.domain!r}, whose output shapes kubeseer cannot infer and "
            f"the model does not declare ({where} {info.reason if info else 'has no shape'}); "
            "export it with standard ONNX operators, or with value_info for its outputs"
        )
    if info is None:
        raise errors.ShapeInferenceError(f"{where} has no inferred shape")
    if info.symbolic:
        raise errors.SymbolicDimensionError(
            f"{where} {info.reason}; its size depends on values, not on the bound inputs"
        )
    raise errors.ShapeInferenceError(f"{where} {info.reason}")


def optional(table: TensorTable, name: str) -> opcount.TensorInfo | None:
    info = table.get(name)
    return info if isinstance(info, opcount.TensorInfo) else None
