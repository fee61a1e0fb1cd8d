import dataclasses
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import extract

# Alignment 1 keeps the hand arithmetic exact; one test below checks the rounding on its own.
DEVICE = am.DeviceProfile("test", context_bytes=1000, workspace_bytes=500, alignment_bytes=1)


def conv_relu_flatten_gemm() -> am.MemoryGraph:
    """input (1000) -> Conv (2000, 100 w) -> Relu (2000) -> Reshape (view) -> Gemm (10, 50 w)."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("Conv", output_elements=2000, weight_elements=100),
            am.OpNode("Relu", output_elements=2000),
            am.OpNode("Reshape", output_elements=2000),
            am.OpNode("Gemm", output_elements=10, weight_elements=50),
        ),
        edges=((0, 1), (1, 2), (2, 3)),
        input_elements=1000,
    )


def test_inference_fp32_counts_weights_peak_live_activations_and_constants():
    got = am.estimate(
        conv_relu_flatten_gemm(), mode=Mode.INFER, precision=Precision.FP32, device=DEVICE
    )
    # Peak live: Conv's unnormalised output (the BatchNorm an eval export folds into it) with
    # its normalised output, or that with Relu's, 2 x 8000 B; plus the 4000 B input.
    assert got == am.MemoryBreakdown(
        weights=600,
        weight_copies=0,
        gradients=0,
        optimizer_state=0,
        activations=16000,
        workspace=500,
        cuda_context=1000,
        batch=4000,
    )
    assert got.total == 600 + 20000 + 500 + 1000


def test_training_walks_forward_backward_and_the_optimiser_step():
    got = am.estimate(
        conv_relu_flatten_gemm(),
        mode=Mode.TRAIN,
        precision=Precision.FP32,
        optimizer=am.Optimizer.ADAM,
        device=DEVICE,
    )
    # Saved for backward: the folded BatchNorm's input (8000 B) and Relu's output (Relu saves
    # it, Gemm reads it through the view); Conv's normalised output is freed after Relu.
    # The peak is Relu's backward: both saved tensors, the gradients of Relu's output and
    # of its input (2 x 8000 B) and Gemm's weight gradient (200 B): 32200 B, of which the
    # gradients term counts 600 B.
    assert got.weights == 600
    assert got.gradients == 600
    assert got.optimizer_state == 1200
    assert got.activations == 32200 - 600
    assert got.batch == 4000
    assert got.total == 600 + 1200 + 32200 + 4000 + 500 + 1000


@pytest.mark.parametrize(
    ("optimizer", "state_bytes"),
    [
        (am.Optimizer.ADAM, 1200),
        (am.Optimizer.ADAMW, 1200),
        (am.Optimizer.SGD_MOMENTUM, 600),
        (am.Optimizer.SGD, 0),
    ],
)
def test_optimizer_state_is_two_one_or_zero_copies_of_the_weights(optimizer, state_bytes):
    got = am.estimate(
        conv_relu_flatten_gemm(),
        mode=Mode.TRAIN,
        precision=Precision.FP32,
        optimizer=optimizer,
        device=DEVICE,
    )
    assert got.optimizer_state == state_bytes


def test_inference_ignores_the_optimizer():
    graph = conv_relu_flatten_gemm()
    adam = am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32, device=DEVICE)
    sgd = am.estimate(
        graph,
        mode=Mode.INFER,
        precision=Precision.FP32,
        optimizer=am.Optimizer.SGD,
        device=DEVICE,
    )
    assert adam == sgd


def test_fp16_halves_activations_keeps_fp32_weights_and_adds_autocast_weight_copies():
    graph = conv_relu_flatten_gemm()
    train = am.estimate(graph, mode=Mode.TRAIN, precision=Precision.FP16, device=DEVICE)
    infer = am.estimate(graph, mode=Mode.INFER, precision=Precision.BF16, device=DEVICE)
    assert train.weights == infer.weights == 600
    # Inference holds one operator's weight cast at a time (the largest, Conv's 200 B).
    assert infer.weight_copies == 200
    assert infer.activations == 8000
    # A job feeds its batch in fp32; autocast casts it where a matmul reads it. Read as written,
    # the batch is at the job's precision.
    assert train.batch == infer.batch == 4000
    written = am.estimate(
        graph, mode=Mode.INFER, precision=Precision.BF16, device=DEVICE, rules=am.Rules.WRITTEN
    )
    assert written.batch == 2000
    # Training saves each matrix operator's cast for its weight gradient, freed by that
    # backward. The peak is Relu's backward, as in fp32: Gemm's fp32 weight gradient (200 B),
    # the four activation-sized tensors at half the bytes, and Conv's cast (200 B).
    assert train.weight_copies == 0
    assert train.activations == 200 + 4 * 4000 + 200 - 600


def test_a_skip_connection_keeps_its_source_alive_until_the_join():
    def graph(skip: bool) -> am.MemoryGraph:
        edges = [(0, 1), (1, 2), (2, 3)] + ([(0, 3)] if skip else [])
        return am.MemoryGraph(
            nodes=(
                am.OpNode("Conv", 100),
                am.OpNode("Relu", 100),
                am.OpNode("Conv", 100),
                am.OpNode("Add", 100),
            ),
            edges=tuple(edges),
        )

    def peak(skip: bool) -> int:
        got = am.estimate(graph(skip), mode=Mode.INFER, precision=Precision.FP32, device=DEVICE)
        return got.activations

    # Chain: at most two 400 B tensors alive. Residual: the first Conv's output is still alive
    # when the second Conv runs, so three.
    assert peak(skip=False) == 800
    assert peak(skip=True) == 1200


def test_every_graph_output_stays_alive_to_the_end():
    # Three independent heads reading only the graph input: no consumer ever frees them, so
    # all three outputs (400 + 40 + 200 B) are alive when the last one is produced.
    graph = am.MemoryGraph(
        nodes=(am.OpNode("MatMul", 100), am.OpNode("MatMul", 10), am.OpNode("MatMul", 50)),
        edges=(),
    )
    got = am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32, device=DEVICE)
    assert got.activations == 640


def test_training_retains_inputs_of_operators_that_save_them():
    def graph(second: am.OpNode) -> am.MemoryGraph:
        """Gemm (100) -> `second` (100) -> ReduceMean (1), so that the loss is small."""
        return am.MemoryGraph(
            nodes=(am.OpNode("Gemm", 100, weight_elements=10), second, am.OpNode("ReduceMean", 1)),
            edges=((0, 1), (1, 2)),
        )

    kwargs = {"mode": Mode.TRAIN, "precision": Precision.FP32, "device": DEVICE}
    # A Mul by a trained factor saves its input: Gemm's output is still alive at the Mul's
    # backward, with the gradients of both outputs and the factor's own (4 x 400 B).
    saved = am.estimate(graph(am.OpNode("Mul", 100, weight_elements=100)), **kwargs)
    assert saved.activations + saved.gradients == 4 * 400
    # An Add saves nothing: at most two 400 B tensors, in the forward pass or in backward.
    unsaved = am.estimate(graph(am.OpNode("Add", 100)), **kwargs)
    assert unsaved.activations + unsaved.gradients == 2 * 400


def maxpool_dropout() -> am.MemoryGraph:
    return am.MemoryGraph(
        nodes=(am.OpNode("MaxPool", 10), am.OpNode("Dropout", 10)), edges=((0, 1),)
    )


def test_maxpool_indices_and_dropout_masks_are_saved_for_training():
    got = am.estimate(maxpool_dropout(), mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE)
    # MaxPool's 40 B output, and Dropout's masked copy of it (40 B, the graph's output, alive
    # to the end); MaxPool saves its (graph) input. Extra: 10 int64 indices (80 B) and the fused
    # kernel's 10 mask bytes. Nothing has parameters, so backward computes no gradient.
    assert got.activations == 40 + 40 + 80 + 10


def test_unfused_dropout_keeps_a_noise_tensor_of_the_activation_dtype():
    cpu_like = dataclasses.replace(DEVICE, fused_dropout=False)

    def activations(precision: Precision) -> int:
        got = am.estimate(
            maxpool_dropout(),
            mode=Mode.TRAIN,
            precision=precision,
            device=cpu_like,
            rules=am.Rules.WRITTEN,
        )
        return got.activations

    assert activations(Precision.FP32) == 40 + 40 + 80 + 40
    assert activations(Precision.BF16) == 20 + 20 + 80 + 20


def test_dropout_is_its_input_at_inference():
    got = am.estimate(
        maxpool_dropout(),
        mode=Mode.INFER,
        precision=Precision.FP32,
        device=DEVICE,
        rules=am.Rules.RUNTIME,
    )
    assert got.activations == 40


def test_maxpool_holds_its_indices_while_it_runs_at_inference_read_eagerly():
    def infer(rules: am.Rules) -> int:
        got = am.estimate(
            maxpool_dropout(), mode=Mode.INFER, precision=Precision.FP32, device=DEVICE, rules=rules
        )
        return got.activations

    # CUDA's max_pool2d computes 10 int64 indices (80 B) beside its 40 B output, then drops them
    assert infer(am.Rules.EAGER) == 40 + 80
    assert infer(am.Rules.RUNTIME) == 40


def test_node_order_does_not_change_the_estimate():
    ordered = conv_relu_flatten_gemm()
    permutation = [2, 0, 3, 1]  # new position of old node i
    nodes = [None] * 4
    for old, new in enumerate(permutation):
        nodes[new] = ordered.nodes[old]
    shuffled = am.MemoryGraph(
        nodes=tuple(nodes),
        edges=tuple((permutation[s], permutation[d]) for s, d in reversed(ordered.edges)),
        input_elements=ordered.input_elements,
    )
    for mode in Mode:
        kwargs = {"mode": mode, "precision": Precision.FP32, "device": DEVICE}
        assert am.estimate(shuffled, **kwargs) == am.estimate(ordered, **kwargs)


def test_tensors_are_rounded_up_to_the_allocator_block():
    graph = am.MemoryGraph(nodes=(am.OpNode("MatMul", 1, weight_elements=1),), edges=())
    device = am.DeviceProfile("blocks", context_bytes=0, workspace_bytes=0, alignment_bytes=512)
    got = am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32, device=device)
    assert got.weights == 512
    assert got.activations == 512


def test_a_cycle_is_rejected():
    graph = am.MemoryGraph(nodes=(am.OpNode("Add", 1), am.OpNode("Add", 1)), edges=((0, 1), (1, 0)))
    with pytest.raises(am.MemoryEstimateError, match="cycle"):
        am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32)


@pytest.mark.parametrize(
    ("nodes", "edges", "message"),
    [
        ((), (), "at least one operator"),
        ((am.OpNode("Add", 1),), ((0, 1),), "outside"),
        ((am.OpNode("Add", 1),), ((0, 0),), "self-loop"),
    ],
)
def test_malformed_graphs_are_rejected(nodes, edges, message):
    with pytest.raises(am.MemoryEstimateError, match=message):
        am.MemoryGraph(nodes=nodes, edges=edges)


def test_negative_sizes_are_rejected():
    with pytest.raises(am.MemoryEstimateError, match="non-negative"):
        am.OpNode("Conv", output_elements=-1)
    with pytest.raises(am.MemoryEstimateError, match="negative"):
        am.DeviceProfile("bad", context_bytes=-1, workspace_bytes=0)


def test_unknown_operators_are_reported():
    graph = am.MemoryGraph(nodes=(am.OpNode("Conv", 1), am.OpNode("FancyOp", 1)), edges=((0, 1),))
    assert am.unknown_ops(graph) == frozenset({"FancyOp"})


def test_unknown_operators_are_assumed_to_save_their_inputs():
    def activations(op: str) -> int:
        graph = am.MemoryGraph(
            nodes=(am.OpNode("Gemm", 100, weight_elements=10), am.OpNode(op, 1)), edges=((0, 1),)
        )
        return am.estimate(
            graph, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE
        ).activations

    assert activations("FancyOp") == activations("MatMul") > activations("Add")


def test_calibration_sets_the_context_to_the_median_residual():
    est = [
        am.estimate(conv_relu_flatten_gemm(), mode=m, precision=Precision.FP32, device=DEVICE)
        for m in (Mode.INFER, Mode.TRAIN, Mode.TRAIN)
    ]
    # Without the context the estimates are 21100 and 38500; residuals 5000, 7000 and 6000.
    observed = [21100 + 5000, 38500 + 7000, 38500 + 6000]
    fitted = am.calibrate(est, observed, DEVICE)
    assert fitted.context_bytes == 6000
    assert fitted.workspace_bytes == DEVICE.workspace_bytes


def test_calibration_needs_matching_data():
    with pytest.raises(am.MemoryEstimateError, match="matching"):
        am.calibrate([], [], DEVICE)


def test_breakdown_dict_carries_every_term_and_the_total():
    got = am.estimate(
        conv_relu_flatten_gemm(), mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE
    )
    as_dict = got.as_dict()
    assert as_dict["total"] == got.total == sum(v for k, v in as_dict.items() if k != "total")


def test_every_catalogued_device_has_a_profile_with_its_own_name():
    for name, profile in am.DEVICE_PROFILES.items():
        assert profile.name == name


def conv_relu_flatten_gemm_onnx():
    """The same network as above as a real ONNX model: 3x8x8 input, 4-channel 3x3 conv."""

    def init(name, shape):
        return numpy_helper.from_array(np.zeros(shape, dtype=np.float32), name)

    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [init("w1", (4, 3, 3, 3)), init("b1", (4,)), init("w2", (10, 256)), init("b2", (10,))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_perfgraph_reads_as_the_operators_tensors_and_weights():
    graph = am.from_perfgraph(extract.from_onnx(conv_relu_flatten_gemm_onnx(), batch_size=2))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu", "Flatten", "Gemm"]
    assert [n.output_elements for n in graph.nodes] == [2 * 256, 2 * 256, 2 * 256, 2 * 10]
    assert [n.weight_elements for n in graph.nodes] == [4 * 27 + 4, 0, 0, 2560 + 10]
    assert graph.edges == ((0, 1), (1, 2), (2, 3))
    assert graph.input_elements == 2 * 3 * 64
    assert graph.shared_weight_elements == 0


def test_estimate_accepts_a_perfgraph_directly():
    perf = extract.from_onnx(conv_relu_flatten_gemm_onnx(), batch_size=2)
    kwargs = {"mode": Mode.TRAIN, "precision": Precision.FP32, "device": DEVICE}
    assert am.estimate(perf, **kwargs) == am.estimate(am.from_perfgraph(perf), **kwargs)


def test_a_perfgraph_of_another_schema_is_rejected():
    perf = extract.from_onnx(conv_relu_flatten_gemm_onnx(), batch_size=1)
    old = dataclasses.replace(perf, schema_version=perf.schema_version + 1)
    with pytest.raises(am.MemoryEstimateError, match="schema"):
        am.from_perfgraph(old)


def test_a_graph_survives_a_json_round_trip():
    graph = dataclasses.replace(conv_relu_flatten_gemm(), shared_weight_elements=50)
    assert am.MemoryGraph.from_dict(json.loads(json.dumps(graph.to_dict()))) == graph


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"nodes": [["Conv", "many", 0]], "edges": [], "input_elements": 0},
        {"nodes": [["Conv", 1, 0]], "edges": [[0]], "input_elements": 0},
    ],
)
def test_malformed_graph_data_is_rejected(data):
    with pytest.raises(am.MemoryEstimateError, match="not a memory graph"):
        am.MemoryGraph.from_dict(data)


def test_tied_weights_count_once():
    graph = dataclasses.replace(conv_relu_flatten_gemm(), shared_weight_elements=50)
    got = am.estimate(graph, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE)
    assert graph.parameters == 100
    assert got.weights == got.gradients == 400


def test_a_linear_split_into_matmul_and_bias_add_allocates_one_output():
    def graph(bias_weights: int) -> am.MemoryGraph:
        return am.MemoryGraph(
            nodes=(
                am.OpNode("MatMul", 100, weight_elements=10),
                am.OpNode("Add", 100, weight_elements=bias_weights),
            ),
            edges=((0, 1),),
        )

    def activations(bias_weights: int) -> int:
        got = am.estimate(
            graph(bias_weights), mode=Mode.INFER, precision=Precision.FP32, device=DEVICE
        )
        return got.activations

    # MatMul + bias Add is one addmm in PyTorch: 400 B. An Add of two activations is not.
    assert activations(bias_weights=1) == 400
    assert activations(bias_weights=0) == 800


def attention(scale_weights: int) -> am.MemoryGraph:
    """q, k, v (100 elements each) -> MatMul -> Mul(scale) -> Softmax -> MatMul(., v)."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("MatMul", 400),
            am.OpNode("Mul", 400, weight_elements=scale_weights),
            am.OpNode("Softmax", 400),
            am.OpNode("MatMul", 100),
        ),
        edges=((0, 3), (1, 3), (3, 4), (4, 5), (5, 6), (2, 6)),
    )


