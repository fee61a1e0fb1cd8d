import dataclasses
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import extract
from kubeseer.predictor.baselines import analytic_memory as am

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
    # Peak live: while Relu runs, Conv's 8000 B and Relu's 8000 B; plus the 4000 B input.
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


def test_training_with_adam_keeps_gradients_two_states_and_saved_activations():
    got = am.estimate(
        conv_relu_flatten_gemm(),
        mode=Mode.TRAIN,
        precision=Precision.FP32,
        optimizer=am.Optimizer.ADAM,
        device=DEVICE,
    )
    # Saved for backward: Relu's output (Relu saves it, Gemm saves it through the view);
    # Conv's output is read only by Relu, which does not save its input, so it is freed.
    # Activations = max(forward peak 16000, saved 8000 + 2 x largest 8000); the batch 4000.
    assert got.weights == 600
    assert got.gradients == 600
    assert got.optimizer_state == 1200
    assert got.activations == 24000
    assert got.batch == 4000
    assert got.total == 600 + 600 + 1200 + 28000 + 500 + 1000


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
    # Training caches every matmul weight cast for backward (2 B x (100 + 50)); inference holds
    # one operator's cast at a time (the largest, Conv's 200 B).
    assert train.weight_copies == 300
    assert infer.weight_copies == 200
    assert train.batch == infer.batch == 2000
    assert train.activations == 4000 + 2 * 4000
    assert infer.activations == 8000


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
        nodes=(am.OpNode("Conv", 100), am.OpNode("Conv", 10), am.OpNode("Conv", 50)),
        edges=(),
    )
    got = am.estimate(graph, mode=Mode.INFER, precision=Precision.FP32, device=DEVICE)
    assert got.activations == 640


def test_training_retains_inputs_of_operators_that_save_them():
    # Conv -> Mul by a trained factor: Mul saves its input, so Conv's output survives.
    saved = am.MemoryGraph(
        nodes=(am.OpNode("Conv", 100), am.OpNode("Mul", 100, weight_elements=100)),
        edges=((0, 1),),
    )
    # Conv -> Add: Add saves nothing; only the largest-tensor gradient headroom remains.
    unsaved = am.MemoryGraph(nodes=(am.OpNode("Conv", 100), am.OpNode("Add", 100)), edges=((0, 1),))
    kwargs = {"mode": Mode.TRAIN, "precision": Precision.FP32, "device": DEVICE}
    assert am.estimate(saved, **kwargs).activations == 400 + 2 * 400
    assert am.estimate(unsaved, **kwargs).activations == 2 * 400


def test_maxpool_indices_and_dropout_masks_are_saved_for_training():
    graph = am.MemoryGraph(
        nodes=(am.OpNode("MaxPool", 10), am.OpNode("Dropout", 10)), edges=((0, 1),)
    )
    got = am.estimate(graph, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE)
    # Dropout is a view of MaxPool's 40 B output and saves nothing itself; MaxPool saves its
    # (graph) input. Extra: 10 int64 indices (80 B) and 10 mask bytes.
    assert got.activations == 80 + 10 + 2 * 40


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
    graph = am.MemoryGraph(nodes=(am.OpNode("Conv", 1, weight_elements=1),), edges=())
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
        graph = am.MemoryGraph(nodes=(am.OpNode("Conv", 100), am.OpNode(op, 1)), edges=((0, 1),))
        return am.estimate(
            graph, mode=Mode.TRAIN, precision=Precision.FP32, device=DEVICE
        ).activations

    assert activations("FancyOp") == activations("MatMul") > activations("Add")


def test_calibration_sets_the_context_to_the_median_residual():
    est = [
        am.estimate(conv_relu_flatten_gemm(), mode=m, precision=Precision.FP32, device=DEVICE)
        for m in (Mode.INFER, Mode.TRAIN, Mode.TRAIN)
    ]
    # Without the context the estimates are 21100 and 30900; residuals 5000, 7000 and 6000.
    observed = [21100 + 5000, 30900 + 7000, 30900 + 6000]
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


def test_attention_stores_its_scores_but_a_scalar_scale_saves_nothing():
    kwargs = {"precision": Precision.FP32, "device": DEVICE}
    # Inference peak while scaling or normalising: v (400 B) and two score matrices (2 x 1600).
    assert am.estimate(attention(1), mode=Mode.INFER, **kwargs).activations == 3600
    # Training saves q and k (800), the probabilities (1600) and v (400), plus two gradients
    # of the largest stored tensor (2 x 1600); the scalar scale's backward needs no activation.
    assert am.estimate(attention(1), mode=Mode.TRAIN, **kwargs).activations == 6000
    # A trained elementwise factor needs its input for its own gradient: the scores stay.
    assert am.estimate(attention(400), mode=Mode.TRAIN, **kwargs).activations == 7600


def gelu(erf: str) -> am.MemoryGraph:
    """x -> Div(sqrt 2) -> erf -> Add(1) -> Mul(x, .) -> Mul(0.5), 100 elements throughout."""
    return am.MemoryGraph(
        nodes=(
            am.OpNode("Gemm", 100, weight_elements=10),
            am.OpNode("Div", 100, weight_elements=1),
            am.OpNode(erf, 100),
            am.OpNode("Add", 100, weight_elements=1),
            am.OpNode("Mul", 100),
            am.OpNode("Mul", 100, weight_elements=1),
        ),
        edges=((0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (4, 5)),
    )


def test_decomposed_gelu_saves_only_its_input_for_training():
    kwargs = {"mode": Mode.TRAIN, "precision": Precision.FP32, "device": DEVICE}
    # Saved: x (400 B); plus two gradients of the largest stored tensor (2 x 400 B).
    assert am.estimate(gelu("Erf"), **kwargs).activations == 1200
    assert am.estimate(gelu("Tanh"), **kwargs).activations > 1200
