"""ONNX model -> PerfGraph: the Graph Extractor of PerfSeer section 3.1.

The steps, each cheap enough for thousands of graphs per training run:

1. Read and hash the serialised model (the digest identifies it in caches and predictions),
   refuse oversized, empty, truncated or non-ONNX bytes, and refuse control flow. External
   weight data is never loaded: weights only matter through their shapes and element types.
2. Bind every symbolic input dimension (batch size, sequence length, image size) and run ONNX
   shape inference on a copy of the graph whose large initializers are replaced by typed graph
   inputs, so that inference never touches weight bytes.
3. Fold constant sub-graphs (initializers, `Constant`, `ConstantOfShape` of a constant shape,
   casts and transposes of weights): their outputs are weights of the operators that read them,
   not operators of their own, exactly as a runtime folds them before the first step.
4. Every remaining operator is a node and every activation tensor from its producer to a
   consumer is an edge; features follow `kubeseer.predictor.schema`, FLOPs follow
   `kubeseer.predictor.opcount`.

docs/perfgraph.md documents every feature, the shape mapping and the error types.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
import statistics
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnx
from google.protobuf import message
from onnx import TensorProto, numpy_helper, shape_inference

from kubeseer.predictor import errors, opcount, perfgraph, schema

Source = str | os.PathLike[str] | bytes | onnx.ModelProto

DEFAULT_MAX_BYTES: Final[int] = 1 << 30
"""Largest serialised model accepted (1 GiB); protobuf itself stops at 2 GiB."""

_DEFAULT_DOMAINS: Final[frozenset[str]] = frozenset({"", "ai.onnx"})

BATCH_DIM_NAMES: Final[frozenset[str]] = frozenset({"batch", "batch_size", "n", "bs"})
"""Symbolic dimension names (case-insensitive) bound to the batch size wherever they appear."""

# Initializers up to this size keep their values in the shape-inference copy: shape constants,
# axes and resize scales that inference must read. Larger ones are weights; only their shapes
# matter, so they travel as typed graph inputs.
_SHAPE_VALUE_LIMIT_BYTES: Final[int] = 1024

# Shape arithmetic evaluated by `_shape_values` stays this small; anything larger is data.
_SHAPE_VALUE_MAX_ELEMENTS: Final[int] = 4096
_MAX_INFERENCE_ROUNDS: Final[int] = 6

# Operators whose outputs differ per run even from constant inputs: never folded.
_NONDETERMINISTIC_OPS: Final[frozenset[str]] = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
     "Bernoulli", "Dropout"}
)  # fmt: skip

# Operators that lay their tensors out channel-first (N, C, spatial...): a rank-3 tensor next
# to one of them is (N, C, L), anywhere else a transformer's (B, T, C).
CHANNEL_FIRST_OPS: Final[frozenset[str]] = frozenset(
    {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "MaxPool",
     "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
     "BatchNormalization", "InstanceNormalization", "GroupNormalization", "LRN", "MaxUnpool",
     "DepthToSpace", "SpaceToDepth"}
)  # fmt: skip

_CONV_OPS: Final[Mapping[str, int]] = {
    # operator -> input slot of the weight
    "Conv": 1,
    "ConvTranspose": 1,
    "ConvInteger": 1,
    "QLinearConv": 3,
    "DeformConv": 1,
}
_POOL_OPS: Final[frozenset[str]] = frozenset({"MaxPool", "AveragePool", "LpPool"})
_GLOBAL_POOL_OPS: Final[frozenset[str]] = frozenset(
    {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
)
_MATMUL_OPS: Final[Mapping[str, tuple[int, int]]] = {
    # operator -> input slots of A and B
    "MatMul": (0, 1),
    "MatMulInteger": (0, 1),
    "QLinearMatMul": (0, 3),
}
_BIAS_SLOT: Final[Mapping[str, int]] = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "QLinearConv": 8}


def from_onnx(
    source: Source,
    *,
    batch_size: int,
    inputs: Mapping[str, int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> perfgraph.PerfGraph:
    """Extract the PerfGraph of an ONNX model at a batch size.

    Args:
        source: a path to an ``.onnx`` file, its bytes, or a parsed `onnx.ModelProto`.
            External data files are never opened.
        batch_size: bound to every input dimension named like a batch (`BATCH_DIM_NAMES`) and to
            every symbolic first dimension of a graph input.
        inputs: other symbolic dimensions by name, e.g. ``{"seq": 128}``.
        max_bytes: refuse serialised models larger than this.

    Raises:
        errors.GraphError: a subclass naming what is wrong with the model or the bindings.

    Warns:
        errors.UnknownOperatorWarning: once, listing operator types counted as zero FLOPs.
    """
    if batch_size < 1:
        raise errors.BindingError(f"batch size must be at least 1, got {batch_size}")
    with _serialised(source, max_bytes) as data:
        digest = _Digest(data)
        try:
            model = source if isinstance(source, onnx.ModelProto) else _parse(data)
            model, nodes = _check_structure(model)
            bound = _bound_inputs(model.graph, batch_size, dict(inputs or {}))
            table = _infer_shapes(model, nodes, bound)
            return _build(model.graph, nodes, table, digest=digest, batch_size=batch_size)
        finally:
            digest.wait()  # the hashing thread reads `data`, which closes after this block


@contextlib.contextmanager
def _serialised(source: Source, max_bytes: int) -> Iterator[bytes | mmap.mmap]:
    """The serialised model within the size limit: a file is memory-mapped, not read.

    Mapping lets the hash and the weight-skipping parser (`_skeleton`) touch the pages in
    place, so a model with inline weights is never copied.
    """
    if isinstance(source, onnx.ModelProto):
        _check_size(source.ByteSize(), max_bytes)
        yield source.SerializeToString()
        return
    if isinstance(source, bytes):
        _check_size(len(source), max_bytes)
        yield source
        return
    path = Path(source)
    try:
        size = path.stat().st_size
        _check_size(size, max_bytes)
        file = path.open("rb")
    except OSError as e:
        raise errors.NotOnnxError(f"cannot read ONNX model {path}: {e.strerror}") from e
    with file:
        if size == 0:
            yield b""
            return
        try:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise errors.NotOnnxError(f"cannot map ONNX model {path}: {e}") from e
        with mapped:
            yield mapped


class _Digest:
    """sha256 of the serialised model, computed beside the extraction for large models.

    hashlib releases the GIL while hashing, so on a model with inline weights the hash (the
    single largest cost) overlaps parsing, shape inference and feature building.
    """

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self._hash = hashlib.sha256()
        self._thread: threading.Thread | None = None
        if len(data) > _SKELETON_MIN_MODEL_BYTES:
            self._thread = threading.Thread(target=self._hash.update, args=(data,), daemon=True)
            self._thread.start()
        else:
            self._hash.update(data)

    def wait(self) -> None:
        """Block until the hash has read all the data."""
        if self._thread is not None:
            self._thread.join()

    def hexdigest(self) -> str:
        """The hex sha256, once complete."""
        self.wait()
        return self._hash.hexdigest()


def _parse(data: bytes | mmap.mmap) -> onnx.ModelProto:
    if not len(data):
        raise errors.NotOnnxError("the ONNX model is empty (0 bytes)")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(
            _skeleton(data) if len(data) > _SKELETON_MIN_MODEL_BYTES else bytes(data)
        )
    except (message.DecodeError, ValueError) as e:
        raise errors.NotOnnxError(f"not an ONNX model, or a truncated one: {e}") from e
    return model


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise errors.ModelTooLargeError(
            f"the serialised model is {size} bytes, above the limit of {max_bytes} bytes; "
            "store weights as external data (torch.onnx.export does by default)"
        )


# --- Parsing without the weights ---------------------------------------------------------------
# A model with inline weights is mostly tensor payload that extraction never reads, yet protobuf
# copies all of it while parsing. `_skeleton` walks the wire format and re-encodes the model
# without the data fields of large tensors (initializers and `Constant` values), which leaves
# exactly what a weight-stripped export holds: names, dims and element types.

_SKELETON_MIN_MODEL_BYTES: Final[int] = 1 << 20
_SKELETON_MIN_TENSOR_BYTES: Final[int] = 4096  # smaller tensors keep their values
_DROP: Final[str] = "drop"
# Message kind -> {field number: kind of the embedded message, or _DROP}; field numbers are
# those of onnx.proto (ModelProto.graph, GraphProto.node/initializer, NodeProto.attribute,
# AttributeProto.t/tensors, TensorProto's float/int32/string/int64/raw/double/uint64 data).
_WIRE_LAYOUT: Final[Mapping[str, Mapping[int, str]]] = {
    "model": {7: "graph"},
    "graph": {1: "node", 5: "tensor"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 11: "tensor"},
    "tensor": dict.fromkeys((4, 5, 6, 7, 9, 10, 11), _DROP),
}


class _WireError(ValueError):
    """The bytes are not well-formed protobuf; the regular parser reports why."""


def _skeleton(data: bytes | mmap.mmap) -> bytes:
    """`data` re-encoded without the payload of tensors larger than 4 KiB.

    Malformed bytes are handed to the regular parser unchanged, so that errors read the same
    whichever path a model takes.
    """
    with memoryview(data) as view:
        try:
            return b"".join(_strip(view, 0, len(view), "model"))
        except _WireError:
            return bytes(data)


def _strip(buf: memoryview, start: int, end: int, kind: str) -> list[bytes | memoryview]:
    layout = _WIRE_LAYOUT[kind]
    out: list[bytes | memoryview] = []
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(buf, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, value_start = _varint(buf, pos, end)
            pos = value_start + length
            child = layout.get(field)
            if pos <= end and child == _DROP:
                continue
            if pos <= end and child is not None and length > _SKELETON_MIN_TENSOR_BYTES:
                payload = b"".join(_strip(buf, value_start, pos, child))
                out.append(_encode_varint(key) + _encode_varint(len(payload)))
                out.append(payload)
                continue
        else:
            raise _WireError(f"wire type {wire_type}")
        if pos > end:
            raise _WireError("field runs past the end of its message")
        out.append(buf[field_start:pos])
    return out


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _WireError("truncated varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class _Node:
    """A graph node with its fields read out of protobuf once; every read is a C call."""

    proto: onnx.NodeProto
    op_type: str
    domain: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


_CONTROL_FLOW_OPS: Final[frozenset[str]] = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def _check_structure(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[_Node]]:
    """Refuse what is not a static ONNX graph; inline model-local functions.

    Returns the (possibly inlined) model and its nodes in file order.
    """
    if not model.HasField("graph") or not model.graph.node:
        raise errors.NotOnnxError("not an ONNX model, or a truncated one: it has no graph nodes")
    if not any(op.domain in ("", "ai.onnx") for op in model.opset_import):
        raise errors.NotOnnxError(
            "not an ONNX model, or a truncated one: it imports no version of the ONNX opset"
        )
    if model.functions:
        from onnx import inliner

        return _check_structure(inliner.inline_local_functions(model))
    available = {init.name for init in model.graph.initializer}
    available.update(vi.name for vi in model.graph.input)
    if not all(
        isinstance(name, str) for name in (*available, *(o.name for o in model.graph.output))
    ):
        raise errors.NotOnnxError("graph inputs or outputs have names that are not UTF-8 text")
    available.add("")
    nodes: list[_Node] = []
    control: set[str] = set()
    for proto in model.graph.node:
        node = _Node(
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
            if node.domain in _DEFAULT_DOMAINS
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


@dataclass(frozen=True)
class _Bound:
    """The activation inputs with static shapes, and the value each symbol was bound to."""

    inputs: list[onnx.ValueInfoProto]
    symbols: dict[str, int]
    batch_size: int


def _bound_inputs(graph: onnx.GraphProto, batch_size: int, bindings: dict[str, int]) -> _Bound:
    """The graph's activation inputs with every symbolic dimension replaced by its value."""
    for name, value in bindings.items():
        if value < 1:
            raise errors.BindingError(f"dimension {name!r} must be at least 1, got {value}")
    initializers = {init.name for init in graph.initializer}
    activations = [vi for vi in graph.input if vi.name not in initializers]
    used: set[str] = set()
    symbols: dict[str, int] = {}
    unbound: dict[str, list[str]] = {}
    fixed_first: list[int] = []
    has_symbolic_batch = False
    bound: list[onnx.ValueInfoProto] = []
    for value_info in activations:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(value_info)
        if not copy.type.HasField("tensor_type"):
            raise errors.ShapeInferenceError(f"graph input {copy.name!r} is not a tensor")
        dims = copy.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                if axis == 0:
                    fixed_first.append(dim.dim_value)
                continue
            name = dim.dim_param
            if name in bindings:
                value = bindings[name]
                used.add(name)
                if name.lower() in BATCH_DIM_NAMES and value != batch_size:
                    raise errors.BindingError(
                        f"inputs binds {name!r} to {value} but the batch size is {batch_size}"
                    )
            elif name.lower() in BATCH_DIM_NAMES or axis == 0:
                value = batch_size
                has_symbolic_batch = True
            else:
                unbound.setdefault(name or f"<unnamed axis {axis}>", []).append(copy.name)
                continue
            if name:
                symbols[name] = value
            dim.Clear()
            dim.dim_value = value
        bound.append(copy)
    # A misspelt name leaves its dimension unbound as well: name the misspelling, the cause.
    unknown = sorted(set(bindings) - used)
    if unknown:
        named = sorted({*symbols, *unbound} - {name for name in unbound if name.startswith("<")})
        raise errors.BindingError(
            f"inputs names dimensions the model's inputs do not have: {', '.join(unknown)} "
            f"(its symbolic input dimensions: {', '.join(named) or 'none'})"
        )
    if unbound:
        listed = "; ".join(f"{dim!r} (in {', '.join(names)})" for dim, names in unbound.items())
        raise errors.SymbolicDimensionError(
            f"symbolic input dimensions left unbound: {listed}; "
            "bind them with inputs={name: value} (CLI: --input name=value)"
        )
    if fixed_first and not has_symbolic_batch and batch_size not in fixed_first:
        raise errors.BindingError(
            f"the model was exported with a fixed batch size of {fixed_first[0]}, not "
            f"{batch_size}; re-export it with a dynamic batch dimension"
        )
    return _Bound(bound, symbols, batch_size)