def transient(graph: am.MemoryGraph, mode: Mode = Mode.TRAIN) -> int:
    """Activations plus gradients: the estimate beyond weights, optimiser state and batch."""
    got = am.estimate(graph, mode=mode, precision=Precision.FP32, device=DEVICE)
    return got.activations + got.gradients


def test_attention_stores_its_scores_but_a_scalar_scale_saves_nothing():
    # Inference peak while scaling or normalising: v (400 B) and two score matrices (2 x 1600).
    assert transient(attention(1), Mode.INFER) == 3600
    # Training peaks at the softmax's backward: q, k and the probabilities saved (2400 B), the
    # gradients of v, of the probabilities and of the scaled scores (3600 B); the scalar
    # scale's backward needs no activation.
    assert transient(attention(1)) == 6000
    # A trained elementwise factor needs its input for its own gradient: the scores stay.
    assert transient(attention(2)) == 6000 + 1600


def gelu(order: str, erf: str = "Erf") -> am.MemoryGraph:
    """x (a Gemm, 100 elements) -> exact GELU in one of the exporters' three node orders ->
    ReduceMean to one element, so that the loss is small."""
    x = am.OpNode("Gemm", 100, weight_elements=10)
    scaled, erf_node = am.OpNode("Div", 100, weight_elements=1), am.OpNode(erf, 100)
    plus_one, times = am.OpNode("Add", 100, weight_elements=1), am.OpNode("Mul", 100)
    half = am.OpNode("Mul", 100, weight_elements=1)
    mean = am.OpNode("ReduceMean", 1)
    head = ((0, 1), (1, 2), (2, 3))
    if order == "(x * (1 + erf)) * 0.5":
        edges = (*head, (3, 4), (0, 4), (4, 5), (5, 6))
        nodes = (x, scaled, erf_node, plus_one, times, half, mean)
    elif order == "(x * 0.5) * (1 + erf)":
        edges = (*head, (0, 4), (4, 5), (3, 5), (5, 6))
        nodes = (x, scaled, erf_node, plus_one, half, times, mean)
    else:  # "x * ((1 + erf) * 0.5)", the dynamo exporter's
        edges = (*head, (3, 4), (4, 5), (0, 5), (5, 6))
        nodes = (x, scaled, erf_node, plus_one, half, times, mean)
    return am.MemoryGraph(nodes=nodes, edges=edges)


