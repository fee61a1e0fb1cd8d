"""ONNX shape inference on a weight-free copy of the graph, with the shape arithmetic that
inference cannot follow evaluated here and fed back in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import onnx
from onnx import numpy_helper, shape_inference

from kubeseer.predictor import errors
from kubeseer.predictor.extract import binding, shape_values, structure, tensors, value_ops

_MAX_INFERENCE_ROUNDS: Final[int] = 64
"""A safety net, not a budget: every round but the last learns new values (or turns on ONNX's
data propagation), and rounds go on while they do. timm's swin_tiny at batch 2 takes 11 rounds
of about 30 ms each; the zoo's graphs take one or two."""


def infer(
    model: onnx.ModelProto,
    nodes: list[structure.Node],
    bound: binding.Bound,
    overrides: Mapping[str, value_ops.ValueArray] | None = None,
) -> tensors.TensorTable:
    """ONNX shape inference on a weight-free copy of the graph with inputs bound.

    ONNX's data propagation follows shape arithmetic (`Shape` -> `Gather` -> `Concat` ->
    `Reshape`) but stops at operators such as `Range` (``torch.arange(seq_len)``). When
    tensors stay symbolic, the shape arithmetic is evaluated here (`shape_values.compute`), its
    results enter the copy as constants, and inference runs again. `overrides` gives some
    constants (initializers or `Constant` outputs) other values in the copy: the reshape targets
    `rebatch` rebinds to another batch size.
    """
    graph = model.graph
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4))
    light.opset_import.extend(model.opset_import)
    light_graph = light.graph
    light_graph.input.extend(bound.inputs)
    known: dict[str, value_ops.ValueArray] = dict(overrides or {})
    light_graph.initializer.extend(
        numpy_helper.from_array(value, name) for name, value in known.items()
    )
    for init in graph.initializer:
        if init.name in known:
            continue
        if tensors.has_small_inline_data(init):
            light_graph.initializer.append(init)
        else:
            light_graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    for output in graph.output:
        # Declared output shapes may hold the unbound symbols; inference recomputes them.
        light_graph.output.add(name=output.name)
    # Custom operators have no inference function; an exporter's value_info is then the only
    # source of their output shapes.
    custom_outputs = {
        name
        for node in nodes
        if node.domain not in structure.DEFAULT_DOMAINS
        for name in node.outputs
    }
    if custom_outputs:
        for value_info in graph.value_info:
            if value_info.name in custom_outputs:
                light_graph.value_info.append(binding.rebind(value_info, bound))
    # Large `Constant` tensors (weights, in TorchScript exports) become typed inputs as well:
    # copying them into the copy and through inference would cost more than all the rest.
    inferred_nodes: list[tuple[tuple[str, ...], onnx.NodeProto]] = []
    for node in nodes:
        weight = tensors.large_constant(node)
        if weight is not None:
            light_graph.input.append(
                onnx.helper.make_tensor_value_info(node.outputs[0], weight.data_type, weight.dims)
            )
            continue
        proto = node.proto
        if proto.metadata_props or proto.doc_string:
            # Exporters annotate nodes with stack traces, often 90% of the graph's bytes.
            proto = onnx.NodeProto()
            proto.CopyFrom(node.proto)
            proto.ClearField("metadata_props")
            proto.ClearField("doc_string")
        inferred_nodes.append((node.outputs, proto))
    if any(node.op_type in ("Shape", "Size") for node in nodes):
        # Shape arithmetic that starts at the bound inputs needs no inference round at all.
        seeds: tensors.TensorTable = {vi.name: tensors.info_of(vi) for vi in bound.inputs}
        found = shape_values.compute(nodes, graph, seeds, known)
        known.update(found)
        light_graph.initializer.extend(
            numpy_helper.from_array(value, name) for name, value in found.items()
        )
    # ONNX's own data propagation costs four times the plain inference (BERT-base: 24 ms of
    # 30), and the evaluation here covers the shape arithmetic exporters emit; it is the last
    # resort when that is not enough: when a round finds nothing new, or when two rounds still
    # leave tensors symbolic. Each round resolves only what the one before uncovered, and a
    # chain can be longer than the rounds: at batch 1, a dimension of 1 broadcasts against an
    # exporter's unknown (`unk__0`) without fixing it, so every block of timm's poolformer_s24
    # waited for the round of the block before it.
    data_prop = False
    for round_number in range(_MAX_INFERENCE_ROUNDS):
        del light_graph.node[:]
        light_graph.node.extend(
            proto for outputs, proto in inferred_nodes if not all(n in known for n in outputs if n)
        )
        try:
            inferred = shape_inference.infer_shapes(light, strict_mode=True, data_prop=data_prop)
        except (
            shape_inference.InferenceError,
            onnx.checker.ValidationError,
            RuntimeError,
            ValueError,
        ) as e:
            raise errors.ShapeInferenceError(f"ONNX shape inference failed: {e}") from e
        except UnicodeDecodeError as e:  # its message quoted names that are not UTF-8
            raise errors.ShapeInferenceError("ONNX shape inference rejected the graph") from e
        table = tensors.table_of(graph, inferred.graph)
        if not any(
            isinstance(info, tensors.Unresolved) and info.symbolic for info in table.values()
        ):
            break
        found = shape_values.compute(nodes, graph, table, known)
        if not found:
            if data_prop:
                break
            data_prop = True
            continue
        data_prop = data_prop or round_number >= 1
        known.update(found)
        light_graph.initializer.extend(
            numpy_helper.from_array(value, name) for name, value in found.items()
        )
    return table