def _infer_shapes(model: onnx.ModelProto, nodes: list[_Node], bound: _Bound) -> TensorTable:
    """ONNX shape inference on a weight-free copy of the graph with inputs bound.

    ONNX's data propagation follows shape arithmetic (`Shape` -> `Gather` -> `Concat` ->
    `Reshape`) but stops at operators such as `Range` (``torch.arange(seq_len)``). When
    tensors stay symbolic, the shape arithmetic is evaluated here (`_shape_values`), its results
    enter the copy as constants, and inference runs again.
    """
    graph = model.graph
    light = onnx.ModelProto(ir_version=max(model.ir_version, 4))
    light.opset_import.extend(model.opset_import)
    light_graph = light.graph
    light_graph.input.extend(bound.inputs)
    for init in graph.initializer:
        if _has_small_inline_data(init):
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
        name for node in nodes if node.domain not in _DEFAULT_DOMAINS for name in node.outputs
    }
    if custom_outputs:
        for value_info in graph.value_info:
            if value_info.name in custom_outputs:
                light_graph.value_info.append(_rebind(value_info, bound))
    # Large `Constant` tensors (weights, in TorchScript exports) become typed inputs as well:
    # copying them into the copy and through inference would cost more than all the rest.
    inferred_nodes: list[tuple[tuple[str, ...], onnx.NodeProto]] = []
    for node in nodes:
        weight = _large_constant(node)
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
    known: dict[str, ValueArray] = {}
    if any(node.op_type in ("Shape", "Size") for node in nodes):
        # Shape arithmetic that starts at the bound inputs needs no inference round at all.
        seeds: TensorTable = {vi.name: _value_info_tensor(vi) for vi in bound.inputs}
        known = _shape_values(nodes, graph, seeds, known)
        light_graph.initializer.extend(
            numpy_helper.from_array(value, name) for name, value in known.items()
        )
    # ONNX's own data propagation costs four times the plain inference (BERT-base: 24 ms of
    # 30), and the evaluation here covers the shape arithmetic exporters emit; it is the last
    # resort when that is not enough.
    data_prop = False
    for _ in range(_MAX_INFERENCE_ROUNDS):
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
        table = _tensor_table(graph, inferred.graph)
        if not any(isinstance(info, _Unresolved) and info.symbolic for info in table.values()):
            break
        found = _shape_values(nodes, graph, table, known)
        if not found:
            if data_prop:
                break
            data_prop = True
            continue
        known.update(found)
        light_graph.initializer.extend(
            numpy_helper.from_array(value, name) for name, value in found.items()
        )
    return table


