import hashlib

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper

from kubeseer import zoo
from kubeseer.predictor import extract
from kubeseer.zoo import export

RESNET = zoo.ModelSpec(
    "resnet",
    {
        "block": "bottleneck",
        "layers": [1, 1],
        "widths": [8, 16],
        "stem_width": 8,
        "groups": 1,
        "width_per_group": 64,
        "num_classes": 10,
    },
    {"image_size": 32, "channels": 3},
)
GPT = zoo.ModelSpec(
    "gpt",
    {"layers": 1, "hidden": 16, "heads": 2, "ffn": 32, "max_positions": 32},
    {"seq_len": 8, "vocab_size": 64},
)
VIT = zoo.ModelSpec(
    "vit",
    {"layers": 1, "hidden": 24, "heads": 3, "ffn": 48, "num_classes": 10, "patch_size": 16},
    {"image_size": 32, "channels": 3},
)


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def resnet_twice(tmp_path_factory):
    paths = []
    for name in ("first", "second", "no-weights"):
        folder = tmp_path_factory.mktemp(name)
        paths.append(
            export.export_onnx(RESNET, folder / "m.onnx", with_weights=name != "no-weights")
        )
    return paths


def test_export_is_byte_identical_across_runs(resnet_twice):
    first, second, _ = resnet_twice
    assert first.read_bytes() == second.read_bytes()
    sidecar = first.with_name("m.onnx.data")
    assert sidecar.read_bytes() == second.with_name("m.onnx.data").read_bytes()


def test_export_without_weights_writes_the_same_graph_and_no_sidecar(resnet_twice):
    with_weights, _, without = resnet_twice
    assert graph_structure(without) == graph_structure(with_weights)
    assert not without.with_name("m.onnx.data").exists()
    proto = onnx.load(str(without), load_external_data=False)
    external = [i for i in proto.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert external, "large weights must be external-data references"
    sizes = {
        i.name: int(next(e.value for e in i.external_data if e.key == "length")) for i in external
    }
    for init in external:
        assert sizes[init.name] == int(np.prod(init.dims)) * 4
        assert init.data_type == onnx.TensorProto.FLOAT


def graph_structure(path):
    """Operators, attributes, wiring and initializer layout of an exported graph, with each
    value named by what produces it (the exporter's names for intermediate values depend on
    how many operators torch traced before), and no weight values."""
    graph = onnx.load(str(path), load_external_data=False).graph
    made_by = {value.name: ("input", value.name) for value in graph.input}
    made_by.update({i.name: ("initializer", i.name) for i in graph.initializer})
    nodes = []
    for index, node in enumerate(graph.node):
        inputs = [made_by.get(name, ("", "")) for name in node.input]
        attributes = [a.SerializeToString(deterministic=True) for a in node.attribute]
        nodes.append((node.op_type, node.domain, inputs, len(node.output), attributes))
        made_by.update({name: ("node", index, slot) for slot, name in enumerate(node.output)})
    layout = [
        (i.name, list(i.dims), i.data_type, i.data_location, list(i.external_data))
        for i in graph.initializer
    ]
    outputs = [(made_by[o.name], o.type.SerializeToString()) for o in graph.output]
    return nodes, layout, outputs


@pytest.mark.parametrize("family", ["resnet", "mobilenet_v2", "densenet", "bert", "llama"])
def test_a_weight_free_export_is_the_graph_a_weighted_one_is(family, tmp_path):
    # BatchNorm folded into convolutions, depthwise convolutions, concatenations, tied
    # embeddings, grouped-query attention with rotary positions: the optimiser folds and
    # deduplicates on values, and broadcast placeholders must make it fold the same way
    spec = zoo.sample_specs(family, 1, seed=3, size="tiny")[0]
    for folder in ("weighted", "free"):
        (tmp_path / folder).mkdir()
    weighted = export.export_onnx(spec, tmp_path / "weighted" / "m.onnx")
    free = export.export_onnx(spec, tmp_path / "free" / "m.onnx", with_weights=False)
    assert graph_structure(free) == graph_structure(weighted)
    bindings = {"seq": spec.input["seq_len"]} if "seq_len" in spec.input else None
    graphs = [extract.from_onnx(p, batch_size=3, inputs=bindings) for p in (weighted, free)]
    for name in ("node_features", "edge_index", "edge_features", "global_features"):
        np.testing.assert_array_equal(getattr(graphs[0], name), getattr(graphs[1], name))
    assert (graphs[0].flops, graphs[0].params, graphs[0].mac) == (
        graphs[1].flops,
        graphs[1].params,
        graphs[1].mac,
    )


def test_a_weight_free_export_holds_no_weights_in_memory(tmp_path):
    # Llama 2 13B: 52 GB of fp32 weights; its graph exports in a few hundred MB of memory
    # (a 256-token sequence keeps the exporter's own shape work small)
    spec = zoo.standard_spec("llama-2-13b")
    spec = zoo.ModelSpec(spec.family, spec.arch, {**spec.input, "seq_len": 256})
    model = export._build_for_export(spec, materialise=False)
    held = {p.untyped_storage().nbytes() for p in model.parameters()}
    assert held == {4}  # one fp32 element per parameter, broadcast over its shape
    assert len({float(p.reshape(-1)[0]) for p in model.parameters()}) == len(
        list(model.parameters())
    )


def test_exported_weight_count_matches_the_torch_model(resnet_twice):
    proto = onnx.load(str(resnet_twice[2]), load_external_data=False)
    exported = sum(int(np.prod(i.dims)) for i in proto.graph.initializer if i.data_type == 1)
    # BatchNorm folds into its convolution: each BN's 2C affine parameters become a C bias.
    model = zoo.build_model(RESNET)
    bn_channels = sum(
        m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)
    )
    assert exported == zoo.parameter_count(RESNET) - bn_channels


