"""FLOPs of one ONNX operator from its tensor shapes.

Counting follows onnx-tool 1.0.1, whose per-node profilers are the reference, with one
conversion and a few corrections, all documented in docs/perfgraph.md ("What counts as FLOPs"):

* onnx-tool reports "MACs" that mix two units. For multiply-accumulate operators one MAC is a
  multiply *and* an add; for every other operator it is an instruction-weighted count of
  elementary operations (an add is 1, an exp 32). A FLOP here is one elementary floating-point
  operation, so multiply-accumulate MACs are doubled and everything else is taken as it is.
* Conv, ConvTranspose, Gemm and MatMul are counted by the formulas below instead of by
  onnx-tool. The formulas are cheaper than building onnx-tool's node objects, they keep the
  bias adds apart from the MACs (onnx-tool adds one "MAC" per output for a bias, which is one
  FLOP, not two), and onnx-tool's ConvTranspose counts per *output* element although each
  *input* element is scattered through the kernel. Unit tests cross-check the formulas
  against onnx-tool's own profilers on real models.
* Operators onnx-tool lacks are registered with it (`IsNaN`, `IsInf`), and `Erf` (which
  onnx-tool counts as free, though BERT's GELU spends real time in it) costs as much per
  element as onnx-tool's `Tanh`.

Operators that are still unknown cost zero; the caller collects them and warns once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import onnx
from onnx import TensorProto
from onnx_tool import node as tool_node
from onnx_tool import tensor as tool_tensor

# Bits per element of each ONNX element type. Strings have no fixed size; they never carry
# activations in the models kubeseer runs, so they count as zero bytes.
_ELEMENT_BITS: Final[Mapping[int, int]] = {
    TensorProto.FLOAT: 32,
    TensorProto.UINT8: 8,
    TensorProto.INT8: 8,
    TensorProto.UINT16: 16,
    TensorProto.INT16: 16,
    TensorProto.INT32: 32,
    TensorProto.INT64: 64,
    TensorProto.STRING: 0,
    TensorProto.BOOL: 8,
    TensorProto.FLOAT16: 16,
    TensorProto.DOUBLE: 64,
    TensorProto.UINT32: 32,
    TensorProto.UINT64: 64,
    TensorProto.COMPLEX64: 64,
    TensorProto.COMPLEX128: 128,
    TensorProto.BFLOAT16: 16,
    TensorProto.FLOAT8E4M3FN: 8,
    TensorProto.FLOAT8E4M3FNUZ: 8,
    TensorProto.FLOAT8E5M2: 8,
    TensorProto.FLOAT8E5M2FNUZ: 8,
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.FLOAT8E8M0: 8,
    TensorProto.UINT2: 2,
    TensorProto.INT2: 2,
}

# Element types that hold learned weights when a constant tensor of that type feeds an
# operator. Integer constants of other widths are shapes, axes or indices.
WEIGHT_ELEMENT_TYPES: Final[frozenset[int]] = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.FLOAT16,
        TensorProto.BFLOAT16,
        TensorProto.DOUBLE,
        TensorProto.UINT8,
        TensorProto.INT8,
        TensorProto.UINT4,
        TensorProto.INT4,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
        TensorProto.FLOAT4E2M1,
    }
)

# onnx-tool counts these in multiply-accumulates; their FLOPs are twice its count.
_MULTIPLY_ACCUMULATE_TOOL_OPS: Final[frozenset[str]] = frozenset(
    {"Einsum", "MatMulInteger", "QLinearMatMul", "QLinearConv", "ConvInteger", "LSTM", "GRU"}
)

# FLOPs per output element for operators whose onnx-tool count is missing or zero.
_PER_ELEMENT_OVERRIDES: Final[Mapping[str, int]] = {
    "Erf": tool_node.TANH_MACS,
}

_DEFAULT_DOMAINS: Final[frozenset[str]] = frozenset({"", "ai.onnx"})


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Static shape and element type of one tensor; all a FLOP or byte count needs."""

    shape: tuple[int, ...]
    elem_type: int
    numel: int = field(init=False)
    """Number of elements (1 for a scalar)."""
    nbytes: int = field(init=False)
    """Bytes the tensor occupies, rounding sub-byte types up to whole bytes."""

    def __post_init__(self) -> None:
        # Computed once: extraction reads both several times per tensor.
        numel = math.prod(self.shape)
        object.__setattr__(self, "numel", numel)
        object.__setattr__(self, "nbytes", (numel * element_bits(self.elem_type) + 7) // 8)


def element_bits(elem_type: int) -> int:
    """Bits per element of an ONNX element type (0 for strings and unknown types)."""
    return _ELEMENT_BITS.get(elem_type, 0)


def known_element_type(elem_type: int) -> bool:
    """Whether `elem_type` is an ONNX tensor element type (corrupted files hold others)."""
    return elem_type in _ELEMENT_BITS


@dataclass(frozen=True, slots=True)
class OpCount:
    """FLOPs of one operator, and whether any formula knew the operator at all."""

    flops: int
    known: bool


def conv_macs(weight: Sequence[int], output: Sequence[int]) -> int:
    """Multiply-accumulates of a (grouped) convolution.

    Every output element reduces over ``C_in / group`` channels times the kernel window, and the
    weight shape ``(C_out, C_in / group, k_1, ..., k_n)`` holds exactly that reduction size.
    """
    return math.prod(output) * math.prod(weight[1:])


def conv_transpose_macs(data: Sequence[int], weight: Sequence[int]) -> int:
    """Multiply-accumulates of a transposed convolution.

    Each *input* element is multiplied into ``C_out / group`` kernel windows; the weight shape is
    ``(C_in, C_out / group, k_1, ..., k_n)``.
    """
    return math.prod(data) * math.prod(weight[1:])


def gemm_mnk(
    a: Sequence[int], b: Sequence[int], *, trans_a: bool, trans_b: bool
) -> tuple[int, int, int]:
    """The (M, N, K) of ``Y = op(A) @ op(B)`` for ONNX Gemm (2-D operands)."""
    m, k = (a[1], a[0]) if trans_a else (a[0], a[1])
    n = b[0] if trans_b else b[1]
    return m, n, k


def matmul_macs(a: Sequence[int], output: Sequence[int]) -> int:
    """Multiply-accumulates of numpy-style MatMul, broadcast batch dimensions included.

    Every output element is a dot product of length K, the last axis of A (a 1-D A is a row
    vector, so its only axis). B only decides the output shape, which is given; a 1-D B drops
    an output axis without changing K.
    """
    return math.prod(output) * a[-1]


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


def node_flops(
    node: onnx.NodeProto,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo | None],
) -> OpCount:
    """FLOPs of `node` given the static info of each input and output slot.

    `inputs` and `outputs` line up with ``node.input`` / ``node.output``; an omitted optional
    slot is None.
    """
    op = node.op_type
    if node.domain not in _DEFAULT_DOMAINS:
        return OpCount(0, known=False)
    first_out = outputs[0] if outputs else None
    if op in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        return _multiply_accumulate_flops(node, inputs, first_out)
    if op in _PER_ELEMENT_OVERRIDES:
        numel = first_out.numel if first_out is not None else 0
        return OpCount(_PER_ELEMENT_OVERRIDES[op] * numel, known=True)
    rule = _tool_rule(op, len(node.input))
    if rule is None:
        return OpCount(0, known=False)
    if rule.per_element is not None:
        numel = first_out.numel if first_out is not None else 0
        return OpCount(rule.per_element * numel, known=True)
    tool_macs = onnx_tool_macs(node, inputs, outputs)
    if tool_macs is None:
        return OpCount(0, known=False)
    factor = 2 if op in _MULTIPLY_ACCUMULATE_TOOL_OPS else 1
    return OpCount(factor * tool_macs, known=True)


