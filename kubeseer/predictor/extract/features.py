"""The PerfGraph itself: one node per operator, one edge per activation tensor from producer to
consumer, features in `kubeseer.predictor.schema` order, FLOPs from `opcount`."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from kubeseer.predictor import errors, opcount, perfgraph, schema
from kubeseer.predictor.extract import (
    folding,
    hyperparameters,
    layout,
    load,
    scopes,
    structure,
    tensors,
)


def _stats(values: Sequence[float]) -> list[float]:
    """Total, mean, median and max (all 0 for an empty sequence)."""
    if not values:
        return [0.0, 0.0, 0.0, 0.0]
    total = float(sum(values))
    return [total, total / len(values), float(statistics.median(values)), float(max(values))]


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def broadcast_copy_elements(op_type: str, inputs: Sequence[opcount.TensorInfo | None]) -> int:
    """Elements `torch.matmul` copies a MatMul's operands into: where both have batch
    dimensions and one's broadcast, it expands that operand to the common batch and clones it
    contiguous before ``bmm`` (``aten::expand``, ``aten::clone``, ``aten::bmm``), a tensor the
    export never shows and that training saves for ``bmm``'s backward. An operand of two
    dimensions or fewer folds into ``mm`` without a copy."""
    if op_type != "MatMul" or len(inputs) != 2:
        return 0
    shapes = [info.shape for info in inputs if info is not None]
    if len(shapes) != 2 or min(len(shape) for shape in shapes) < 3:
        return 0
    batch = math.prod(np.broadcast_shapes(shapes[0][:-2], shapes[1][:-2]))
    return sum(batch * shape[-2] * shape[-1] for shape in shapes if math.prod(shape[:-2]) < batch)


def parameter_count(
    elements: Mapping[str, int], readers: Mapping[str, set[str]], merged: Iterable[str]
) -> int:
    """Trainable parameters: each constant's `elements` once, or once per module reading it
    (`readers`: module paths) where the exporter `merged` equal parameters into it
    (`merged_constants`)."""
    several = set(merged)
    return sum(
        count * (len(readers[name]) if name in several else 1) for name, count in elements.items()
    )


def merged_constants(
    graph: onnx.GraphProto, readers: Mapping[str, set[tuple[str, str]]]
) -> set[str]:
    """Initialisers that stand for several parameters of equal value.

    PyTorch's TorchScript exporter merges constants of equal value into one initialiser (its
    deduplicate-initializers pass): a freshly initialised network's zero biases and LayerNorm
    ones, and the convolutions a zero-initialised last BatchNorm was folded into (all zeros),
    read one name from several modules. On the GPU each is a parameter of its own; an
    embedding tied to the output projection, or a module called twice, is one.

    An initialiser read in several modules (`readers`: operator type and module path) was
    merged when it holds one value throughout. Where the file does not carry its data (a
    stripped export, as the timm exports cached here are), it was merged when operators of one
    type read it (convolutions, LayerNorms), and tied when they differ (Gather and MatMul).
    A graph without module paths has one path, and nothing merged.
    """
    found: set[str] = set()
    for initializer in graph.initializer:
        reading = readers.get(initializer.name, set())
        if len({scope for _, scope in reading}) < 2:
            continue
        uniform = _uniform(initializer)
        if uniform if uniform is not None else len({op for op, _ in reading}) == 1:
            found.add(initializer.name)
    return found


def _uniform(initializer: onnx.TensorProto) -> bool | None:
    """Whether every element holds one value; None when the file does not carry the data."""
    if initializer.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        values = onnx.numpy_helper.to_array(initializer)
    except (ValueError, TypeError):
        return None
    if values.size != math.prod(initializer.dims):
        return None
    return bool(values.size) and bool(np.all(values == values.flat[0]))


def build(
    graph: onnx.GraphProto,
    all_nodes: list[structure.Node],
    table: tensors.TensorTable,
    *,
    digest: load.Digest,
    batch_size: int,
) -> perfgraph.PerfGraph:
    folded = folding.fold(graph, all_nodes)
    constants, runtime = folded.constants, folded.runtime
    if not runtime:
        raise errors.MalformedGraphError("every operator folds to a constant; nothing runs")
    nodes = [all_nodes[index] for index in runtime]
    producer: dict[str, int] = {}
    channel_first: set[str] = set()
    for index, node in enumerate(nodes):
        for name in node.outputs:
            if name:
                producer[name] = index
        if node.op_type in layout.CHANNEL_FIRST_OPS:
            channel_first.update(node.inputs)
            channel_first.update(node.outputs)

    # An output nothing reads (Dropout's mask at inference) may legitimately lack a shape.
    consumed = {name for node in nodes for name in node.inputs} | {o.name for o in graph.output}
    consumed.discard("")
    rows: list[list[float]] = []
    flops: list[int] = []
    macs: list[int] = []
    weight_bytes: list[int] = []
    weights_seen: dict[str, int] = {}
    weight_readers: dict[str, set[tuple[str, str]]] = {}  # constant -> (op type, module path)
    node_scopes = scopes.module_paths([node.proto for node in nodes])
    unknown: set[str] = set()
    edge_src: list[int] = []
    edge_dst: list[int] = []
    edge_rows: list[list[float]] = []
    output_ranks: list[int] = []
    broadcast_copies: list[int] = []
    for index, node in enumerate(nodes):
        inputs = [tensors.lookup(table, name, node) if name else None for name in node.inputs]
        outputs = [
            tensors.lookup(table, name, node) if name in consumed else tensors.optional(table, name)
            for name in node.outputs
        ]
        count = opcount.node_flops(node.proto, inputs, outputs)
        output_ranks.append(len(outputs[0].shape) if outputs and outputs[0] is not None else 0)
        broadcast_copies.append(broadcast_copy_elements(node.op_type, inputs))
        if not count.known:
            unknown.add(node.op_type if not node.domain else f"{node.domain}.{node.op_type}")
        mac = weights = 0
        activations: list[str] = []
        for name, info in _distinct(node.inputs, inputs):
            mac += info.nbytes
            if name in constants:
                if info.elem_type in opcount.WEIGHT_ELEMENT_TYPES:
                    weights += info.nbytes
                    origin = folded.origins.get(name, name)
                    weights_seen[origin] = info.numel
                    weight_readers.setdefault(origin, set()).add((node.op_type, node_scopes[index]))
            else:
                activations.append(name)
                source = producer.get(name)
                if source is not None:
                    edge_src.append(source)
                    edge_dst.append(index)
                    edge_rows.append(
                        [info.nbytes, *layout.bchw(info.shape, channel_first=name in channel_first)]
                    )
        mac += sum(info.nbytes for _, info in _distinct(node.outputs, outputs))
        first = table[activations[0]] if activations else None
        rows.append(
            hyperparameters.columns(
                node,
                inputs,
                outputs,
                first if isinstance(first, opcount.TensorInfo) else None,
                bool(activations) and activations[0] in channel_first,
                bool(node.outputs) and node.outputs[0] in channel_first,
                len(activations),
            )
        )
        flops.append(count.flops)
        macs.append(mac)
        weight_bytes.append(weights)

    if unknown:
        warnings.warn(
            errors.UnknownOperatorWarning(
                "no FLOP formula for operator types "
                + ", ".join(sorted(unknown))
                + "; counted as zero FLOPs"
            ),
            stacklevel=3,
        )
    flops_total, mac_total, weight_total = sum(flops), sum(macs), sum(weight_bytes)
    for row, f, m, w in zip(rows, flops, macs, weight_bytes, strict=True):
        row.extend(
            [
                f,
                m,
                w,
                _share(f, m),
                _share(f, flops_total),
                _share(m, mac_total),
                _share(w, weight_total),
            ]
        )
    num_nodes, num_edges = len(nodes), len(edge_src)
    density = num_edges / (num_nodes * (num_nodes - 1)) if num_nodes > 1 else 0.0
    edge_bytes_mean = sum(r[0] for r in edge_rows) / num_edges if num_edges else 0.0
    global_row = [
        num_nodes,
        num_edges,
        density,
        *_stats(flops),
        *_stats(macs),
        *_stats(weight_bytes),
        edge_bytes_mean,
        _share(flops_total, mac_total),
        batch_size,
    ]
    return perfgraph.PerfGraph(
        node_features=np.array(rows, dtype=np.float64).reshape(
            num_nodes, len(schema.NODE_FEATURES)
        ),
        edge_index=np.array([edge_src, edge_dst], dtype=np.int64).reshape(2, num_edges),
        edge_features=np.array(edge_rows, dtype=np.float64).reshape(
            num_edges, len(schema.EDGE_FEATURES)
        ),
        global_features=np.array(global_row, dtype=np.float64),
        op_types=tuple(node.op_type for node in nodes),
        node_names=tuple(
            node.name or f"{node.op_type}_{runtime[i]}" for i, node in enumerate(nodes)
        ),
        schema_version=schema.SCHEMA_VERSION,
        model_digest=digest.hexdigest(),
        batch_size=batch_size,
        flops=flops_total,
        params=parameter_count(
            weights_seen,
            {name: {scope for _, scope in reading} for name, reading in weight_readers.items()},
            merged_constants(graph, weight_readers),
        ),
        mac=mac_total,
        unknown_ops=tuple(sorted(unknown)),
        output_ranks=tuple(output_ranks),
        broadcast_copies=tuple(broadcast_copies),
        scopes=node_scopes,
    )


def _distinct(
    names: Iterable[str], infos: Sequence[opcount.TensorInfo | None]
) -> list[tuple[str, opcount.TensorInfo]]:
    """Present slots with their info, each tensor once (``Mul(x, x)`` reads x once)."""
    seen: set[str] = set()
    found: list[tuple[str, opcount.TensorInfo]] = []
    for name, info in zip(names, infos, strict=True):
        if info is not None and name not in seen:
            seen.add(name)
            found.append((name, info))
    return found