def test_batch_dimension_is_symbolic_and_named_batch(resnet_twice):
    proto = onnx.load(str(resnet_twice[0]), load_external_data=False)
    (graph_input,) = proto.graph.input
    assert graph_input.name == "input"
    assert dims(graph_input) == ["batch", 3, 32, 32]
    assert dims(proto.graph.output[0]) == ["batch", 10]


def test_export_carries_no_install_paths(resnet_twice):
    assert b"site-packages" not in resnet_twice[0].read_bytes()
    assert b"kubeseer/zoo" not in resnet_twice[0].read_bytes()


def test_each_operator_keeps_its_module_path_and_rewrites_and_nothing_else(resnet_twice):
    proto = onnx.load(str(resnet_twice[0]), load_external_data=False)
    kept = {entry.key for node in proto.graph.node for entry in node.metadata_props}
    assert kept == set(export.KEPT_METADATA)  # a ResNet's BatchNorms are fused into its convs
    paths = [
        next(e.value for e in node.metadata_props if e.key == export.MODULE_PATH_KEY)
        for node in proto.graph.node
        if node.metadata_props
    ]
    assert any("'features.4.body'" in path for path in paths)


def test_exported_model_runs_in_onnxruntime_at_other_batch_sizes(resnet_twice):
    session = onnxruntime.InferenceSession(str(resnet_twice[0]))
    model = export._build_for_export(RESNET)
    for batch in (1, 5):
        (x,), _ = zoo.example_batch(RESNET, batch)
        (got,) = session.run(None, {"input": x.numpy()})
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def gpt_path(tmp_path_factory):
    return export.export_onnx(GPT, tmp_path_factory.mktemp("gpt") / "gpt.onnx")


def test_token_model_has_symbolic_batch_and_seq(gpt_path):
    proto = onnx.load(str(gpt_path), load_external_data=False)
    (graph_input,) = proto.graph.input
    assert graph_input.name == "input_ids"
    assert dims(graph_input) == ["batch", "seq"]
    assert dims(proto.graph.output[0]) == ["batch", "seq", 64]
    session = onnxruntime.InferenceSession(str(gpt_path))
    ids = np.zeros((3, 5), dtype=np.int64)
    assert session.run(None, {"input_ids": ids})[0].shape == (3, 5, 64)


@pytest.mark.parametrize("with_weights", [True, False])
def test_fresh_initialisation_does_not_change_the_exported_structure(with_weights, tmp_path):
    # Zero biases and unit norm scales would let the optimiser drop or merge initializers.
    path = export.export_onnx(GPT, tmp_path / "gpt.onnx", with_weights=with_weights)
    proto = onnx.load(str(path), load_external_data=False)
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    assert len(norms) == 3  # two per block plus the final one
    assert len({n.input[1] for n in norms}) == 3, "norm scales must not be deduplicated"
    assert len({n.input[2] for n in norms}) == 3, "zero norm biases must survive"


def test_dropout_is_exported_in_training_mode(gpt_path):
    # GPT's block: dropout on the embeddings, the attention weights, the attention output and
    # the feed-forward output, all at rate 0.1; nothing else in the model is random.
    proto = onnx.load(str(gpt_path), load_external_data=False)
    dropouts = [n for n in proto.graph.node if n.op_type == "Dropout"]
    assert len(dropouts) == 4
    constants = {i.name: i for i in proto.graph.initializer}
    for node in dropouts:
        training_mode = numpy_helper.to_array(constants[node.input[2]])
        assert bool(training_mode), "dropout must export in training mode"


def test_dropout_at_rate_zero_stays_out_of_the_graph(tmp_path):
    path = export.export_onnx(VIT, tmp_path / "vit.onnx", with_weights=False)
    proto = onnx.load(str(path), load_external_data=False)
    assert "Dropout" not in {n.op_type for n in proto.graph.node}


def test_batchnorm_is_folded_while_dropout_trains(resnet_twice):
    proto = onnx.load(str(resnet_twice[0]), load_external_data=False)
    assert "BatchNormalization" not in {n.op_type for n in proto.graph.node}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert-base"])
def test_standard_models_export_deterministically_without_weights(name, tmp_path):
    spec = zoo.standard_spec(name)
    digests = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        path = export.export_onnx(spec, tmp_path / run / "m.onnx", with_weights=False)
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
