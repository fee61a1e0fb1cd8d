"""FLOP counting: own formulas against onnx-tool's profilers, on real ONNX models."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from onnx_tool import node as tool_node

from kubeseer.predictor import opcount
from kubeseer.predictor.extract import binding, shapes, structure, tensors

BACKEND_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
LIGHT_MODELS = sorted((BACKEND_DATA / "light").glob("light_*.onnx"))
# Single-operator models torch exported with weights; they cover grouped, dilated, strided,
# padded, 1-D and 3-D convolutions, transposed convolutions and linear layers.
CONVERTED = sorted(
    path / "model.onnx"
    for path in (BACKEND_DATA / "pytorch-converted").iterdir()
    if path.name.startswith(("test_Conv1d", "test_Conv2d", "test_Conv3d", "test_Linear"))
)


def shaped_nodes(path: Path) -> list[tuple[onnx.NodeProto, list, list]]:
    """Every node of a model with the static info of its input and output slots."""
    model = onnx.load(str(path))
    weights = {init.name for init in model.graph.initializer}
    data = next(vi for vi in model.graph.input if vi.name not in weights)
    batch = data.type.tensor_type.shape.dim[0].dim_value  # these models have a fixed batch
    model, nodes = structure.check(model)
    bound = binding.bind_inputs(model.graph, batch, {})
    table = shapes.infer(model, nodes, bound)
    return [
        (
            node,
            [tensors.optional(table, n) if n else None for n in node.input],
            [tensors.optional(table, n) if n else None for n in node.output],
        )
        for node in model.graph.node
    ]


def bias_adds(node, inputs, outputs) -> int:
    has_bias = node.op_type != "MatMul" and len(inputs) > 2 and inputs[2] is not None
    return outputs[0].numel if has_bias else 0


@pytest.mark.parametrize("path", [*CONVERTED, *LIGHT_MODELS], ids=lambda p: p.parent.name + p.name)
def test_conv_gemm_matmul_formulas_match_onnx_tool(path):
    checked = 0
    for node, inputs, outputs in shaped_nodes(path):
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        count = opcount.node_flops(node, inputs, outputs)
        tool = opcount.onnx_tool_macs(node, inputs, outputs)
        bias = bias_adds(node, inputs, outputs)
        # onnx-tool: one "MAC" per multiply-accumulate plus one per output for the bias.
        assert count.flops == 2 * (tool - bias) + bias, node.name
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.name)
def test_per_element_shortcut_matches_onnx_tool_profilers(path):
    for node, inputs, outputs in shaped_nodes(path):
        if node.op_type in ("Conv", "Gemm", "MatMul") or not outputs[0] or not outputs[0].shape:
            continue  # onnx-tool counts a scalar output as zero elements
        count = opcount.node_flops(node, inputs, outputs)
        assert count.flops == opcount.onnx_tool_macs(node, inputs, outputs), node.op_type


def test_conv_counts_two_flops_per_mac_and_one_per_bias_add():
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=2, pads=[1, 1, 1, 1])
    x = opcount.TensorInfo((2, 4, 8, 8), TensorProto.FLOAT)
    w = opcount.TensorInfo((6, 2, 3, 3), TensorProto.FLOAT)
    b = opcount.TensorInfo((6,), TensorProto.FLOAT)
    y = opcount.TensorInfo((2, 6, 8, 8), TensorProto.FLOAT)
    outputs = 2 * 6 * 8 * 8
    per_output = (4 // 2) * 3 * 3  # C_in / group x kernel window
    assert opcount.node_flops(node, [x, w, b], [y]).flops == 2 * outputs * per_output + outputs


def test_conv_transpose_counts_each_input_element_through_the_kernel():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])
    x = opcount.TensorInfo((1, 8, 5, 5), TensorProto.FLOAT)
    w = opcount.TensorInfo((8, 3, 2, 2), TensorProto.FLOAT)  # (C_in, C_out / group, kH, kW)
    y = opcount.TensorInfo((1, 3, 10, 10), TensorProto.FLOAT)
    macs = (8 * 5 * 5) * (3 * 2 * 2)
    assert opcount.node_flops(node, [x, w], [y]).flops == 2 * macs


def test_gemm_honours_transposes():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1)
    a = opcount.TensorInfo((64, 8), TensorProto.FLOAT)  # (K, M)
    b = opcount.TensorInfo((32, 64), TensorProto.FLOAT)  # (N, K)
    c = opcount.TensorInfo((32,), TensorProto.FLOAT)
    y = opcount.TensorInfo((8, 32), TensorProto.FLOAT)
    assert opcount.node_flops(node, [a, b, c], [y]).flops == 2 * 8 * 32 * 64 + 8 * 32


def test_batched_matmul_counts_broadcast_batches_and_vector_operands():
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    a = opcount.TensorInfo((4, 12, 128, 64), TensorProto.FLOAT)
    b = opcount.TensorInfo((64, 128), TensorProto.FLOAT)
    y = opcount.TensorInfo((4, 12, 128, 128), TensorProto.FLOAT)
    assert opcount.node_flops(node, [a, b], [y]).flops == 2 * 4 * 12 * 128 * 128 * 64
    vector = opcount.TensorInfo((64,), TensorProto.FLOAT)
    rows = opcount.TensorInfo((4, 12, 128), TensorProto.FLOAT)
    assert opcount.node_flops(node, [a, vector], [rows]).flops == 2 * 4 * 12 * 128 * 64


def test_isnan_is_registered_with_onnx_tool():
    node = helper.make_node("IsNaN", ["x"], ["y"])
    x = opcount.TensorInfo((3, 5), TensorProto.FLOAT)
    y = opcount.TensorInfo((3, 5), TensorProto.BOOL)
    assert opcount.onnx_tool_macs(node, [x], [y]) == 15
    assert opcount.node_flops(node, [x], [y]) == opcount.OpCount(15, known=True)


def test_erf_costs_a_tanh_per_element_rather_than_nothing():
    erf = helper.make_node("Erf", ["x"], ["y"])
    x = opcount.TensorInfo((2, 128, 3072), TensorProto.FLOAT)
    assert opcount.onnx_tool_macs(erf, [x], [x]) == 0
    assert opcount.node_flops(erf, [x], [x]).flops == tool_node.TANH_MACS * x.numel


def test_data_movement_is_free_and_custom_domains_are_unknown():
    x = opcount.TensorInfo((2, 3), TensorProto.FLOAT)
    shape = opcount.TensorInfo((1,), TensorProto.INT64)
    y = opcount.TensorInfo((6,), TensorProto.FLOAT)
    reshape = helper.make_node("Reshape", ["x", "s"], ["y"])
    assert opcount.node_flops(reshape, [x, shape], [y]) == opcount.OpCount(0, known=True)
    custom = helper.make_node("Fancy", ["x"], ["y"], domain="com.example")
    assert opcount.node_flops(custom, [x], [x]) == opcount.OpCount(0, known=False)


def test_sum_counts_one_add_per_extra_input():
    node = helper.make_node("Sum", ["a", "b", "c"], ["y"])
    t = opcount.TensorInfo((10,), TensorProto.FLOAT)
    assert opcount.node_flops(node, [t, t, t], [t]).flops == 20


def test_tensor_bytes_follow_the_element_type():
    assert opcount.TensorInfo((4, 4), TensorProto.FLOAT16).nbytes == 32
    assert opcount.TensorInfo((4, 4), TensorProto.FLOAT).nbytes == 64
    assert opcount.TensorInfo((3,), TensorProto.INT4).nbytes == 2  # rounded up
    assert opcount.TensorInfo((), TensorProto.INT64).nbytes == 8


ELEMENTWISE = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Sqrt",
    "Exp",
    "Log",
    "Tanh",
    "Sigmoid",
    "Softmax",
    "Gelu",
    "Relu",
    "LeakyRelu",
    "HardSigmoid",
    "Clip",
    "Neg",
    "Abs",
    "Max",
    "Min",
    "Where",
    "Equal",
    "Less",
    "Not",
    "Reciprocal",
    "Sin",
    "Cos",
]


@pytest.mark.parametrize("op", ELEMENTWISE)
@pytest.mark.parametrize("arity", [1, 2, 3])
def test_per_element_shortcut_matches_onnx_tool_on_transformer_ops(op, arity):
    node = helper.make_node(op, [f"x{i}" for i in range(arity)], ["y"])
    t = opcount.TensorInfo((2, 16, 64), TensorProto.FLOAT)
    count = opcount.node_flops(node, [t] * arity, [t])
    assert count.known
    assert count.flops == opcount.onnx_tool_macs(node, [t] * arity, [t])
