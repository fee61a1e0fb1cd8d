"""A model exported with a fixed batch size, predicted at another.

Many published ONNX files fix the batch dimension (the ONNX model zoo's, the `onnx` package's
own test models, any export without dynamic axes). The leading dimension of their inputs is then
a number, and so are the reshape targets that a dynamic export would have computed from the
batch (``Reshape(x, [1, 2048])`` before a classifier, ShuffleNet's channel shuffles). Rebinding
rewrites those numbers, which is what an export with a dynamic batch holds: the inputs lead with
the requested batch, and a constant reshape target whose first entry is the exported batch,
applied to a tensor that leads with it, leads with the requested batch instead.

Shape inference then has to stay consistent: every reshape keeps its element count, and every
graph output that led with the exported batch leads with the requested one. A graph that bakes
the batch in anywhere else is refused, with the reshapes that hold a fixed leading size named:
a reshape that folds the batch into another axis, or a constant of batch-sized shape joined to
the activations (a vision transformer's class token, expanded to ``[1, 1, C]`` from constants
alone, is folded into a weight, and a weight cannot follow the batch).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from kubeseer.predictor import errors, opcount
from kubeseer.predictor.extract import (
    binding,
    folding,
    shape_values,
    shapes,
    structure,
    tensors,
    value_ops,
)

Overrides = dict[str, value_ops.ValueArray]


def infer(
    model: onnx.ModelProto, nodes: list[structure.Node], bound: binding.Bound
) -> tensors.TensorTable:
    """Shapes of the model at `bound`, rebinding a fixed batch size (module docstring).

    Raises:
        errors.BindingError: the graph does not follow another batch size.

    Warns:
        errors.FixedBatchWarning: once, saying what was rebound.
    """
    exported = bound.exported_batch
    if exported is None:
        return shapes.infer(model, nodes, bound)
    at_export = shapes.infer(model, nodes, bound.at_export())
    overrides, baked = _rebound_targets(model.graph, nodes, at_export, bound)
    table = _checked(model, nodes, bound, at_export, overrides, baked)
    warnings.warn(
        errors.FixedBatchWarning(
            f"the model was exported with a fixed batch size of {exported}; its inputs"
            + (f" and {len(overrides)} reshape targets" if overrides else "")
            + f" were rebound to {bound.batch_size}"
        ),
        stacklevel=3,
    )
    return table


def _rebound_targets(
    graph: onnx.GraphProto,
    nodes: list[structure.Node],
    at_export: tensors.TensorTable,
    bound: binding.Bound,
) -> tuple[Overrides, list[str]]:
    """Reshape targets rebound to the batch size, and the reshapes that keep a fixed leading
    size other than the exported batch (named if the graph is refused)."""
    exported = bound.exported_batch
    values = _constant_values(graph, nodes)
    constants = folding.fold(graph, nodes).constants
    overrides: Overrides = {}
    baked: list[str] = []
    for node in nodes:
        if node.op_type != "Reshape" or len(node.inputs) < 2:
            continue
        if node.domain not in structure.DEFAULT_DOMAINS or node.outputs[0] in constants:
            continue  # folded before the first step, like a weight's reshape
        target = values.get(node.inputs[1])
        if target is None or target.ndim != 1 or not target.size:
            continue  # a target computed from shapes follows the batch by itself
        data = at_export.get(node.inputs[0])
        if not isinstance(data, opcount.TensorInfo) or data.shape[:1] != (exported,):
            continue
        if int(target[0]) == exported:
            rebound = target.copy()
            rebound[0] = bound.batch_size
            overrides[node.inputs[1]] = rebound
        elif int(target[0]) > 0:
            baked.append(f"{node.op_type} node {node.name or '(unnamed)'} {target.tolist()}")
    return overrides, baked


def _checked(
    model: onnx.ModelProto,
    nodes: list[structure.Node],
    bound: binding.Bound,
    at_export: tensors.TensorTable,
    overrides: Mapping[str, value_ops.ValueArray],
    baked: list[str],
) -> tensors.TensorTable:
    """Shapes with `overrides`, if they are consistent at the new batch size."""
    try:
        table = shapes.infer(model, nodes, bound, overrides)
    except errors.ShapeInferenceError as e:
        raise errors.BindingError(_refusal(bound, baked, str(e))) from e
    for node in nodes:
        # ONNX shape inference takes a constant reshape target as it is, without its size.
        if node.op_type != "Reshape" or node.domain not in structure.DEFAULT_DOMAINS:
            continue
        data, out = table.get(node.inputs[0]), table.get(node.outputs[0])
        if (
            isinstance(data, opcount.TensorInfo)
            and isinstance(out, opcount.TensorInfo)
            and data.numel != out.numel
        ):
            name = node.name or "(unnamed)"
            detail = f"{node.op_type} node {name} would turn {data.shape} into {out.shape}"
            raise errors.BindingError(_refusal(bound, baked, detail))
    for output in model.graph.output:
        before, after = at_export.get(output.name), table.get(output.name)
        if not isinstance(before, opcount.TensorInfo) or before.shape[:1] != (
            bound.exported_batch,
        ):
            continue
        if not isinstance(after, opcount.TensorInfo) or after.shape[:1] != (bound.batch_size,):
            shown = after.shape if isinstance(after, opcount.TensorInfo) else "no static shape"
            detail = (
                f"output {output.name!r} is {before.shape} at batch {bound.exported_batch} "
                f"but {shown} at batch {bound.batch_size}"
            )
            raise errors.BindingError(_refusal(bound, baked, detail))
    return table


def _refusal(bound: binding.Bound, baked: list[str], detail: str) -> str:
    where = f" ({'; '.join(baked)} reshape the batch into a fixed shape)" if baked else ""
    return (
        f"the model was exported with a fixed batch size of {bound.exported_batch} and its "
        f"graph does not follow a batch of {bound.batch_size}{where}: {detail}; re-export it "
        "with a dynamic batch dimension"
    )


def _constant_values(graph: onnx.GraphProto, nodes: list[structure.Node]) -> Overrides:
    """The values of the small integer tensors computed from constants alone (initializers,
    `Constant` nodes and the shape arithmetic on them); nothing computed from a shape."""
    values: Overrides = {}
    for init in graph.initializer:
        if tensors.has_small_inline_data(init):
            with contextlib.suppress(ValueError, TypeError, KeyError):  # corrupted: unknown
                values[init.name] = numpy_helper.to_array(init)
    values.update(shape_values.compute(nodes, graph, {}, {}))
    return {name: value for name, value in values.items() if np.issubdtype(value.dtype, np.integer)}
