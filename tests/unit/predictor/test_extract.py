"""ONNX -> PerfGraph on hand-written graphs whose features are recomputed by hand."""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kubeseer.predictor import errors, extract, schema
from kubeseer.predictor.extract import layout

N = schema.NODE_FEATURES.index
E = schema.EDGE_FEATURES.index
G = schema.GLOBAL_FEATURES.index
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def conv_block(dtype: int = TensorProto.FLOAT, *, weights: str = "inline") -> onnx.ModelProto:
    """x -> Conv(3->4, 3x3, pad 1, bias) -> c; Relu(c) -> r; Add(r, c) -> a; MaxPool 2x2/2.

    Four operators, four edges (c feeds both Relu and Add). `weights` selects how the
    convolution weight is stored: "inline", "stripped" (dims kept, data dropped) or
    "constant_of_shape" (a ConstantOfShape node, as in ONNX's light test models).
    """
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.5, dtype=np_type), "w")
    b = numpy_helper.from_array(np.zeros(4, dtype=np_type), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "c"], ["a"], name="add"),
        helper.make_node("MaxPool", ["a"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    initializers = [w, b]
    if weights == "stripped":
        w.ClearField("raw_data")
    elif weights == "constant_of_shape":
        initializers = [
            b,
            numpy_helper.from_array(np.array([4, 3, 3, 3], dtype=np.int64), "w_shape"),
        ]
        fill = numpy_helper.from_array(np.array([0.5], dtype=np_type), "fill")
        nodes.insert(0, helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill))
    graph = helper.make_graph(
        nodes,
        "conv_block",
        [helper.make_tensor_value_info("x", dtype, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", dtype, ["batch", 4, 4, 4])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attention_scores() -> onnx.ModelProto:
    """q = x @ W; split into 2 heads; scores = q_heads @ q_heads^T (B, heads, T, T)."""
    w = numpy_helper.from_array(np.ones((16, 16), dtype=np.float32), "w")
    split = numpy_helper.from_array(np.array([0, 0, 2, 8], dtype=np.int64), "split")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["q"], name="proj"),
        helper.make_node("Reshape", ["q", "split"], ["qh"], name="heads"),
        helper.make_node("Transpose", ["qh"], ["qt"], name="bhtd", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["qh"], ["kt"], name="bhdt", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["s"], name="scores"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 2, "seq", "seq"])],
        [w, split],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# Hand computation for conv_block at batch 2 (fp32):
CONV_OUT = 2 * 4 * 8 * 8  # 512 elements, 2048 bytes
CONV_FLOPS = 2 * CONV_OUT * 3 * 3 * 3 + CONV_OUT  # 2 per MAC (27 per output) + bias adds
FLOPS = [CONV_FLOPS, CONV_OUT, CONV_OUT, (2 * 4 * 4 * 4) * 4]  # Relu, Add: 1/elem; pool: 4/out
WEIGHT_BYTES = [(108 + 4) * 4, 0, 0, 0]
MAC = [
    2 * 3 * 8 * 8 * 4 + WEIGHT_BYTES[0] + 2048,  # x + weights + c
    2048 + 2048,  # c + r
    2048 + 2048 + 2048,  # r + c + a
    2048 + 2 * 4 * 4 * 4 * 4,  # a + y
]


def test_conv_block_node_features_match_hand_computation():
    graph = extract.from_onnx(conv_block(), batch_size=2)
    assert graph.op_types == ("Conv", "Relu", "Add", "MaxPool")
    assert graph.node_names == ("conv", "relu", "add", "pool")
    x = graph.node_features
    np.testing.assert_array_equal(x[:, N("flops")], FLOPS)
    np.testing.assert_array_equal(x[:, N("mac_bytes")], MAC)
    np.testing.assert_array_equal(x[:, N("weight_bytes")], WEIGHT_BYTES)
    np.testing.assert_allclose(x[:, N("arithmetic_intensity")], np.divide(FLOPS, MAC))
    np.testing.assert_allclose(x[:, N("flops_share")], np.divide(FLOPS, sum(FLOPS)))
    np.testing.assert_allclose(x[:, N("mac_share")], np.divide(MAC, sum(MAC)))
    np.testing.assert_allclose(x[:, N("weight_share")], [1, 0, 0, 0])
    conv_hp = dict(zip(schema.NODE_FEATURES, x[0], strict=False))
    assert conv_hp | {
        "kernel_h": 3, "kernel_w": 3, "stride_h": 1, "stride_w": 1, "pad_h": 2, "pad_w": 2,
        "dilation_h": 1, "dilation_w": 1, "group": 1, "in_channels": 3, "out_channels": 4,
        "has_bias": 1, "num_inputs": 1, "num_outputs": 1, "elem_bytes": 4, "gemm_m": 0,
    } == conv_hp  # fmt: skip
    pool_hp = dict(zip(schema.NODE_FEATURES, x[3], strict=False))
    assert (pool_hp["kernel_h"], pool_hp["stride_w"], pool_hp["group"]) == (2, 2, 0)
    assert x[2, N("num_inputs")] == 2  # Add reads r and c
    assert x[1, N("kernel_h")] == 0  # Relu has no window


def test_conv_block_edges_are_activation_tensors_between_operators():
    graph = extract.from_onnx(conv_block(), batch_size=2)
    edges = sorted(zip(graph.edge_index[0].tolist(), graph.edge_index[1].tolist(), strict=True))
    assert edges == [(0, 1), (0, 2), (1, 2), (2, 3)]  # c->Relu, c->Add, r->Add, a->MaxPool
    np.testing.assert_array_equal(graph.edge_features, [[2048, 2, 4, 8, 8]] * 4)


def test_conv_block_global_features_match_hand_computation():
    graph = extract.from_onnx(conv_block(), batch_size=2)
    u = graph.global_dict()
    expected = {
        "num_nodes": 4, "num_edges": 4, "density": 4 / 12,
        "flops_total": sum(FLOPS), "flops_mean": sum(FLOPS) / 4,
        "flops_median": statistics.median(FLOPS), "flops_max": max(FLOPS),
        "mac_total": sum(MAC), "mac_mean": sum(MAC) / 4,
        "mac_median": statistics.median(MAC), "mac_max": max(MAC),
        "weight_bytes_total": 448, "weight_bytes_mean": 112, "weight_bytes_median": 0,
        "weight_bytes_max": 448, "edge_bytes_mean": 2048,
        "arithmetic_intensity": sum(FLOPS) / sum(MAC), "batch_size": 2,
    }  # fmt: skip
    assert u == pytest.approx(expected)
    assert (graph.flops, graph.mac, graph.params) == (sum(FLOPS), sum(MAC), 112)


def test_features_do_not_depend_on_the_topological_order_in_the_file():
    model = attention_scores()
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    nodes = list(model.graph.node)
    nodes[2], nodes[3] = nodes[3], nodes[2]  # the two Transposes are independent
    del swapped.graph.node[:]
    swapped.graph.node.extend(nodes)
    a = extract.from_onnx(model, batch_size=2, inputs={"seq": 5})
    b = extract.from_onnx(swapped, batch_size=2, inputs={"seq": 5})
    rows_a = dict(zip(a.node_names, a.node_features.tolist(), strict=True))
    rows_b = dict(zip(b.node_names, b.node_features.tolist(), strict=True))
    assert rows_a == rows_b

    def named_edges(g):
        pairs = zip(g.edge_index[0], g.edge_index[1], g.edge_features.tolist(), strict=True)
        return sorted((g.node_names[s], g.node_names[t], f) for s, t, f in pairs)

    assert named_edges(a) == named_edges(b)
    np.testing.assert_array_equal(a.global_features, b.global_features)


def test_batch_size_scales_activation_bytes_and_flops_but_not_weights():
    one = extract.from_onnx(conv_block(), batch_size=1)
    four = extract.from_onnx(conv_block(), batch_size=4)
    assert four.flops == 4 * one.flops
    assert four.params == one.params
    assert four.global_dict()["weight_bytes_total"] == one.global_dict()["weight_bytes_total"]
    assert four.edge_features[0, E("batch")] == 4
    assert four.global_dict()["batch_size"] == 4


def test_fp16_export_has_half_the_bytes_and_the_same_flops():
    fp32 = extract.from_onnx(conv_block(TensorProto.FLOAT), batch_size=2)
    fp16 = extract.from_onnx(conv_block(TensorProto.FLOAT16), batch_size=2)
    assert fp16.flops == fp32.flops
    assert fp16.mac * 2 == fp32.mac
    np.testing.assert_array_equal(fp16.edge_features[:, 0] * 2, fp32.edge_features[:, 0])
    assert fp16.node_features[0, N("elem_bytes")] == 2


@pytest.mark.parametrize("weights", ["stripped", "constant_of_shape"])
def test_weights_are_never_needed(weights):
    reference = extract.from_onnx(conv_block(), batch_size=2)
    graph = extract.from_onnx(conv_block(weights=weights), batch_size=2)
    assert graph.op_types == reference.op_types  # ConstantOfShape folds into a weight
    np.testing.assert_array_equal(graph.node_features, reference.node_features)
    np.testing.assert_array_equal(graph.global_features, reference.global_features)
    assert graph.params == reference.params


def test_external_data_file_is_never_opened(tmp_path):
    model = conv_block()
    onnx.save(
        model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0
    )
    (tmp_path / "m.data").unlink()
    graph = extract.from_onnx(tmp_path / "m.onnx", batch_size=2)
    reference = extract.from_onnx(model, batch_size=2)
    np.testing.assert_array_equal(graph.node_features, reference.node_features)


def test_digest_is_sha256_of_the_serialised_model(tmp_path):
    model = conv_block()
    data = model.SerializeToString()
    (tmp_path / "m.onnx").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert extract.from_onnx(tmp_path / "m.onnx", batch_size=1).model_digest == expected
    assert extract.from_onnx(data, batch_size=1).model_digest == expected
    assert extract.from_onnx(model, batch_size=1).model_digest == expected


def test_attention_heads_gemm_dims_and_sequence_binding():
    graph = extract.from_onnx(attention_scores(), batch_size=3, inputs={"seq": 10})
    x = graph.node_features
    proj, scores = 0, graph.op_types.index("MatMul", 1)
    assert (x[proj, N("gemm_m")], x[proj, N("gemm_k")], x[proj, N("units")]) == (30, 16, 16)
    assert x[proj, N("flops")] == 2 * 3 * 10 * 16 * 16
    assert x[scores, N("heads")] == 2
    assert x[scores, N("flops")] == 2 * 3 * 2 * 10 * 10 * 8
    assert x[proj, N("heads")] == 0
    # (B, T, C) activations map to (B, C, T, 1); (B, heads, T, T) scores stay as they are.
    first = list(graph.edge_index[0]).index(proj)
    np.testing.assert_array_equal(graph.edge_features[first], [3 * 10 * 16 * 4, 3, 16, 10, 1])


def test_rank_mapping_keeps_the_element_count():
    for shape in [(), (7,), (2, 5), (2, 5, 3), (2, 3, 4, 5), (2, 3, 4, 5, 6)]:
        for channel_first in (True, False):
            assert np.prod(layout.bchw(shape, channel_first=channel_first)) == np.prod(shape)
    assert layout.bchw((2, 5, 3), channel_first=True) == (2, 5, 3, 1)
    assert layout.bchw((2, 5, 3), channel_first=False) == (2, 3, 5, 1)
    assert layout.bchw((2, 3, 4, 5, 6), channel_first=True) == (2, 3, 20, 6)


def test_shape_arithmetic_through_range_is_resolved():
    """torch.arange(seq_len) exports as Shape -> Gather -> Range, which ONNX inference drops."""
    table = numpy_helper.from_array(np.ones((32, 8), dtype=np.float32), "table")
    consts = [
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["positions"]),
        helper.make_node("Gather", ["table", "positions"], ["pos"], axis=0),
        helper.make_node("Gather", ["table", "ids"], ["tok"], axis=0),
        helper.make_node("Add", ["tok", "pos"], ["h"]),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        [table, *consts],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = extract.from_onnx(model, batch_size=2, inputs={"seq": 12})
    add = result.op_types.index("Add")
    assert result.node_features[add, N("flops")] == 2 * 12 * 8


def test_light_resnet50_counts_batchnorm_statistics_as_weights():
    graph = extract.from_onnx(LIGHT / "light_resnet50.onnx", batch_size=1)
    # torchvision's 25,557,032 parameters plus BatchNorm running mean and variance (53,120).
    assert graph.params == 25_557_032 + 53_120
    assert graph.op_types.count("Conv") == 53
    assert "ConstantOfShape" not in graph.op_types
    assert graph.flops == pytest.approx(2 * 4.1e9, rel=0.06)


@pytest.mark.parametrize("path", sorted(LIGHT.glob("light_*.onnx")), ids=lambda p: p.stem)
def test_real_models_from_the_onnx_package_extract(path):
    graph = extract.from_onnx(path, batch_size=1)
    assert graph.num_nodes > 10 and graph.num_edges >= graph.num_nodes - 1
    assert graph.unknown_ops == ()
    assert np.isfinite(graph.node_features).all() and (graph.node_features >= 0).all()
    assert graph.node_features[:, N("flops_share")].sum() == pytest.approx(1.0)
    assert (graph.edge_index[0] != graph.edge_index[1]).all()


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"hello, world", b"\x89PNG\r\n\x1a\n" + bytes(64), np.random.default_rng(0).bytes(4096)],
    ids=["empty", "text", "png", "random"],
)
def test_non_onnx_bytes_raise_not_onnx(data):
    with pytest.raises(errors.NotOnnxError):
        extract.from_onnx(data, batch_size=1)