def fused_gelu() -> am.MemoryGraph:
    """x (a Gemm, 100 elements) -> one GELU operator -> ReduceMean."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("Gelu", 100),
            am.OpNode("ReduceMean", 1),
        ),
        edges=((0, 1), (1, 2)),
    )


@pytest.mark.parametrize(
    "order", ["(x * (1 + erf)) * 0.5", "(x * 0.5) * (1 + erf)", "x * ((1 + erf) * 0.5)"]
)
def test_decomposed_gelu_saves_only_its_input_for_training(order):
    fused = fused_gelu()
    # At GELU's backward: x saved, and the gradients of GELU's output and of x (3 x 400 B).
    assert transient(fused) == 3 * 400
    # The decomposition adds only the one-element constants' gradients (4 B each at most).
    assert 0 <= transient(gelu(order)) - transient(fused) <= 3 * 4
    assert transient(gelu(order, erf="Tanh")) > transient(fused) + 400


def tanh_gelu() -> am.MemoryGraph:
    """x (a Gemm, 100 elements) -> ``0.5 * x * (1 + tanh(c * (x + 0.044715 * x ** 3)))`` as the
    dynamo exporter writes it -> ReduceMean to one element."""
    nodes = (
        am.OpNode("Gemm", 100, weight_elements=10),  # 0: x
        am.OpNode("Pow", 100),  # 1: x ** 3
        am.OpNode("Mul", 100, weight_elements=1),  # 2: 0.044715 * x ** 3
        am.OpNode("Add", 100),  # 3: x + ...
        am.OpNode("Mul", 100, weight_elements=1),  # 4: sqrt(2 / pi) * (...)
        am.OpNode("Tanh", 100),  # 5
        am.OpNode("Add", 100, weight_elements=1),  # 6: 1 + tanh
        am.OpNode("Mul", 100, weight_elements=1),  # 7: 0.5 * (...)
        am.OpNode("Mul", 100),  # 8: x * (...)
        am.OpNode("ReduceMean", 1),
    )
    edges = ((0, 1), (1, 2), (0, 3), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (0, 8), (7, 8), (8, 9))
    return am.MemoryGraph(nodes=nodes, edges=edges)


def torchscript_tanh_gelu() -> am.MemoryGraph:
    """The same GELU as PyTorch's TorchScript exporter writes it: the cube as ``x * (x * x)``,
    the Pow's place taken by two Muls (nodes 1 and 10)."""
    graph = tanh_gelu()
    nodes = list(graph.nodes)
    nodes[1] = am.OpNode("Mul", 100)  # 1: x * (x * x)
    edges = [(s, d) for s, d in graph.edges if (s, d) != (0, 1)]
    return am.MemoryGraph(
        nodes=(*nodes, am.OpNode("Mul", 100)),  # 10: x * x
        edges=(*edges, (0, 10), (0, 10), (10, 1), (0, 1)),
    )