def _large_constant(node: _Node) -> onnx.TensorProto | None:
    """The tensor of a `Constant` node too large to be shape arithmetic, else None."""
    if node.op_type != "Constant" or node.domain not in _DEFAULT_DOMAINS:
        return None
    for attribute in node.proto.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            tensor = attribute.t
            size = (math.prod(tensor.dims) * opcount.element_bits(tensor.data_type) + 7) // 8
            return tensor if size > _SHAPE_VALUE_LIMIT_BYTES else None
    return None


def _rebind(value_info: onnx.ValueInfoProto, bound: _Bound) -> onnx.ValueInfoProto:
    """A copy of a declared shape with the symbols bound at the graph inputs replaced."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value_info)
    for dim in copy.type.tensor_type.shape.dim:
        if not dim.HasField("dim_param"):
            continue
        if dim.dim_param in bound.symbols:
            value = bound.symbols[dim.dim_param]
        elif dim.dim_param.lower() in BATCH_DIM_NAMES:
            value = bound.batch_size
        else:
            continue
        dim.Clear()
        dim.dim_value = value
    return copy


ValueArray = npt.NDArray[Any]


def _shape_values(
    nodes: list[_Node],
    graph: onnx.GraphProto,
    table: Mapping[str, opcount.TensorInfo | _Unresolved],
    known: Mapping[str, ValueArray],
) -> dict[str, ValueArray]:
    """Values of the small tensors computed from shapes, which inference could not follow.

    Evaluates, in graph order, `Shape` of every statically shaped tensor and the integer
    arithmetic downstream of it (`_VALUE_OPS`), from constants and earlier results. Returns
    the values not already in `known`.
    """
    values: dict[str, ValueArray] = dict(known)
    for init in graph.initializer:
        if _has_small_inline_data(init):
            with contextlib.suppress(ValueError, TypeError, KeyError):  # corrupted: unknown
                values[init.name] = numpy_helper.to_array(init)
    found: dict[str, ValueArray] = {}
    for node in nodes:
        outputs = [name for name in node.outputs if name]
        if not outputs or all(name in values for name in outputs) or node.op_type not in _EVALUATED:
            continue
        result = _evaluate(node, table, values)
        if result is None or result.size > _SHAPE_VALUE_MAX_ELEMENTS:
            continue
        values[outputs[0]] = found[outputs[0]] = result
    return found


def _evaluate(
    node: _Node,
    table: Mapping[str, opcount.TensorInfo | _Unresolved],
    values: Mapping[str, ValueArray],
) -> ValueArray | None:
    """One node's (single) output value, or None when it is not cheap shape arithmetic.

    A value that cannot be computed (odd attributes, corrupted constants) is simply unknown;
    shape inference then reports the tensors that depend on it.
    """
    op = node.op_type
    if node.domain not in _DEFAULT_DOMAINS or len(node.outputs) != 1:
        return None
    if any(name and name not in values for name in node.inputs) and op not in ("Shape", "Size"):
        return None
    attrs = _attributes(node.proto)
    args = [values.get(name) if name else None for name in node.inputs]
    try:
        if op == "Constant":
            return None if _large_constant(node) is not None else _constant_value(node.proto)
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
            fill = _constant_value(node.proto)
            if fill is None:
                fill = np.zeros(1, dtype=np.float32)
            return np.full(_sized(_arg(args, 0)), fill.reshape(()), dtype=fill.dtype)
        if op not in _VALUE_OPS:
            return None
        with np.errstate(all="ignore"):
            return np.asarray(_VALUE_OPS[op](args, attrs))
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
        return None


def _constant_value(node: onnx.NodeProto) -> ValueArray | None:
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


Args = list[ValueArray | None]
Attrs = Mapping[str, int | list[int] | str]
ValueOp = Callable[[Args, Attrs], ValueArray]


def _arg(args: Args, index: int) -> ValueArray:
    value = args[index] if index < len(args) else None
    if value is None:
        raise ValueError("missing input")
    return value


def _axes(args: Args, attrs: Attrs, slot: int) -> list[int] | None:
    """Axes from the attribute (older opsets) or from the input slot (opset 13 and later)."""
    if slot < len(args) and args[slot] is not None:
        return [int(a) for a in np.ravel(_arg(args, slot))]
    value = attrs.get("axes")
    return value if isinstance(value, list) else None


def _unsqueeze(args: Args, attrs: Attrs) -> ValueArray:
    data, axes = _arg(args, 0), _axes(args, attrs, 1) or []
    rank = data.ndim + len(axes)
    for axis in sorted(a % rank for a in axes):
        data = np.expand_dims(data, axis)
    return data


def _squeeze(args: Args, attrs: Attrs) -> ValueArray:
    data, axes = _arg(args, 0), _axes(args, attrs, 1)
    return np.squeeze(data, axis=None if axes is None else tuple(a % data.ndim for a in axes))


def _slice(args: Args, attrs: Attrs) -> ValueArray:
    data = _arg(args, 0)
    if len(args) > 1:
        starts, ends = np.ravel(_arg(args, 1)), np.ravel(_arg(args, 2))
        axes = _axes(args, {}, 3) or list(range(len(starts)))
        steps = np.ravel(_arg(args, 4)) if len(args) > 4 and args[4] is not None else None
    else:
        starts = np.array(attrs.get("starts", []))
        ends = np.array(attrs.get("ends", []))
        axes = _axes([], attrs, 0) or list(range(len(starts)))
        steps = None
    index = [slice(None)] * data.ndim
    for i, axis in enumerate(axes):
        step = int(steps[i]) if steps is not None else 1
        index[axis % data.ndim] = slice(int(starts[i]), int(ends[i]), step)
    return data[tuple(index)]


def _integer_div(args: Args, attrs: Attrs) -> ValueArray:
    a, b = _arg(args, 0), _arg(args, 1)
    if np.issubdtype(a.dtype, np.integer):
        return np.asarray(np.trunc(a / b).astype(a.dtype))  # ONNX integer Div truncates
    return np.asarray(a / b)


def _reshape(args: Args, attrs: Attrs) -> ValueArray:
    data, shape = _arg(args, 0), [int(v) for v in np.ravel(_arg(args, 1))]
    if not attrs.get("allowzero", 0):
        shape = [data.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return data.reshape(shape)


def _reduce(function: Callable[..., Any]) -> ValueOp:
    def reduce(args: Args, attrs: Attrs) -> ValueArray:
        data, axes = _arg(args, 0), _axes(args, attrs, 1)
        keep = bool(attrs.get("keepdims", 1))
        return np.asarray(function(data, axis=None if not axes else tuple(axes), keepdims=keep))

    return reduce


def _sized(shape: ValueArray) -> tuple[int, ...]:
    dims = tuple(int(v) for v in np.ravel(shape))
    if math.prod(dims) > _SHAPE_VALUE_MAX_ELEMENTS:
        raise ValueError("too large for shape arithmetic")
    return dims


def _int_attr(attrs: Attrs, name: str, default: int) -> int:
    value = attrs.get(name, default)
    return value if isinstance(value, int) else default


def _cast(args: Args, attrs: Attrs) -> ValueArray:
    to = _int_attr(attrs, "to", TensorProto.FLOAT)
    return _arg(args, 0).astype(onnx.helper.tensor_dtype_to_np_dtype(to))


def _gather(args: Args, attrs: Attrs) -> ValueArray:
    return np.take(_arg(args, 0), _arg(args, 1), axis=_int_attr(attrs, "axis", 0))


def _concat(args: Args, attrs: Attrs) -> ValueArray:
    parts = [np.atleast_1d(v) for v in args if v is not None]
    return np.concatenate(parts, axis=_int_attr(attrs, "axis", 0))


def _expand(args: Args, attrs: Attrs) -> ValueArray:
    data = _arg(args, 0)
    return np.broadcast_to(data, np.broadcast_shapes(data.shape, _sized(_arg(args, 1))))


def _transpose(args: Args, attrs: Attrs) -> ValueArray:
    perm = attrs.get("perm")
    return np.transpose(_arg(args, 0), perm if isinstance(perm, list) else None)


def _range(args: Args, attrs: Attrs) -> ValueArray:
    start, limit, delta = (_arg(args, i).item() for i in range(3))
    if delta == 0 or abs((limit - start) / delta) > _SHAPE_VALUE_MAX_ELEMENTS:
        raise ValueError("not shape arithmetic")
    return np.arange(start, limit, delta, dtype=_arg(args, 0).dtype)


def _binary(function: Callable[[ValueArray, ValueArray], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function(_arg(args, 0), _arg(args, 1)))

    return apply


def _unary(function: Callable[[ValueArray], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function(_arg(args, 0)))

    return apply


def _variadic(function: Callable[[list[ValueArray]], ValueArray]) -> ValueOp:
    def apply(args: Args, attrs: Attrs) -> ValueArray:
        return np.asarray(function([v for v in args if v is not None]))

    return apply


def _where(args: Args, attrs: Attrs) -> ValueArray:
    return np.where(_arg(args, 0), _arg(args, 1), _arg(args, 2))


_VALUE_OPS: Final[Mapping[str, ValueOp]] = {
    "Identity": _unary(lambda x: x),
    "Cast": _cast,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "Expand": _expand,
    "Transpose": _transpose,
    "Range": _range,
    "Where": _where,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _integer_div,
    "Mod": _binary(np.fmod),
    "Equal": _binary(np.equal),
    "Less": _binary(np.less),
    "Greater": _binary(np.greater),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Sqrt": _unary(np.sqrt),
    "Not": _unary(np.logical_not),
    "Max": _variadic(lambda vs: np.maximum.reduce(vs)),
    "Min": _variadic(lambda vs: np.minimum.reduce(vs)),
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}
_EVALUATED: Final[frozenset[str]] = frozenset(
    {*_VALUE_OPS, "Constant", "ConstantOfShape", "Shape", "Size"}
)


def _has_small_inline_data(init: onnx.TensorProto) -> bool:
    """Whether an initializer is small and carries its values in the file (not stripped)."""
    if init.data_location == TensorProto.EXTERNAL or not opcount.known_element_type(init.data_type):
        return False
    size = (math.prod(init.dims) * opcount.element_bits(init.data_type) + 7) // 8
    if size > _SHAPE_VALUE_LIMIT_BYTES:
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
class _Unresolved:
    """Why a tensor has no static shape: kept until a node actually needs it."""

    reason: str
    symbolic: bool


TensorTable = dict[str, opcount.TensorInfo | _Unresolved]


def _tensor_table(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> TensorTable:
    table: TensorTable = {}
    for init in (*graph.initializer, *inferred.initializer):
        table[init.name] = (
            opcount.TensorInfo(tuple(init.dims), init.data_type)
            if opcount.known_element_type(init.data_type)
            else _Unresolved(f"has unknown element type {init.data_type}", symbolic=False)
        )
    for value_info in (*inferred.input, *inferred.value_info, *inferred.output):
        if value_info.name not in table:
            table[value_info.name] = _value_info_tensor(value_info)
    return table


def _value_info_tensor(value_info: onnx.ValueInfoProto) -> opcount.TensorInfo | _Unresolved:
    value_type = value_info.type
    if not value_type.HasField("tensor_type"):
        kind = value_type.WhichOneof("value")
        reason = f"is a {kind}, not a tensor" if kind else "has no inferred type"
        return _Unresolved(reason, symbolic=False)
    tensor_type = value_type.tensor_type
    if not tensor_type.HasField("shape"):
        return _Unresolved("has no inferred shape", symbolic=False)
    shape: list[int] = []
    symbols: list[str] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(dim.dim_value)
        else:
            symbols.append(dim.dim_param or "?")
    if symbols:
        return _Unresolved(f"keeps symbolic dimensions {symbols}", symbolic=True)
    if not opcount.known_element_type(tensor_type.elem_type):
        return _Unresolved(f"has unknown element type {tensor_type.elem_type}", symbolic=False)
    return opcount.TensorInfo(tuple(shape), tensor_type.elem_type)


@dataclass(frozen=True)
class _Folding:
    """The graph after constant folding.

    Attributes:
        constants: names of constant tensors.
        origins: for a constant that is a re-layout of another (`Transpose`, `Cast`, ...), the
            tensor it was derived from, so that a weight counts once in `PerfGraph.params`
            (exporters transpose a tied embedding for the output projection).
        runtime: indices of the nodes that remain operators.
    """

    constants: set[str]
    origins: dict[str, str]
    runtime: list[int]


# Folded operators whose output holds the same values as their first input, laid out anew.
_RELAYOUT_OPS: Final[frozenset[str]] = frozenset(
    {"Transpose", "Cast", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
     "DequantizeLinear"}
)  # fmt: skip


def _fold_constants(graph: onnx.GraphProto, nodes: list[_Node]) -> _Folding:
    constants = {init.name for init in graph.initializer}
    constants.add("")
    origins: dict[str, str] = {}
    runtime: list[int] = []
    for index, node in enumerate(nodes):
        if node.op_type not in _NONDETERMINISTIC_OPS and constants.issuperset(node.inputs):
            constants.update(node.outputs)
            if node.op_type in _RELAYOUT_OPS and node.inputs and node.outputs:
                source = node.inputs[0]
                origins[node.outputs[0]] = origins.get(source, source)
        else:
            runtime.append(index)
    constants.discard("")
    return _Folding(constants, origins, runtime)


def bchw(shape: Sequence[int], *, channel_first: bool) -> tuple[int, int, int, int]:
    """Map a tensor shape of any rank onto PerfSeer's (batch, channel, height, width).

    The product of the four always equals the element count. Rank 0 is (1, 1, 1, 1); rank 1 is
    one sample of features (1, C, 1, 1); rank 2 is (B, C, 1, 1); rank 3 is (B, C, L, 1) when
    channel-first (Conv1d), else a transformer's (B, T, C) -> (B, C, T, 1); rank >= 4 keeps
    B, C and W and folds every middle axis into H.
    """
    rank = len(shape)
    if rank == 0:
        return 1, 1, 1, 1
    if rank == 1:
        return 1, shape[0], 1, 1
    if rank == 2:
        return shape[0], shape[1], 1, 1
    if rank == 3:
        if channel_first:
            return shape[0], shape[1], shape[2], 1
        return shape[0], shape[2], shape[1], 1
    return shape[0], shape[1], math.prod(shape[2:-1]), shape[-1]


def _fold_spatial(values: Sequence[int]) -> tuple[int, int]:
    """Per-axis values of a kernel, stride or dilation as (H, W), like `bchw` folds axes."""
    if not values:
        return 0, 0
    if len(values) == 1:
        return values[0], 1
    return math.prod(values[:-1]), values[-1]


def _fold_pads(per_axis: Sequence[int]) -> tuple[int, int]:
    if not per_axis:
        return 0, 0
    if len(per_axis) == 1:
        return per_axis[0], 0
    return sum(per_axis[:-1]), per_axis[-1]


def _attributes(node: onnx.NodeProto) -> dict[str, int | list[int] | str]:
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


def _ints(attrs: Mapping[str, int | list[int] | str], name: str, default: list[int]) -> list[int]:
    value = attrs.get(name)
    return value if isinstance(value, list) and value else default


def _window(
    attrs: Mapping[str, int | list[int] | str],
    kernel: Sequence[int],
    data: opcount.TensorInfo | None,
    output: opcount.TensorInfo | None,
) -> list[int]:
    """Kernel, stride, padding and dilation of a sliding-window operator, folded to (H, W)."""
    spatial = len(kernel)
    strides = _ints(attrs, "strides", [1] * spatial)
    dilations = _ints(attrs, "dilations", [1] * spatial)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and data is not None and output is not None:
        pads = [
            max(0, (o - 1) * s + (k - 1) * d + 1 - i)
            for i, o, k, s, d in zip(
                data.shape[2:], output.shape[2:], kernel, strides, dilations, strict=False
            )
        ]
    elif auto_pad == "VALID":
        pads = [0] * spatial
    else:
        flat = _ints(attrs, "pads", [0] * (2 * spatial))
        pads = [flat[i] + flat[i + spatial] for i in range(min(spatial, len(flat) // 2))]
    return [
        *_fold_spatial(kernel),
        *_fold_spatial(strides),
        *_fold_pads(pads),
        *_fold_spatial(dilations),
    ]


def _hyper_parameters(
    node: _Node,
    inputs: Sequence[opcount.TensorInfo | None],
    outputs: Sequence[opcount.TensorInfo | None],
    first_activation: opcount.TensorInfo | None,
    in_channel_first: bool,
    out_channel_first: bool,
    num_activations: int,
) -> list[float]:
    """The node's v^hp columns (schema order, 0 where not applicable)."""
    op = node.op_type
    attrs = _attributes(node.proto)
    out0 = outputs[0] if outputs else None
    window = [0] * 8
    group = 0
    if op in _CONV_OPS:
        weight = _slot(inputs, _CONV_OPS[op])
        kernel = list(weight.shape[2:]) if weight is not None else []
        window = _window(attrs, _ints(attrs, "kernel_shape", kernel), _slot(inputs, 0), out0)
        group_attr = attrs.get("group", 1)
        group = group_attr if isinstance(group_attr, int) else 1
    elif op in _POOL_OPS:
        window = _window(attrs, _ints(attrs, "kernel_shape", []), _slot(inputs, 0), out0)
    elif op in _GLOBAL_POOL_OPS and (data := _slot(inputs, 0)) is not None:
        spatial = len(data.shape) - 2
        window = _window({}, list(data.shape[2:]), data, out0)
        window[2:4] = _fold_spatial([1] * spatial)
    gemm_m = gemm_k = units = 0
    if op == "Gemm":
        a, b = _slot(inputs, 0), _slot(inputs, 1)
        if a is not None and b is not None:
            trans_a, trans_b = attrs.get("transA", 0), attrs.get("transB", 0)
            gemm_m, units, gemm_k = opcount.gemm_mnk(
                a.shape, b.shape, trans_a=bool(trans_a), trans_b=bool(trans_b)
            )
    elif op in _MATMUL_OPS:
        a, b = (_slot(inputs, slot) for slot in _MATMUL_OPS[op])
        if a is not None and b is not None and out0 is not None and a.shape and b.shape:
            gemm_k = a.shape[-1]
            units = b.shape[-1] if len(b.shape) >= 2 else 1
            gemm_m = out0.numel // units if units else 0
    heads = _heads(op, attrs, inputs, out0, num_activations)
    bias_slot = _BIAS_SLOT.get(op)
    has_bias = int(bias_slot is not None and _slot(inputs, bias_slot) is not None)
    in_channels = (
        bchw(first_activation.shape, channel_first=in_channel_first)[1] if first_activation else 0
    )
    out_channels = bchw(out0.shape, channel_first=out_channel_first)[1] if out0 else 0
    elem_bytes = opcount.element_bits(out0.elem_type) / 8 if out0 else 0.0
    return [
        *window,
        group,
        in_channels,
        out_channels,
        gemm_m,
        gemm_k,
        units,
        heads,
        has_bias,
        num_activations,
        sum(1 for name in node.outputs if name),
        elem_bytes,
    ]