def test_every_truncation_raises_a_graph_error():
    data = conv_block().SerializeToString()
    for cut in range(0, len(data), max(1, len(data) // 97)):
        with pytest.raises(errors.GraphError):
            extract.from_onnx(data[:cut], batch_size=1)


def test_missing_file_and_size_limit(tmp_path):
    with pytest.raises(errors.NotOnnxError, match="cannot read"):
        extract.from_onnx(tmp_path / "absent.onnx", batch_size=1)
    with pytest.raises(errors.ModelTooLargeError):
        extract.from_onnx(conv_block(), batch_size=1, max_bytes=100)


@pytest.mark.parametrize("op", ["If", "Loop", "Scan"])
def test_control_flow_is_refused(op):
    body = helper.make_graph([], "body", [], [])
    attrs = {"If": {"then_branch": body, "else_branch": body}, "Loop": {"body": body}}
    node = helper.make_node(op, ["x"], ["y"], name="branchy", **attrs.get(op, {"body": body}))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(errors.ControlFlowError, match=f"{op} \\(branchy\\)"):
        extract.from_onnx(model, batch_size=1)


def test_unbound_symbolic_dimension_is_named():
    with pytest.raises(errors.SymbolicDimensionError, match="'seq'"):
        extract.from_onnx(attention_scores(), batch_size=2)


def test_bad_bindings_are_refused():
    with pytest.raises(errors.BindingError, match="at least 1"):
        extract.from_onnx(conv_block(), batch_size=0)
    with pytest.raises(errors.BindingError, match="height"):
        extract.from_onnx(conv_block(), batch_size=1, inputs={"height": 3})


def test_padding_clipped_at_zero_from_shapes_is_evaluated():
    """TF-style "same" padding (timm's maxvit stem): max(0, target - size) as a Clip of shape
    arithmetic, which ONNX's own data propagation does not follow."""
    const = numpy_helper.from_array
    initializers = [
        const(np.array([1], np.int64), "axis"),
        const(np.array(8.0, np.float32), "target"),
        const(np.array(0.0, np.float32), "zero"),
        const(np.array([0, 0, 0], np.int64), "no_pad"),
        const(np.array([0], np.int64), "unsqueeze_axes"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "axis"], ["width"]),
        helper.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["target", "width_f"], ["missing"]),
        helper.make_node("Clip", ["missing", "zero", ""], ["clipped"]),
        helper.make_node("Cast", ["clipped"], ["pad"], to=TensorProto.INT64),
        helper.make_node("Concat", ["no_pad", "pad"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["y"], name="same_pad"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    pad = extract.from_onnx(model, batch_size=2)
    row = pad.node_features[pad.op_types.index("Pad")]
    assert row[schema.NODE_FEATURES.index("out_channels")] == 8  # (2, 5) padded by 3 to (2, 8)


def test_value_dependent_shapes_stay_symbolic_and_are_refused():
    nodes = [
        helper.make_node("NonZero", ["x"], ["idx"], name="nz"),
        helper.make_node("Transpose", ["idx"], ["t"], name="t"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("t", TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(errors.SymbolicDimensionError, match="'idx'"):
        extract.from_onnx(model, batch_size=2)


def test_tensor_nothing_provides_is_malformed():
    model = conv_block()
    model.graph.node[1].input[0] = "ghost"
    with pytest.raises(errors.GraphError, match="ghost"):
        extract.from_onnx(model, batch_size=1)


def test_unknown_operators_cost_zero_with_one_warning():
    model = conv_block()
    relu = model.graph.node[1]
    relu.op_type, relu.domain = "FancyActivation", "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    model.graph.value_info.append(
        helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", 4, 8, 8])
    )
    with pytest.warns(errors.UnknownOperatorWarning, match="com.example.FancyActivation"):
        graph = extract.from_onnx(model, batch_size=2)
    assert graph.unknown_ops == ("com.example.FancyActivation",)
    assert graph.node_features[1, N("flops")] == 0
    assert graph.flops == sum(FLOPS) - FLOPS[1]


def dense(features: int = 640) -> onnx.ModelProto:
    """x @ W + b with a 1.6 MB inline weight: large enough to parse without its payload."""
    w = numpy_helper.from_array(np.ones((features, features), dtype=np.float32), "w")
    b = numpy_helper.from_array(np.ones(features, dtype=np.float32), "b")
    shape = numpy_helper.from_array(np.array([-1, features], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w", "b"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", features])],
        [w, b, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inline_weights_are_skipped_without_changing_the_graph(tmp_path):
    model = dense()
    data = model.SerializeToString()
    assert len(data) > 1 << 20
    (tmp_path / "dense.onnx").write_bytes(data)
    parsed = extract.from_onnx(model, batch_size=4)  # already parsed: no skipping
    for source in (data, tmp_path / "dense.onnx"):
        skipped = extract.from_onnx(source, batch_size=4)
        np.testing.assert_array_equal(skipped.node_features, parsed.node_features)
        assert skipped.model_digest == parsed.model_digest == hashlib.sha256(data).hexdigest()
    assert parsed.flops == 2 * 4 * 640 * 640 + 4 * 640
    assert parsed.params == 640 * 640 + 640


def test_truncated_large_model_raises_not_onnx():
    data = dense().SerializeToString()
    for cut in (len(data) // 3, len(data) - 10):
        with pytest.raises(errors.NotOnnxError):
            extract.from_onnx(data[:cut], batch_size=1)


def test_tied_weight_counts_once_in_params_and_per_reader_in_weight_bytes():
    """A tied embedding: Gather reads it, the output projection reads its transpose."""
    emb = numpy_helper.from_array(np.ones((50, 8), dtype=np.float32), "emb")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed"),
        helper.make_node("Transpose", ["emb"], ["emb_t"], name="tie", perm=[1, 0]),
        helper.make_node("MatMul", ["h", "emb_t"], ["logits"], name="project"),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 6])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 6, 50])],
        [emb],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = extract.from_onnx(model, batch_size=2)
    assert result.op_types == ("Gather", "MatMul")  # the weight's transpose is folded
    assert result.params == 50 * 8
    assert result.global_dict()["weight_bytes_total"] == 2 * 50 * 8 * 4


def test_equal_constants_the_exporter_merged_count_once_per_module(torchscript_onnx):
    """Freshly initialised, two blocks' LayerNorms (ones, zeros) and Linear biases (zeroed)
    hold equal values, which PyTorch's TorchScript exporter merges into one initialiser each;
    on the GPU they are parameters of their own."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def block() -> torch.nn.Module:
        linear = nn.Linear(8, 8)
        nn.init.zeros_(linear.bias)
        return nn.Sequential(nn.LayerNorm(8), linear)

    network = nn.Sequential(block(), block())
    model = torchscript_onnx(network, torch.randn(2, 4, 8))
    merged = onnx.load_from_string(model)
    assert len(merged.graph.initializer) < 6  # the exporter did merge them
    result = extract.from_onnx(model, batch_size=2)
    assert result.params == sum(p.numel() for p in network.parameters())


def test_a_constant_is_several_parameters_only_where_the_exporter_merged_it():
    count = extract.features.parameter_count
    # a module called twice, an embedding tied to the head: one parameter each
    assert count({"w": 64, "e": 400}, {"w": {"shared"}, "e": {"embed", "head"}}, []) == 464
    # zeros that three blocks read: three biases the exporter merged
    assert count({"b": 8}, {"b": {"blocks.0", "blocks.1", "blocks.2"}}, ["b"]) == 3 * 8


def test_a_stripped_constant_one_operator_type_reads_in_several_modules_was_merged():
    def initialiser(name: str) -> onnx.TensorProto:
        tensor = numpy_helper.from_array(np.random.rand(4, 4).astype(np.float32), name)
        onnx.external_data_helper.set_external_data(tensor, location="weights.bin")
        tensor.ClearField("raw_data")
        return tensor

    graph = helper.make_graph([], "g", [], [], [initialiser("w"), initialiser("e")])
    readers = {
        "w": {("Conv", "layer1/conv3"), ("Conv", "layer2/conv3")},
        "e": {("Gather", "embed"), ("MatMul", "head")},
    }
    assert extract.features.merged_constants(graph, readers) == {"w"}


@pytest.mark.parametrize(
    ("build", "bindings"),
    [(conv_block, None), (attention_scores, {"seq": 5}), (dense, None)],
    ids=["conv_block", "attention_scores", "dense"],
)
def test_corrupted_bytes_extract_or_raise_a_graph_error_never_crash(build, bindings):
    """Random byte flips reach every parser branch: names that are not UTF-8, unknown element
    types, impossible attributes. Each must end in a PerfGraph or a GraphError."""
    data = build().SerializeToString()
    rng = np.random.default_rng(7)
    for _ in range(300 if len(data) < 1 << 20 else 40):
        corrupted = bytearray(data)
        for position in rng.integers(len(data), size=rng.integers(1, 5)):
            corrupted[position] = rng.integers(256)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.UnknownOperatorWarning)
            with contextlib.suppress(errors.GraphError):
                extract.from_onnx(bytes(corrupted), batch_size=2, inputs=bindings)