@pytest.mark.parametrize("graph", [tanh_gelu, torchscript_tanh_gelu])
def test_tanh_approximated_gelu_is_one_kernel_too(graph):
    fused = fused_gelu()
    assert 0 <= transient(graph()) - transient(fused) <= 4 * 4
    # The same nodes with the cube's output read elsewhere are no longer one kernel.
    spilled = tanh_gelu()
    spilled = dataclasses.replace(spilled, edges=(*spilled.edges, (1, 9)))
    assert transient(spilled) > transient(fused) + 400


def where_graph(op: str) -> am.MemoryGraph:
    """x (a Gemm, 100 elements) -> a mask of it (Equal) -> `op`(mask, x) -> ReduceMean."""
    nodes = (
        am.OpNode("Gemm", 100, weight_elements=10),
        am.OpNode("Equal", 100),
        am.OpNode(op, 100),
        am.OpNode("ReduceMean", 1),
    )
    return am.MemoryGraph(nodes=nodes, edges=((0, 1), (1, 2), (0, 2), (2, 3)))


def test_where_saves_its_mask_and_not_the_values_it_routes():
    # An unknown operator is assumed to save both inputs; Where keeps only the 400 B mask
    # (Equal's output carries no gradient), not x.
    assert transient(where_graph("Where")) + 400 == transient(where_graph("Unknown"))