@dataclass(frozen=True, slots=True)
class _ToolRule:
    """How onnx-tool counts an operator type: a fixed cost per output element, or its profiler.

    Most of onnx-tool's profilers are either inherited no-ops (data movement: zero) or the
    element-wise base profilers (output elements x a per-class constant). Reading that constant
    once per operator type gives the same count without building onnx-tool objects per node,
    which would otherwise dominate extraction time; tests pin the equality.
    """

    per_element: int | None


@functools.cache
def _tool_rule(op_type: str, num_inputs: int) -> _ToolRule | None:
    node_class = tool_node.NODE_REGISTRY.get(op_type + "Node")
    if node_class is None:
        return None
    profile = node_class.profile
    if profile is tool_node.Node.profile or profile is tool_node.FusedBase.profile:
        return _ToolRule(per_element=0)
    if profile is tool_node.PWNode.profile or profile is tool_node.NpMathBase.profile:
        # The per-class constants are set in __init__ from the class and, for Sum, from the
        # number of inputs; no attribute enters them.
        names = [f"input{i}" for i in range(num_inputs)]
        probe = node_class(onnx.helper.make_node(op_type, names, ["output"]))
        return _ToolRule(per_element=int(probe.op_mac * probe.ratio))
    return _ToolRule(per_element=None)


