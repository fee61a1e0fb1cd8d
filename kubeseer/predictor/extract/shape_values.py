"""Evaluating the small integer tensors computed from shapes (`Shape` -> `Gather` -> `Concat`
-> `Reshape`, `Range` ...), so that shape inference can resolve what depends on them."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Final

import numpy as np
import onnx
from onnx import numpy_helper

from kubeseer.predictor import opcount
from kubeseer.predictor.extract import structure, tensors, value_ops


def compute(
    nodes: list[structure.Node],
    graph: onnx.GraphProto,
    table: Mapping[str, opcount.TensorInfo | tensors.Unresolved],
    known: Mapping[str, value_ops.ValueArray],
) -> dict[str, value_ops.ValueArray]:
    """Values of the small tensors computed from shapes, which inference could not follow.

    Evaluates, in graph order, `Shape` of every statically shaped tensor and the integer
    arithmetic downstream of it (`value_ops.VALUE_OPS`), from constants and earlier results.
    Returns the values not already in `known`, which also overrides constants of the graph.
    """
    values: dict[str, value_ops.ValueArray] = dict(known)
    for init in graph.initializer:
        if init.name not in values and tensors.has_small_inline_data(init):
            with contextlib.suppress(ValueError, TypeError, KeyError):  # corrupted: unknown
                values[init.name] = numpy_helper.to_array(init)
    found: dict[str, value_ops.ValueArray] = {}
    for node in nodes:
        outputs = [name for name in node.outputs if name]
        if not outputs or all(name in values for name in outputs) or node.op_type not in _EVALUATED:
            continue
        result = _evaluate(node, table, values)
        if result is None or result.size > value_ops.MAX_ELEMENTS:
            continue
        values[outputs[0]] = found[outputs[0]] = result
    return found


def _evaluate(
    node: structure.Node,
    table: Mapping[str, opcount.TensorInfo | tensors.Unresolved],
    values: Mapping[str, value_ops.ValueArray],
) -> value_ops.ValueArray | None:
    """One node's (single) output value, or None when it is not cheap shape arithmetic.

    A value that cannot be computed (odd attributes, corrupted constants) is simply unknown;
    shape inference then reports the tensors that depend on it.
    """
    op = node.op_type
    if node.domain not in structure.DEFAULT_DOMAINS or len(node.outputs) != 1:
        return None
    if any(name and name not in values for name in node.inputs) and op not in ("Shape", "Size"):
        return None
    attrs = structure.attributes(node.proto)
    args = [values.get(name) if name else None for name in node.inputs]
    try:
        if op == "Constant":
            return None if tensors.large_constant(node) is not None else constant_value(node.proto)
        if op in ("Shape", "Size"):
            info = table.get(node.inputs[0])
            if not isinstance(info, opcount.TensorInfo):
                return None
            if op == "Size":
                return np.array(info.numel, dtype=np.int64)
            start, end = attrs.get("start", 0), attrs.get("end")
            shape = np.array(info.shape, dtype=np.int64)
            return shape[
                start if isinstance(start, int) else 0 : end if isinstance(end, int) else None
            ]
        if op == "ConstantOfShape":
            fill = constant_value(node.proto)
            if fill is None:
                fill = np.zeros(1, dtype=np.float32)
            return np.full(
                value_ops.sized(value_ops.arg(args, 0)), fill.reshape(()), dtype=fill.dtype
            )
        if op not in value_ops.VALUE_OPS or (op == "Clip" and len(node.proto.attribute) > 0):
            return None  # Clip before opset 11 holds its bounds as float attributes
        with np.errstate(all="ignore"):
            return np.asarray(value_ops.VALUE_OPS[op](args, attrs))
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
        return None


def constant_value(node: onnx.NodeProto) -> value_ops.ValueArray | None:
    """The value a `Constant` node holds, in whichever attribute it holds it."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return numpy_helper.to_array(attribute.t)
        if attribute.name == "value_int":
            return np.array(attribute.i, dtype=np.int64)
        if attribute.name == "value_ints":
            return np.array(list(attribute.ints), dtype=np.int64)
        if attribute.name == "value_float":
            return np.array(attribute.f, dtype=np.float32)
        if attribute.name == "value_floats":
            return np.array(list(attribute.floats), dtype=np.float32)
    return None


_EVALUATED: Final[frozenset[str]] = frozenset(
    {*value_ops.VALUE_OPS, "Constant", "ConstantOfShape", "Shape", "Size"}
)