def test_a_tied_weight_holds_two_partial_gradients_and_their_sum():
    def graph(shared: int) -> am.MemoryGraph:
        """An embedding (Gather) and an output projection reading the same 1000 weights."""
        return am.MemoryGraph(
            nodes=(
                am.OpNode("Gather", 10, weight_elements=1000),
                am.OpNode("MatMul", 10, weight_elements=1000),
            ),
            edges=((0, 1),),
            shared_weight_elements=shared,
        )

    kwargs = {"mode": Mode.TRAIN, "precision": Precision.FP32, "optimizer": am.Optimizer.SGD}
    tied = am.estimate(graph(1000), device=DEVICE, **kwargs)
    assert tied.gradients == 4000
    # When backward reaches the embedding: the projection's partial gradient, the embedding's
    # and their sum (3 x 4000 B), with the 40 B gradient of the embedding's output.
    assert tied.activations + tied.weights == 3 * 4000 + 40
    # Two weight matrices: one gradient each, both alive at the embedding's backward, no sum.
    separate = am.estimate(graph(0), device=DEVICE, **kwargs)
    assert separate.activations + separate.weights == 2 * 4000 + 40


def test_a_convolution_is_taken_to_carry_a_folded_batchnorm():
    def graph(op: str) -> am.MemoryGraph:
        """op (100, 10 weights) -> Relu -> ReduceMean (1)."""
        return am.MemoryGraph(
            nodes=(
                am.OpNode(op, 100, weight_elements=10),
                am.OpNode("Relu", 100),
                am.OpNode("ReduceMean", 1),
            ),
            edges=((0, 1), (1, 2)),
        )

    # Inference: the normalisation's input and output are alive together, as are its output
    # and Relu's; the peak is two tensors either way.
    assert transient(graph("Conv"), Mode.INFER) == transient(graph("Gemm"), Mode.INFER) == 800
    # Training: the normalisation saves its input, a tensor that the graph does not show.
    assert transient(graph("Conv")) == transient(graph("Gemm")) + 400