def _heads(
    op: str,
    attrs: Mapping[str, int | list[int] | str],
    inputs: Sequence[opcount.TensorInfo | None],
    output: opcount.TensorInfo | None,
    num_activations: int,
) -> int:
    """Attention heads: an attention operator's attribute, else the head axis of the
    rank-4 (B, heads, T, T) tensors of a decomposed attention (activation @ activation MatMul,
    Softmax over scores)."""
    for name in ("num_heads", "q_num_heads"):
        value = attrs.get(name)
        if isinstance(value, int):
            return value
    if output is None or len(output.shape) != 4:
        return 0
    if op == "MatMul" and num_activations == 2:
        a, b = _slot(inputs, 0), _slot(inputs, 1)
        if a is not None and b is not None and len(a.shape) == 4 and len(b.shape) == 4:
            return output.shape[1]
    if op == "Softmax":
        return output.shape[1]
    return 0


def _slot(infos: Sequence[opcount.TensorInfo | None], index: int) -> opcount.TensorInfo | None:
    return infos[index] if index < len(infos) else None


def _lookup(
    table: Mapping[str, opcount.TensorInfo | _Unresolved], name: str, node: _Node
) -> opcount.TensorInfo:
    info = table.get(name)
    if isinstance(info, opcount.TensorInfo):
        return info
    where = f"tensor {name!r} of {node.op_type} node {node.name or '(unnamed)'}"
    if info is None:
        raise errors.ShapeInferenceError(f"{where} has no inferred shape")
    if info.symbolic:
        raise errors.SymbolicDimensionError(
            f"{where} {info.reason}; its size depends on values, not on the bound inputs"
        )
    raise errors.ShapeInferenceError(f"{where} {info.reason}")


