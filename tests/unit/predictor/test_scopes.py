"""Module paths read from either of PyTorch's ONNX exporters (`extract.scopes`)."""

import dataclasses

import onnx
import pytest
import torch

from kubeseer.predictor import extract
from kubeseer.predictor.extract import scopes


def _node(name: str, name_scopes: str | None = None) -> onnx.NodeProto:
    node = onnx.helper.make_node("Relu", ["x"], ["y"], name=name)
    if name_scopes is not None:
        entry = node.metadata_props.add()
        entry.key, entry.value = scopes.NAME_SCOPES, name_scopes
    return node


def test_a_torchscript_node_name_carries_its_module_path() -> None:
    assert scopes.module_path(_node("/blocks/blocks.0/norm/LayerNormalization")) == (
        "blocks/blocks.0/norm"
    )


def test_a_dynamo_node_carries_its_module_path_in_metadata() -> None:
    stack = "['', 'blocks', 'blocks.0', 'blocks.0.norm', 'layer_norm']"
    assert scopes.module_path(_node("node_layer_norm", stack)) == "blocks/blocks.0/blocks.0.norm"
    # an operator of the top-level forward: the root module and the FX node only
    assert scopes.module_path(_node("node_add", "['', 'add']")) == ""


@pytest.mark.parametrize(
    "stack",
    [
        "not a list",
        "['blocks', 'relu']",  # no root module first
        "['', 3, 'relu']",
        "['', 'a/b', 'relu']",  # a path separator inside a module name
        "__import__('os').system('true')",
        "[" * 10_000,
        "['', '" + "x" * 70_000 + "', 'relu']",
    ],
)
def test_metadata_that_is_no_module_stack_gives_no_path(stack: str) -> None:
    assert scopes.module_path(_node("node_relu", stack)) == ""


def test_a_name_without_a_path_and_no_metadata_gives_no_path() -> None:
    assert scopes.module_path(_node("node_Conv_3")) == ""


def test_a_graph_stored_before_paths_were_kept_reads_them_from_its_names(
    torchscript_onnx,
) -> None:
    network = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    graph = extract.from_onnx(torchscript_onnx(network, torch.randn(2, 4)), batch_size=2)
    assert any(graph.scopes)
    stored_before = dataclasses.replace(graph, scopes=())
    assert [stored_before.scope_of(n) for n in range(graph.num_nodes)] == list(graph.scopes)


def _chain(*nodes: tuple[str, str | None]) -> list[onnx.NodeProto]:
    """Relus reading one another in order, each named and given a dynamo stack or none."""
    chain = []
    for i, (name, stack) in enumerate(nodes):
        node = onnx.helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=name)
        if stack is not None:
            entry = node.metadata_props.add()
            entry.key, entry.value = scopes.NAME_SCOPES, stack
        chain.append(node)
    return chain


def test_an_operator_a_dynamo_rewrite_made_runs_in_the_module_around_its_neighbours() -> None:
    paths = scopes.module_paths(
        _chain(
            ("node_a", "['', 'layers', 'layers.0', 'layers.0.attn', 'mul']"),
            ("node_Split_1", None),
            ("node_b", "['', 'layers', 'layers.0', 'layers.0.attn', 'neg']"),
            ("node_c", "['', 'layers', 'layers.1', 'add']"),
            ("node_Split_2", None),
            ("node_d", "['', 'head', 'linear']"),
        )
    )
    assert paths == (
        "layers/layers.0/layers.0.attn",
        "layers/layers.0/layers.0.attn",
        "layers/layers.0/layers.0.attn",
        "layers/layers.1",
        "",  # between two top-level modules: the top-level forward
        "head",
    )


def test_a_torchscript_export_keeps_the_paths_its_names_give() -> None:
    paths = scopes.module_paths(_chain(("/layer1/conv/Conv", None), ("Relu_7", None)))
    assert paths == ("layer1/conv", "")


def _fused_convolution(weight: str) -> onnx.NodeProto:
    node = onnx.helper.make_node("Conv", ["x", weight], ["y"], name="node_Conv_12")
    for key, value in (
        (scopes.NAME_SCOPES, "['', 'stem', 'stem.norm1', '_native_batch_norm_legit_no_training']"),
        (scopes.REWRITE_RULES, "RemoveOptionalBiasFromConv, FuseBatchNormIntoConv"),
    ):
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    return node


def test_a_convolution_a_batchnorm_was_fused_into_ran_in_its_weights_module() -> None:
    assert scopes.module_path(_fused_convolution("stem.conv1.weight")) == "stem/stem.conv1"
    # a weight not named by its module: the path the rewriter left
    assert scopes.module_path(_fused_convolution("val_17")) == "stem/stem.norm1"