def test_a_convolution_normalised_in_the_graph_carries_no_folded_batchnorm():
    def graph(normalisation: str) -> am.MemoryGraph:
        """Conv (100, 10 weights) -> Concat with the graph input -> `normalisation` (200)
        -> ReduceMean (1): DenseNet's layer, whose BatchNorm reads a concatenation."""
        return am.MemoryGraph(
            nodes=(
                am.OpNode("Conv", 100, weight_elements=10),
                am.OpNode("Concat", 200),
                am.OpNode(normalisation, 200, weight_elements=4),
                am.OpNode("ReduceMean", 1),
            ),
            edges=((0, 1), (1, 2), (2, 3)),
            input_elements=100,
        )

    # The BatchNorm in the graph is the convolution's; a LayerNorm there is not, so the
    # convolution is still taken to carry a folded one, whose input backward keeps (400 B).
    assert transient(graph("LayerNormalization")) == transient(graph("BatchNormalization")) + 400


def test_backward_frees_saved_tensors_as_it_goes():
    # A chain of four Gemms (1000 elements out, 10 weights each) with Relus: every Relu output
    # is saved (by Relu and the next Gemm), 4 x 4000 B. Backward frees them from the end while
    # only the gradients of the current operator exist, so the peak is the saved total and two
    # gradients, not the saved total and every activation's gradient.
    nodes, edges = [], []
    for layer in range(4):
        nodes += [am.OpNode("Gemm", 1000, weight_elements=10), am.OpNode("Relu", 1000)]
        edges.append((2 * layer, 2 * layer + 1))
        if layer:
            edges.append((2 * layer - 1, 2 * layer))
    nodes.append(am.OpNode("ReduceMean", 1))
    edges.append((7, 8))
    chain = am.MemoryGraph(nodes=tuple(nodes), edges=tuple(edges))
    saved = 4 * 4000
    assert saved + 2 * 4000 <= transient(chain) <= saved + 2 * 4000 + 4 * 40