def _optional(table: TensorTable, name: str) -> opcount.TensorInfo | None:
    info = table.get(name)
    return info if isinstance(info, opcount.TensorInfo) else None


def _stats(values: Sequence[float]) -> list[float]:
    """Total, mean, median and max (all 0 for an empty sequence)."""
    if not values:
        return [0.0, 0.0, 0.0, 0.0]
    total = float(sum(values))
    return [total, total / len(values), float(statistics.median(values)), float(max(values))]


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _build(
    graph: onnx.GraphProto,
    all_nodes: list[_Node],
    table: TensorTable,
    *,
    digest: _Digest,
    batch_size: int,
) -> perfgraph.PerfGraph:
    folding = _fold_constants(graph, all_nodes)
    constants, runtime = folding.constants, folding.runtime
    if not runtime:
        raise errors.MalformedGraphError("every operator folds to a constant; nothing runs")
    nodes = [all_nodes[index] for index in runtime]
    producer: dict[str, int] = {}
    channel_first: set[str] = set()
    for index, node in enumerate(nodes):
        for name in node.outputs:
            if name:
                producer[name] = index
        if node.op_type in CHANNEL_FIRST_OPS:
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
    unknown: set[str] = set()
    edge_src: list[int] = []
    edge_dst: list[int] = []
    edge_rows: list[list[float]] = []
    for index, node in enumerate(nodes):
        inputs = [_lookup(table, name, node) if name else None for name in node.inputs]
        outputs = [
            _lookup(table, name, node) if name in consumed else _optional(table, name)
            for name in node.outputs
        ]
        count = opcount.node_flops(node.proto, inputs, outputs)
        if not count.known:
            unknown.add(node.op_type if not node.domain else f"{node.domain}.{node.op_type}")
        mac = weights = 0
        activations: list[str] = []
        for name, info in _distinct(node.inputs, inputs):
            mac += info.nbytes
            if name in constants:
                if info.elem_type in opcount.WEIGHT_ELEMENT_TYPES:
                    weights += info.nbytes
                    weights_seen[folding.origins.get(name, name)] = info.numel
            else:
                activations.append(name)
                source = producer.get(name)
                if source is not None:
                    edge_src.append(source)
                    edge_dst.append(index)
                    edge_rows.append(
                        [info.nbytes, *bchw(info.shape, channel_first=name in channel_first)]
                    )
        mac += sum(info.nbytes for _, info in _distinct(node.outputs, outputs))
        first = table[activations[0]] if activations else None
        rows.append(
            _hyper_parameters(
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
        params=sum(weights_seen.values()),
        mac=mac_total,
        unknown_ops=tuple(sorted(unknown)),
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