def _multiply_accumulate_flops(
    node: onnx.NodeProto, inputs: Sequence[TensorInfo | None], output: TensorInfo | None
) -> OpCount:
    """Two FLOPs per multiply-accumulate plus one per output element for a bias input."""
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None or output is None:
        return OpCount(0, known=True)
    a, b = inputs[0].shape, inputs[1].shape
    op = node.op_type
    if op == "Conv":
        macs = conv_macs(b, output.shape)
    elif op == "ConvTranspose":
        macs = conv_transpose_macs(a, b)
    elif op == "Gemm":
        m, n, k = gemm_mnk(
            a,
            b,
            trans_a=bool(_attr_int(node, "transA", 0)),
            trans_b=bool(_attr_int(node, "transB", 0)),
        )
        macs = m * n * k
    else:
        macs = matmul_macs(a, output.shape)
    has_bias = op != "MatMul" and len(inputs) > 2 and inputs[2] is not None
    return OpCount(2 * macs + (output.numel if has_bias else 0), known=True)


def onnx_tool_macs(
    node: onnx.NodeProto,
    inputs: Sequence[TensorInfo | None],
    outputs: Sequence[TensorInfo | None],
) -> int | None:
    """onnx-tool's own count for `node`, or None when onnx-tool has no profiler for it.

    onnx-tool's profilers read shapes from its `Tensor` objects; omitted optional inputs become
    empty-named tensors, as onnx-tool's own graph loader makes them.
    """
    node_class = tool_node.NODE_REGISTRY.get(node.op_type + "Node")
    if node_class is None:
        return None
    in_tensors = [_tool_tensor(name, info) for name, info in zip(node.input, inputs, strict=True)]
    out_tensors = [
        _tool_tensor(name, info) for name, info in zip(node.output, outputs, strict=True)
    ]
    try:
        macs = node_class(node).profile(in_tensors, out_tensors)[0]
    except Exception:
        # A third-party profiler failing on odd shapes or attributes is a gap in its coverage:
        # reported like an unknown operator rather than aborting the whole graph.
        return None
    return int(macs)


def _tool_tensor(name: str, info: TensorInfo | None) -> Any:
    """An onnx-tool `Tensor` as its graph loader leaves a dynamic tensor after shape inference.

    Built without `Tensor.__init__`, which runs an import statement and a sparsity search per
    tensor; the attributes set here are all a profiler reads (the cross-check tests would fail
    if onnx-tool read others).
    """
    tensor = tool_tensor.Tensor.__new__(tool_tensor.Tensor)
    tensor.name = name
    tensor.proto = None
    tensor.numpy = None
    tensor.sparsity = None
    tensor.type = tool_tensor.DYNAMIC_TENSOR if name else tool_tensor.STATIC_TENSOR
    tensor.shape = list(info.shape) if info is not None else []
    tensor.dtype = _numpy_type(info.elem_type) if info is not None else np.float32
    return tensor


@functools.cache
def _numpy_type(elem_type: int) -> type[np.generic]:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).type


class _ElementwisePredicate(tool_node.Node):  # type: ignore[misc]  # onnx-tool is untyped
    """An element-wise test (`IsNaN`, `IsInf`): one comparison per element, boolean output."""

    def shape_infer(self, intensors: list[Any], outtensors: list[Any]) -> None:
        outtensors[0].update_shape(intensors[0].get_shape())
        outtensors[0].update_dtype(np.bool_)

    def profile(self, intensors: list[Any], outtensors: list[Any]) -> list[int]:
        del intensors
        return [tool_tensor.volume(outtensors[0].get_shape()) * tool_node.CMP_MACS, 0]


class IsNaNNode(_ElementwisePredicate):
    """onnx-tool profiler for ONNX `IsNaN`, which onnx-tool 1.0.1 does not know."""

    def value_infer(self, intensors: list[Any], outtensors: list[Any]) -> None:
        outtensors[0].update_tensor(np.isnan(intensors[0].get_numpy()))


class IsInfNode(_ElementwisePredicate):
    """onnx-tool profiler for ONNX `IsInf`, which onnx-tool 1.0.1 does not know."""

    def value_infer(self, intensors: list[Any], outtensors: list[Any]) -> None:
        outtensors[0].update_tensor(np.isinf(intensors[0].get_numpy()))


def register_missing_operators() -> None:
    """Teach onnx-tool's registry the operators above (idempotent).

    Registration is global to onnx-tool, so onnx-tool's own graph profiler (used by
    bench/perfgraph.py as the peer) also learns them. Its registry warns on a second
    registration, hence the membership check.
    """
    for node_class in (IsNaNNode, IsInfNode):
        if node_class.__name__ not in tool_node.NODE_REGISTRY:
            tool_node.NODE_REGISTRY.register(node_class)


register_missing_operators()