def test_the_optimiser_step_holds_every_gradient_and_its_temporaries():
    # Weights dwarf activations: the peak is the optimiser step.
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Gemm", 1, weight_elements=1000),
            am.OpNode("Gemm", 1, weight_elements=3000),
        ),
        edges=((0, 1),),
    )
    gpu = DEVICE
    cpu = dataclasses.replace(DEVICE, foreach_optimizer=False)

    def step(optimizer: am.Optimizer, device: am.DeviceProfile) -> int:
        got = am.estimate(
            graph, mode=Mode.TRAIN, precision=Precision.FP32, optimizer=optimizer, device=device
        )
        return got.activations + got.gradients

    gradients = 16000
    # Adam's foreach update takes sqrt(v) of every parameter at once; the per-tensor one a
    # square root and a quotient of the largest parameter (12000 B) at a time.
    assert step(am.Optimizer.ADAM, gpu) == gradients + 16000
    assert step(am.Optimizer.ADAM, cpu) == gradients + 2 * 12000
    # SGD updates in place: the peak is the end of backward, every gradient and the first
    # Gemm's 4 B output gradient.
    assert step(am.Optimizer.SGD_MOMENTUM, gpu) == step(am.Optimizer.SGD, cpu) == gradients + 4


def test_the_loss_holds_log_probabilities_and_their_gradient():
    # A language-model head: 10,000 logits. Cross-entropy saves its log-probabilities and, at
    # the start of backward, their gradient and the logits' gradient exist too; the weight
    # gradient comes after the log-probabilities are freed.
    head = am.MemoryGraph(nodes=(am.OpNode("Gemm", 10_000, weight_elements=10),), edges=())
    assert transient(head) == 3 * 40_000


def test_shapes_and_masks_get_no_gradient():
    # Shape -> Equal -> Where(mask, Gemm): the mask path has no gradient, the Gemm path has.
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("Shape", 1000),
            am.OpNode("Equal", 1000),
            am.OpNode("Where", 100),
            am.OpNode("ReduceMean", 1),
        ),
        edges=((1, 2), (2, 3), (0, 3), (3, 4)),
    )
    order = am.topological_order(graph)
    storages = am._storages(
        graph,
        order,
        Precision.FP32,
        1,
        training=True,
        attention_kernel=Attention.AUTO,
        rules=am.Rules.RUNTIME,
    )
    assert storages.differentiable == {0, 3, 4}


def test_several_modes_at_once_are_each_mode_alone():
    graph = conv_relu_flatten_gemm()
    kwargs = {"precision": Precision.BF16, "optimizer": am.Optimizer.SGD, "device": DEVICE}
    both = am.estimate_modes(graph, **kwargs)
    assert both == {mode: am.estimate(graph, mode=mode, **kwargs) for mode in Mode}


def indexed_assignment() -> am.MemoryGraph:
    """``scores[:, 1:] = scores[:, 1:] + bias`` as exported: MatMul (100) -> ScatterND (100)
    -> Softmax (100), the ScatterND's indices (400 int64 coordinates) a Concat of a Range's,
    its updates a Sigmoid (100) of the scores."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("MatMul", output_elements=100),
            am.OpNode("Range", output_elements=4),
            am.OpNode("Concat", output_elements=400),
            am.OpNode("Sigmoid", output_elements=100),
            am.OpNode("ScatterND", output_elements=100),
            am.OpNode("Softmax", output_elements=100),
        ),
        edges=((0, 3), (1, 2), (0, 4), (2, 4), (3, 4), (4, 5)),
        input_elements=10,
    )


def test_an_indexed_assignment_read_eagerly_writes_in_place_without_an_index_tensor():
    def infer(rules: am.Rules) -> int:
        got = am.estimate(
            indexed_assignment(),
            mode=Mode.INFER,
            precision=Precision.FP32,
            device=DEVICE,
            rules=rules,
        )
        return got.activations

    # Eagerly the assignment copies into the scores' view: the scores (400 B) stay alive into
    # the Softmax beside its output (400 B), and the Concat's coordinates are never made.
    assert infer(am.Rules.EAGER) == 400 + 400
    # As exported, ScatterND writes a new tensor while the scores, the 1600 B of coordinates and
    # the updates are alive.
    assert infer(am.Rules.RUNTIME) == 400 + 1600 + 400 + 400


def test_an_index_tensor_read_elsewhere_too_is_kept():
    graph = indexed_assignment()
    graph = dataclasses.replace(
        graph,
        nodes=(*graph.nodes, am.OpNode("ReduceSum", output_elements=1)),
        edges=(*graph.edges, (2, 6)),
    )
    got = am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32, device=DEVICE)
    assert got.activations == 400 + 1600 + 400


def matmul_norm_matmul() -> am.MemoryGraph:
    """MatMul (100, fp16 under autocast) -> LayerNormalization (100, fp32) -> MatMul (10)."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("MatMul", output_elements=100, weight_elements=10),
            am.OpNode("LayerNormalization", output_elements=100, weight_elements=20),
            am.OpNode("MatMul", output_elements=10, weight_elements=10),
        ),
        edges=((0, 1), (1, 2)),
        input_elements=10,
    )


