"""Tensor widths under CUDA autocast, and the copies autocast makes of fp32 activations."""

from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import autocast

FP16 = Precision.FP16
DEVICE = am.DeviceProfile("test", context_bytes=0, workspace_bytes=0, alignment_bytes=1)


def chain(*nodes: am.OpNode) -> am.MemoryGraph:
    """`nodes` one after another."""
    return am.MemoryGraph(nodes=nodes, edges=tuple((i, i + 1) for i in range(len(nodes) - 1)))


def widths(graph: am.MemoryGraph, precision: Precision = FP16) -> list[int]:
    producers: list[list[int]] = [[] for _ in graph.nodes]
    for src, dst in graph.edges:
        producers[dst].append(src)
    views = {
        node: producers[node][0]
        for node, op in enumerate(graph.nodes)
        if op.op_type in am.VIEW_OPS and producers[node]
    }
    order = am.topological_order(graph)
    return autocast.widths(graph.nodes, order, producers, precision, views.get)


def test_a_transformer_block_keeps_its_residual_stream_in_fp32() -> None:
    # class-token Concat (an fp32 parameter) -> LayerNorm -> Linear -> Add back to the stream
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Conv", 100, weight_elements=50),  # patch embedding: fp16
            am.OpNode("Concat", 110, weight_elements=10),  # with the fp32 class token
            am.OpNode("LayerNormalization", 110, weight_elements=20),
            am.OpNode("MatMul", 110, weight_elements=400),
            am.OpNode("Add", 110),  # fp32 stream + fp16 branch
            am.OpNode("Reshape", 110),
        ),
        edges=((0, 1), (1, 2), (2, 3), (3, 4), (1, 4), (4, 5)),
    )
    assert widths(graph) == [2, 4, 4, 2, 4, 4]


def test_a_cnn_stays_in_half_precision() -> None:
    graph = chain(
        am.OpNode("Conv", 100, weight_elements=50),
        am.OpNode("BatchNormalization", 100, weight_elements=20),  # keeps its input's width
        am.OpNode("Relu", 100),
        am.OpNode("Mul", 100, weight_elements=1),  # a scalar does not promote
        am.OpNode("MaxPool", 25),
    )
    assert widths(graph) == [2, 2, 2, 2, 2]
    assert widths(graph, Precision.FP32) == [4] * 5


def test_a_layer_scale_gamma_promotes_and_softmax_returns_fp32() -> None:
    graph = chain(
        am.OpNode("Conv", 100, weight_elements=50),
        am.OpNode("Mul", 100, weight_elements=100),  # ConvNeXt's gamma, an fp32 parameter
        am.OpNode("Conv", 100, weight_elements=50),
        am.OpNode("Softmax", 100),
    )
    assert widths(graph) == [2, 4, 2, 4]


def test_each_matmul_reading_an_fp32_activation_holds_its_own_half_precision_copy() -> None:
    # LayerNorm (fp32, 400 B) read by three projections (q, k, v; 200 B each, graph outputs).
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("LayerNormalization", 100, weight_elements=20),
            am.OpNode("MatMul", 100, weight_elements=10),
            am.OpNode("MatMul", 100, weight_elements=10),
            am.OpNode("MatMul", 100, weight_elements=10),
        ),
        edges=((0, 1), (0, 2), (0, 3)),
    )

    def infer(rules: am.Rules) -> int:
        return am.estimate(
            graph, mode=Mode.INFER, precision=FP16, device=DEVICE, rules=rules
        ).activations

    # At the third projection: LayerNorm 400 + two outputs 400 + its cast 200 + its output 200.
    assert infer(am.Rules.RUNTIME) == 400 + 400 + 200 + 200
    # Read as written nothing is cast.
    assert infer(am.Rules.WRITTEN) == 400 + 600


def test_training_saves_the_half_precision_copy_not_the_fp32_original() -> None:
    graph = chain(
        am.OpNode("LayerNormalization", 1000, weight_elements=20),
        am.OpNode("MatMul", 1000, weight_elements=10),
        am.OpNode("Relu", 1000),
    )
    order = am.topological_order(graph)

    def storages(rules: am.Rules) -> am._Storages:
        return am._storages(
            graph, order, FP16, 1, training=True, attention_kernel=Attention.AUTO, rules=rules
        )

    runtime = storages(am.Rules.RUNTIME)
    [cast] = [key for key in runtime.nbytes if key >= len(graph.nodes)]
    assert runtime.nbytes[cast] == 2000 and runtime.nbytes[0] == 4000
    # The MatMul saves its cast for backward; the fp32 LayerNorm output is freed in forward.
    assert cast in runtime.released and 0 not in runtime.released
    assert cast in runtime.differentiable
    written = storages(am.Rules.WRITTEN)
    assert 0 in written.released and len(written.nbytes) == len(graph.nodes)


def test_a_constant_expand_is_a_view_of_its_parameter() -> None:
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Expand", 1000, weight_elements=10),  # a class token expanded per sample
            am.OpNode("Conv", 1000, weight_elements=10),
            am.OpNode("Concat", 2000),
        ),
        edges=((0, 2), (1, 2)),
    )
    written = am.estimate(
        graph, mode=Mode.INFER, precision=FP16, device=DEVICE, rules=am.Rules.WRITTEN
    )
    runtime = am.estimate(
        graph,
        mode=Mode.INFER,
        precision=FP16,
        device=DEVICE,
        attention_kernel=Attention.AUTO,
        rules=am.Rules.RUNTIME,
    )
    # as written the Expand is a 2,000 B tensor; run, a view: Conv 2,000 + Concat (fp32) 8,000
    assert written.activations == 2000 + 2000 + 4000
    assert runtime.activations == 2000 + 8000


def test_read_as_written_the_autocast_lists_are_those_checkpoints_learned_against() -> None:
    # Resize (upsampling) and Einsum joined the runtime's lists after `written` checkpoints
    # were trained; as written, Resize stays at the job's precision and Einsum casts no weight.
    graph = chain(
        am.OpNode("Conv", 100, weight_elements=50),
        am.OpNode("Resize", 400),
        am.OpNode("Einsum", 400, weight_elements=30),
    )

    def infer(rules: am.Rules) -> am.MemoryBreakdown:
        return am.estimate(graph, mode=Mode.INFER, precision=FP16, device=DEVICE, rules=rules)

    written, runtime = infer(am.Rules.WRITTEN), infer(am.Rules.RUNTIME)
    assert written.weight_copies == 100  # the Conv's weights only
    assert runtime.weight_copies == 100  # one cast at a time: the largest, still the Conv's
    # at the Einsum: Resize's output and its own, 2 bytes each as written
    assert written.activations == 400 * 2 + 400 * 2
    # as run the Resize returns fp32, which the Einsum casts to a copy before reading
    assert runtime.activations == 400 * 4 + 400 * 2 + 400 * 2
