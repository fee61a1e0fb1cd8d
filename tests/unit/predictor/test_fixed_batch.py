"""Models exported with a fixed batch size are predicted at any batch where the graph follows.

The real files are the `onnx` package's own light models (ResNet-50, VGG-19, ShuffleNet, ...,
batch 1 baked into the input and into their flattening reshapes); the refusals are hand-made
graphs that bake the batch in where it cannot be rebound.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kubeseer.predictor import errors, extract

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = sorted(LIGHT.glob("light_*.onnx"))


def extracted(model, batch):
    """The PerfGraph at `batch`, the rebinding warning required when the batch is not 1."""
    if batch == 1:
        return extract.from_onnx(model, batch_size=batch)
    with pytest.warns(errors.FixedBatchWarning, match="fixed batch size of 1"):
        return extract.from_onnx(model, batch_size=batch)


def dynamic_twin(path: Path) -> bytes:
    """The same model as an export with a dynamic batch would hold it: a symbolic leading input
    dimension, and reshape targets that copy the batch (0) instead of naming it (1)."""
    model = onnx.load(str(path))
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        if dims and dims[0].dim_value == 1:
            dims[0].dim_param = "batch"
    initializers = {init.name: init for init in model.graph.initializer}
    weights = {init.name for init in model.graph.initializer}
    for node in model.graph.node:
        target = initializers.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is not None and node.input[0] not in weights:
            value = numpy_helper.to_array(target).copy()
            if value[0] == 1:
                value[0] = 0
                target.CopyFrom(numpy_helper.from_array(value, target.name))
    return model.SerializeToString()


@pytest.mark.skipif(not LIGHT_MODELS, reason="this onnx wheel ships no light test models")
@pytest.mark.parametrize("path", LIGHT_MODELS, ids=lambda p: p.stem)
def test_a_light_model_predicts_at_any_batch_and_its_work_scales_with_it(path):
    one = extracted(path, 1)
    for batch in (2, 64):
        graph = extracted(path, batch)
        assert graph.batch_size == batch
        assert graph.op_types == one.op_types
        assert graph.flops == batch * one.flops
        assert graph.params == one.params


@pytest.mark.skipif(not LIGHT_MODELS, reason="this onnx wheel ships no light test models")
@pytest.mark.parametrize("name", ["light_resnet50", "light_shufflenet"])
def test_a_rebound_model_is_the_graph_a_dynamic_export_gives(name):
    """ResNet-50 flattens with Reshape [1, 2048], ShuffleNet shuffles channels with 32
    reshapes to [1, 4, ...]: rebound, each is exactly its dynamic twin's graph."""
    path = LIGHT / f"{name}.onnx"
    rebound = extracted(path, 64)
    dynamic = extract.from_onnx(dynamic_twin(path), batch_size=64)
    for field in ("node_features", "edge_index", "edge_features", "global_features"):
        np.testing.assert_array_equal(getattr(rebound, field), getattr(dynamic, field))
    assert (rebound.flops, rebound.mac, rebound.params) == (
        dynamic.flops,
        dynamic.mac,
        dynamic.params,
    )


def fixed_batch_model(target, *, width=8, concat_constant=False):
    """x [1, 4, width] -> Reshape(target) -> Relu; optionally a [1, 1, width] constant
    concatenated on axis 1 first (a class token baked at batch 1)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    initializers = [numpy_helper.from_array(np.array(target, np.int64), "shape")]
    nodes = []
    source = "x"
    if concat_constant:
        token = np.zeros((1, 1, width), np.float32)
        initializers.append(numpy_helper.from_array(token, "token"))
        nodes.append(helper.make_node("Concat", ["token", "x"], ["joined"], axis=1))
        source = "joined"
    nodes += [
        helper.make_node("Reshape", [source, "shape"], ["flat"], name="flatten"),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "fixed", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", [[1, -1], [1, 32], [-1, 32], [0, 32]])
def test_reshapes_that_keep_the_batch_leading_are_rebound(target):
    graph = extracted(fixed_batch_model(target), 16)
    assert graph.batch_size == 16
    relu = graph.op_types.index("Relu")
    assert graph.flops == 16 * extracted(fixed_batch_model(target), 1).flops
    assert graph.node_features.shape[0] == 2 and relu == 1


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ([32], r"Reshape node flatten \[32\] reshape the batch into a fixed shape"),
        ([2, 16], r"Reshape node flatten \[2, 16\] reshape the batch into a fixed shape"),
    ],
)
def test_a_reshape_that_bakes_the_batch_in_is_refused_naming_it(target, message):
    with pytest.raises(errors.BindingError, match=message):
        extract.from_onnx(fixed_batch_model(target), batch_size=16)


def test_a_constant_of_batch_size_concatenated_with_activations_is_refused():
    model = fixed_batch_model([1, -1], concat_constant=True)
    assert extract.from_onnx(model, batch_size=1).batch_size == 1
    with pytest.raises(errors.BindingError, match="fixed batch size of 1 and its graph does not"):
        extract.from_onnx(model, batch_size=4)


def test_inputs_that_disagree_on_their_leading_size_are_refused():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    graph = helper.make_graph([node], "two", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(errors.BindingError, match=r"fixed leading dimensions \[1, 3\]"):
        extract.from_onnx(model, batch_size=8)


@pytest.mark.skipif(not LIGHT_MODELS, reason="this onnx wheel ships no light test models")
def test_a_prediction_of_a_rebound_model_says_so():
    from kubeseer.predictor import api

    made = api.Predictor.load().predict(LIGHT / "light_resnet50.onnx", 128, "infer")
    assert made.batch_size == 128
    assert any("fixed batch size of 1" in w and "rebound to 128" in w for w in made.warnings)