def test_read_with_upcasts_an_fp32_operator_reads_an_fp32_copy_of_a_half_precision_input():
    def infer(rules: am.Rules, precision: Precision = Precision.FP16) -> int:
        got = am.estimate(
            matmul_norm_matmul(), mode=Mode.INFER, precision=precision, device=DEVICE, rules=rules
        )
        return got.activations

    # While the LayerNorm runs: the MatMul's fp16 output (200 B), autocast's fp32 copy of it
    # (400 B) and the LayerNorm's fp32 output (400 B).
    assert infer(am.Rules.UPCAST) == 200 + 400 + 400
    # Read eagerly, the copy is not there; the peak is the LayerNorm's output with the second
    # MatMul's fp16 copy of it and its output.
    assert infer(am.Rules.EAGER) == 400 + 200 + 20
    # Without autocast nothing is cast.
    assert infer(am.Rules.UPCAST, Precision.FP32) == infer(am.Rules.EAGER, Precision.FP32)


def test_read_with_upcasts_training_saves_the_fp32_copy_in_place_of_the_input():
    def storages(rules: am.Rules) -> am._Storages:
        graph = matmul_norm_matmul()
        return am._storages(
            graph,
            am.topological_order(graph),
            Precision.FP16,
            1,
            training=True,
            attention_kernel=Attention.AUTO,
            rules=rules,
        )

    def saved(rules: am.Rules) -> int:
        found = storages(rules)
        return sum(found.nbytes[own] for own in found.released)

    # The LayerNorm saves its input: the 400 B fp32 copy read with upcasts, the 200 B fp16
    # MatMul output read eagerly; the second MatMul saves its 200 B fp16 copy of the norm.
    assert saved(am.Rules.UPCAST) == 400 + 200
    assert saved(am.Rules.EAGER) == 200 + 200
    # Each original's gradient comes from its cast's backward, after its reader's (the
    # LayerNorm in slot 2, the second MatMul in slot 4) has run: it ends a slot earlier.
    assert storages(am.Rules.UPCAST).gradient_end == {0: 1, 1: 3}
    assert storages(am.Rules.EAGER).gradient_end == {}


def test_a_product_with_a_table_computed_from_positions_saves_the_table_not_the_activation():
    # Range -> Mul(inverse frequencies) -> Cos: a rotary table, its constant an initializer the
    # graph cannot tell from a weight. x * cos needs x's gradient only, which reads cos: eager
    # PyTorch saves cos (16 elements), not x (400); read as run, both were counted.
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Range", 16),
            am.OpNode("Mul", 16, weight_elements=8),
            am.OpNode("Cos", 16),
            am.OpNode("Gemm", 400, weight_elements=100),
            am.OpNode("Mul", 400),
            am.OpNode("Gemm", 10, weight_elements=40),
        ),
        edges=((0, 1), (1, 2), (3, 4), (2, 4), (4, 5)),
    )

    def activations(rules: am.Rules) -> int:
        terms = am.estimate(
            graph, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE, rules=rules
        )
        return terms.activations

    assert activations(am.Rules.RUNTIME) - activations(am.Rules.EAGER) == 400 * 4
    # an activation that is not computed from positions keeps its partner saved
    learned = am.MemoryGraph(
        nodes=(am.OpNode("Gemm", 400, weight_elements=100), *graph.nodes[3:]),
        edges=((1, 2), (0, 2), (2, 3)),
    )
    kept = [
        am.estimate(
            learned, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE, rules=rules
        ).activations
        for rules in (am.Rules.EAGER, am.Rules.RUNTIME)
    ]
    assert kept[0] == kept[1]
