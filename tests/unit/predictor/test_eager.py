"""What eager PyTorch keeps alive that a graph does not say, read as `Rules.EAGER` does."""

import dataclasses
from collections.abc import Callable

import onnx
import pytest
import torch
from torch import nn

from kubeseer import zoo
from kubeseer.measure import gpu_memory, replay_cuda
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import autocast, eager, extract, prior
from kubeseer.zoo import export

FP16 = Precision.FP16
DEVICE = am.DeviceProfile("test", context_bytes=0, workspace_bytes=0, alignment_bytes=1)


@pytest.mark.parametrize(
    ("name", "scope"),
    [
        ("/layer1/layer1.0/conv1/Conv", "layer1/layer1.0/conv1"),
        ("/blocks.0/Add_1", "blocks.0"),
        ("/Shape", ""),
        ("node_Conv_3", ""),  # the dynamo exporter's names carry no module path
        ("", ""),
    ],
)
def test_the_module_path_is_read_off_torchscript_node_names(name: str, scope: str) -> None:
    assert eager.scope_of(name) == scope


def test_a_module_called_twice_is_two_calls() -> None:
    # act runs after conv1 and again after conv2: two runs of the same path
    scopes = ["block/conv1", "block/act", "block/conv2", "block/act", ""]
    calls = eager.module_calls(scopes, range(5))
    act = sorted((sorted(c.members), c.last) for c in calls if c.scope == "block/act")
    assert act == [([1], 1), ([3], 3)]
    (block,) = [c for c in calls if c.scope == "block"]
    assert block.members == frozenset({0, 1, 2, 3}) and block.last == 3


def test_an_argument_is_held_until_the_latest_call_reading_it_returns() -> None:
    # 0 (outside) feeds mlp/fc1 (1); mlp runs 1..3; 4 reads 3 outside the module
    scopes = ["norm", "mlp/fc1", "mlp/act", "mlp/fc2", ""]
    producers = [[], [0], [1], [2], [3]]
    held = eager.held_until(eager.module_calls(scopes, range(5)), producers)
    assert held[0] == 3  # the MLP's argument lives until fc2 has run
    assert 3 not in held  # a module's own output is no argument of it


def test_scopes_survive_the_cache_and_an_unscoped_graph_writes_none() -> None:
    scoped = am.MemoryGraph(nodes=(am.OpNode("Relu", 4, scope="act"),), edges=())
    assert am.MemoryGraph.from_dict(scoped.to_dict()) == scoped
    unscoped = am.MemoryGraph(nodes=(am.OpNode("Relu", 4),), edges=())
    assert "scopes" not in unscoped.to_dict() and not unscoped.scoped
    assert am.MemoryGraph.from_dict(unscoped.to_dict()) == unscoped


def infer(graph: am.MemoryGraph, rules: am.Rules, precision: Precision = FP16) -> int:
    got = am.estimate(graph, mode=Mode.INFER, precision=precision, device=DEVICE, rules=rules)
    return got.activations


def test_a_blocks_normalised_input_stays_alive_while_its_mlp_runs() -> None:
    # norm -> mlp(fc1 -> fc2): the norm's output is the MLP call's argument
    graph = am.MemoryGraph(
        nodes=(
            am.OpNode("Relu", 100, scope="norm"),
            am.OpNode("Relu", 400, scope="mlp/fc1"),
            am.OpNode("Relu", 100, scope="mlp/fc2"),
        ),
        edges=((0, 1), (1, 2)),
    )
    runtime, eagerly = (
        infer(graph, am.Rules.RUNTIME, Precision.FP32),
        infer(graph, am.Rules.EAGER, Precision.FP32),
    )
    assert runtime == 4 * (400 + 100)  # fc2 reads fc1's output; the norm's is gone
    assert eagerly == 4 * (100 + 400 + 100)  # ... but the caller still holds it


def test_silu_is_one_kernel_read_eagerly() -> None:
    # Conv -> Sigmoid -> Mul(conv, sigmoid): PyTorch's SiLU stores no sigmoid
    graph = am.MemoryGraph(
        nodes=(am.OpNode("Relu", 100), am.OpNode("Sigmoid", 100), am.OpNode("Mul", 100)),
        edges=((0, 1), (0, 2), (1, 2)),
    )
    assert infer(graph, am.Rules.RUNTIME, Precision.FP32) == 4 * 300
    assert infer(graph, am.Rules.EAGER, Precision.FP32) == 4 * 200


def test_scalar_bounds_and_pad_amounts_do_not_widen_an_fp16_activation() -> None:
    # Conv (fp16) -> Clip with two scalar bounds; a shape tensor -> Pad of the Clip
    nodes = (
        am.OpNode("Conv", 100, weight_elements=9),
        am.OpNode("Clip", 100, weight_elements=2),
        am.OpNode("Shape", 8),
        am.OpNode("Pad", 120, weight_elements=1),
    )
    producers = [[], [0], [], [1, 2]]

    def widths(typed: bool) -> list[int]:
        return autocast.widths(
            nodes, range(4), producers, FP16, lambda n: None, typed_operands=typed
        )

    assert widths(typed=True)[1] == widths(typed=True)[3] == autocast.LOW_PRECISION_BYTES
    assert widths(typed=False)[1] == widths(typed=False)[3] == autocast.FP32_BYTES


WIDTH, SEQ, BATCH = 64, 32, 16


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = (
            nn.Linear(WIDTH, 4 * WIDTH),
            nn.GELU(),
            nn.Linear(4 * WIDTH, WIDTH),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        x = self.act(x)
        return self.fc2(x)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(WIDTH), _Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class _PreNormNet(nn.Module):
    """A pre-norm residual network the way timm writes one: embedding, blocks, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.Sequential(_Block(), _Block())
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


BatchMaker = Callable[[int, torch.device], tuple[tuple[torch.Tensor, ...], torch.Tensor]]


def _batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    target = torch.zeros(size, dtype=torch.long, device=device)
    return (torch.randn(size, SEQ, WIDTH, device=device),), target


def _exported(torchscript_onnx, network: type[nn.Module], example: torch.Tensor) -> am.MemoryGraph:
    """`network`'s memory graph as the estimate reads it: exported by TorchScript at `BATCH`."""
    model = torchscript_onnx(network(), example)
    return am.from_perfgraph(extract.from_onnx(model, batch_size=BATCH))


def _held(
    network: type[nn.Module],
    batch: BatchMaker,
    mode: str = "infer",
    optimizer: str = "none",
    precision: str = "fp16",
) -> int:
    """What `network`'s step holds run eagerly on the meta device, every allocation recorded:
    the live-tensor peak less the cuBLAS workspaces, which the estimate keeps apart (one per
    thread that runs cuBLAS: the forward's, and in training autograd's backward's)."""
    runtime = gpu_memory.RUNTIMES["torch2-cuda12"]
    parts = gpu_memory.StepParts(build=network, batch=batch, loss=lambda o, t: o.sum())
    job = gpu_memory.Job(mode, precision, optimizer, BATCH)  # type: ignore[arg-type]
    derived = gpu_memory.derive(parts, job, runtime)
    workspaces = 2 if mode == "train" else 1
    return derived.allocated_peak - workspaces * runtime.cublas_workspace_bytes


def _estimated(
    graph: am.MemoryGraph,
    rules: am.Rules,
    mode: Mode = Mode.INFER,
    optimizer: str = "none",
    precision: Precision = FP16,
) -> int:
    """The estimate's tensor bytes for `graph`, read by `rules`."""
    return prior.tensor_bytes(prior.breakdown(graph, mode, precision, optimizer, rules=rules))


def test_read_eagerly_the_estimate_is_what_eager_pytorch_holds(torchscript_onnx) -> None:
    graph = _exported(torchscript_onnx, _PreNormNet, torch.randn(BATCH, SEQ, WIDTH))
    assert graph.scoped
    held = _held(_PreNormNet, _batch)
    # measured when written: eager 0.1 % under, as run 21 % under, as written 26 % under
    assert _estimated(graph, am.Rules.EAGER) == pytest.approx(held, rel=0.01)
    assert _estimated(graph, am.Rules.RUNTIME) < 0.85 * held


def test_a_tensor_two_calls_read_is_held_until_their_caller_returns() -> None:
    # 0 stem; cell_a (1, 2) reads 0; cell_b (3, 4) reads 0 and 2; cell_c (5) reads 2 and 4;
    # head (6) reads 5. The stem's and cell_a's outputs were bound to names by the caller.
    scopes = ["stem", "cell_a/left", "cell_a", "cell_b/left", "cell_b", "cell_c", "head"]
    producers = [[], [0], [1], [0], [3, 2], [2, 4], [5]]
    consumers: list[list[int]] = [[] for _ in scopes]
    for node, sources in enumerate(producers):
        for source in sources:
            consumers[source].append(node)
    calls = eager.module_calls(scopes, range(7))
    assert eager.merged_reads(calls, producers, consumers) == {}
    assert eager.bound_to_names(calls, producers, consumers, 6, {}) == {0: 6, 2: 6}
    # x = self.block(x) three times: each output read by one call, none held
    chain = eager.bound_to_names(
        eager.module_calls(["a", "b", "c"], range(3)), [[], [0], [1]], [[1], [2], []], 2, {}
    )
    assert chain == {}


def test_a_merged_operator_read_from_another_call_counts_as_a_read_of_its_input() -> None:
    # the exporter merged cell_b's ReLU of the stem's output into cell_a's (node 1), which
    # cell_b's conv (3) reads: cell_b was given the stem's output, as cell_a was
    scopes = ["stem", "cell_a/act", "cell_a/conv", "cell_b/conv", "head"]
    producers = [[], [0], [1], [1], [2, 3]]
    consumers = [[1], [2, 3], [4], [4], []]
    calls = eager.module_calls(scopes, range(5))
    merged = eager.merged_reads(calls, producers, consumers)
    assert merged == {1: [3]}
    assert eager.bound_to_names(calls, producers, consumers, 4, merged) == {0: 4}
    # cell_b was given the stem's output, not cell_a's ReLU
    assert eager.held_until(calls, producers, merged)[0] == 3


class _Cell(nn.Module):
    """A NASNet cell: a branch on each of its two inputs, each starting with a ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.ReLU(), nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1))
        self.right = nn.Sequential(nn.ReLU(), nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1))

    def forward(self, x_left: torch.Tensor, x_right: torch.Tensor) -> torch.Tensor:
        return self.left(x_left) + self.right(x_right)


class _CellNet(nn.Module):
    """Cells that each read the outputs of the two before them, kept in names of their own as
    timm's PNASNet and NASNet write them."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.cell_0, self.cell_1, self.cell_2, self.cell_3 = (_Cell() for _ in range(4))
        self.head = nn.Linear(CHANNELS, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_stem = self.stem(x)
        x_cell_0 = self.cell_0(x_stem, x_stem)
        x_cell_1 = self.cell_1(x_stem, x_cell_0)
        x_cell_2 = self.cell_2(x_cell_0, x_cell_1)
        x_cell_3 = self.cell_3(x_cell_1, x_cell_2)
        return self.head(x_cell_3.mean((2, 3)))


CHANNELS, SIDE = 16, 32


def _images(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    target = torch.zeros(size, dtype=torch.long, device=device)
    return (torch.randn(size, 3, SIDE, SIDE, device=device),), target


def _held_and_estimated(torchscript_onnx, network: type[nn.Module]) -> tuple[int, int, int]:
    """What `network`'s fp16 inference on images holds run eagerly on the meta device, and its
    estimate read eagerly and read as run."""
    graph = _exported(torchscript_onnx, network, torch.randn(BATCH, 3, SIDE, SIDE))
    held = _held(network, _images)
    return held, _estimated(graph, am.Rules.EAGER), _estimated(graph, am.Rules.RUNTIME)


def test_cells_kept_in_names_are_what_eager_pytorch_holds(torchscript_onnx) -> None:
    held, estimate, as_run = _held_and_estimated(torchscript_onnx, _CellNet)
    assert estimate == pytest.approx(held, rel=0.05)
    # read as run (no frames), the stem's and the cells' outputs go after their last reader
    assert as_run < 0.8 * held


def _without_metadata(model: bytes) -> bytes:
    """`model` as a file whose node metadata was stripped: a dynamo export read by names."""
    proto = onnx.load_from_string(model)
    for node in proto.graph.node:
        node.ClearField("metadata_props")
    return proto.SerializeToString()


@pytest.mark.parametrize(
    ("network", "shape"), [(_PreNormNet, (BATCH, SEQ, WIDTH)), (_CellNet, (BATCH, 3, SIDE, SIDE))]
)
def test_a_dynamo_export_is_read_as_eagerly_as_a_torchscript_one(
    torchscript_onnx, dynamo_onnx, network: type[nn.Module], shape: tuple[int, ...]
) -> None:
    example = torch.randn(*shape)
    torchscript = _exported(torchscript_onnx, network, example)
    dynamo_file = dynamo_onnx(network(), example)
    dynamo = am.from_perfgraph(extract.from_onnx(dynamo_file, batch_size=BATCH))
    assert dynamo.scoped
    as_torchscript = _estimated(torchscript, am.Rules.EAGER)
    assert _estimated(dynamo, am.Rules.EAGER) == pytest.approx(as_torchscript, rel=0.02)
    # read by names alone, the dynamo export had no module calls: what was served before
    # (measured when written: 0.85 and 0.60 of the TorchScript export's; with paths 0.998, 1.0)
    stripped = _without_metadata(dynamo_file)
    by_names = am.from_perfgraph(extract.from_onnx(stripped, batch_size=BATCH))
    assert not by_names.scoped
    assert _estimated(by_names, am.Rules.EAGER) < 0.9 * as_torchscript


class _Concatenating(nn.Module):
    """SelecSLS's block and GhostNet's module at once: each convolution's output is bound to a
    name and read by the next convolution and by the concatenation, whose first channels are
    returned as a slice (a view that keeps the whole concatenation)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2, self.conv3 = (
            nn.Sequential(nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.ReLU()) for _ in range(3)
        )
        self.conv_out = nn.Conv2d(3 * CHANNELS, 2 * CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.conv1(x)
        d2 = self.conv2(d1)
        d3 = self.conv3(d2)
        return self.conv_out(torch.cat([d1, d2, d3], 1))[:, :CHANNELS]


class _ConcatNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.blocks = nn.Sequential(_Concatenating(), _Concatenating())
        self.head = nn.Linear(CHANNELS, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def test_names_in_a_modules_frame_and_slices_are_what_eager_pytorch_holds(
    torchscript_onnx,
) -> None:
    held, estimate, as_run = _held_and_estimated(torchscript_onnx, _ConcatNet)
    # measured when written: 8.5 % under. `d3` is bound to a name too, but read once, which a
    # graph cannot tell from a temporary; read as run (no frames, the slice a copy) 44 % under.
    assert 0.88 * held < estimate < held
    assert as_run < 0.8 * held


def test_a_convolution_given_to_a_norm_act_call_is_held_until_it_returns() -> None:
    # conv (0) -> norm/act (1); conv (2) -> act (3), a module of its own after a folded bn
    scopes = ["conv1", "norm1/act", "conv2", "act2", "head"]
    consumers = [[1], [2], [3], [4], []]
    calls = eager.module_calls(scopes, range(5))
    found = eager.normalised_and_activated(calls, consumers, [0, 2])
    assert list(found) == [0]
    assert found[0].call.scope == "norm1" and found[0].activation.members == {1}


class _BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: the BatchNorm, then its activation as a child module."""

    def __init__(self, channels: int, act: nn.Module) -> None:
        super().__init__(channels)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(x))


class _ConvNormAct(nn.Module):
    def __init__(self, channels_in: int, act: nn.Module) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels_in, CHANNELS, 3, padding=1, bias=False)
        self.bn = _BatchNormAct(CHANNELS, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def _norm_act_net(act: type[nn.Module], **options: bool) -> type[nn.Module]:
    class _NormActNet(nn.Module):
        """timm's ConvNormAct layers, the way CoAtNet's (GELU) and EfficientNet's (SiLU applied
        in place) stems and blocks are built."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(
                _ConvNormAct(3, act(**options)),
                *(_ConvNormAct(CHANNELS, act(**options)) for _ in range(3)),
            )
            self.head = nn.Linear(CHANNELS, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.layers(x).mean((2, 3)))

    return _NormActNet


@pytest.mark.parametrize(
    ("act", "options"), [(nn.GELU, {}), (nn.SiLU, {"inplace": True}), (nn.ReLU, {"inplace": True})]
)
def test_norm_act_layers_are_what_eager_pytorch_holds(
    torchscript_onnx, act: type[nn.Module], options: dict[str, bool]
) -> None:
    held, estimate, _ = _held_and_estimated(torchscript_onnx, _norm_act_net(act, **options))
    # measured when written: GELU 0.1 % under (22 % under without the hold), SiLU and ReLU in
    # place 0.5 % under (28 % over with the hold but without the in-place activation)
    assert estimate == pytest.approx(held, rel=0.05)


def test_a_dynamo_export_reads_a_convolution_it_fused_a_batchnorm_into_in_its_own_module(
    torchscript_onnx, dynamo_onnx
) -> None:
    # the rewriter leaves the fused convolution the BatchNorm's path; read so, it ran inside
    # the norm-act module and its output was not held through the GELU (measured when written:
    # 0.77 of the TorchScript export's estimate; read from its weight's name, 0.996)
    network = _norm_act_net(nn.GELU)
    example = torch.randn(BATCH, 3, SIDE, SIDE)
    dynamo = am.from_perfgraph(extract.from_onnx(dynamo_onnx(network(), example), batch_size=BATCH))
    convolutions = [op for op in dynamo.nodes if op.op_type == "Conv"]
    assert [op.scope for op in convolutions] == [
        f"layers/layers.{i}/layers.{i}.conv" for i in range(4)
    ]
    torchscript = _exported(torchscript_onnx, network, example)
    assert _estimated(dynamo, am.Rules.EAGER) == pytest.approx(
        _estimated(torchscript, am.Rules.EAGER), rel=0.02
    )


class _NormAfterActivation(nn.Module):
    """A gMLP-style LayerNorm over a GELU's output: under fp16 autocast it reads fp16."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(4 * WIDTH)
        self.fc2 = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.act(self.fc1(x))))


def test_read_with_upcasts_a_norms_fp32_copy_is_what_eager_pytorch_holds(
    torchscript_onnx,
) -> None:
    graph = _exported(torchscript_onnx, _NormAfterActivation, torch.randn(BATCH, SEQ, WIDTH))
    held = _held(_NormAfterActivation, _batch)
    # measured when written: with upcasts 0.2 % under, read eagerly 27 % under
    assert _estimated(graph, am.Rules.UPCAST) == pytest.approx(held, rel=0.02)
    assert _estimated(graph, am.Rules.EAGER) < 0.8 * held
    # training: with upcasts 1.5 % under, read eagerly 8.5 % under
    held = _held(_NormAfterActivation, _batch, "train", "sgd")
    upcast = _estimated(graph, am.Rules.UPCAST, Mode.TRAIN, "sgd")
    assert upcast == pytest.approx(held, rel=0.03)
    assert _estimated(graph, am.Rules.EAGER, Mode.TRAIN, "sgd") < 0.93 * held


_LLAMA = zoo.ModelSpec(
    "llama",
    {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 176, "max_positions": 128,
     "tie_embeddings": False},
    {"seq_len": 128, "vocab_size": 64},
)  # fmt: skip


@pytest.fixture(scope="module")
def llama_graph(tmp_path_factory: pytest.TempPathFactory) -> am.MemoryGraph:
    """`_LLAMA` exported by the zoo (dynamo, module paths in metadata) at batch 8."""
    path = tmp_path_factory.mktemp("llama") / "llama.onnx"
    export.export_onnx(_LLAMA, path, with_weights=False)
    return am.from_perfgraph(extract.from_onnx(path, batch_size=8, inputs={"seq": 128}))


def _llama_held(job: gpu_memory.Job) -> int:
    runtime = gpu_memory.RUNTIMES["torch2-cuda12"]
    derived = gpu_memory.derive(replay_cuda.parts_of(_LLAMA), job, runtime)
    workspaces = 2 if job.mode == "train" else 1
    return derived.allocated_peak - workspaces * runtime.cublas_workspace_bytes


def test_a_llamas_training_step_is_what_eager_pytorch_holds(llama_graph) -> None:
    # rotary positions: q * cos and rotate_half(q) * sin save the tables, not the queries
    held = _llama_held(gpu_memory.Job("train", "fp32", "sgd", 8))
    # measured when written at batch 8: read eagerly within 0.1 %, read as run 22 % over
    # (batch 4-32: 5.0 % under to 2.0 % over, and 17-23 % over; before a product saved only
    # what autograd saves, read eagerly was 6.7-12.8 % over)
    eagerly = _estimated(llama_graph, am.Rules.EAGER, Mode.TRAIN, "sgd", Precision.FP32)
    assert eagerly == pytest.approx(held, rel=0.03)
    as_run = _estimated(llama_graph, am.Rules.RUNTIME, Mode.TRAIN, "sgd", Precision.FP32)
    assert as_run > 1.15 * held


def test_an_operator_the_exporter_wrote_no_path_for_stays_in_its_module(llama_graph) -> None:
    # dynamo rewrites rotate_half's two slices into one Split without metadata; read as the
    # top-level forward, it ended each layer's call and every layer's input was held to the end
    splits = [op for op in llama_graph.nodes if op.op_type == "Split"]
    assert splits and all(op.scope.endswith("self_attn") for op in splits)
    held = _llama_held(gpu_memory.Job("infer", "fp16", "none", 8))
    # measured when written: 0.6 % over; with the Splits at the top level 61 % over, and before
    # SiLU's two reads of the gate were read as one kernel's, 15 % over
    assert _estimated(llama_graph, am.Rules.EAGER) == pytest.approx(held, rel=0.03)
    unplaced = dataclasses.replace(
        llama_graph,
        nodes=[dataclasses.replace(op, scope="" if op.op_type == "Split" else op.scope)
               for op in llama_graph.nodes],
    )  # fmt: skip
    assert _estimated(unplaced, am.Rules.EAGER) > 1.2 * held


ATTENTION_SEQ = 256


class _MaskedAttention(nn.Module):
    """Causal attention written out as timm and GPT-2 write it, each step rebinding one name."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (3, 2, -1)).permute(2, 0, 3, 1, 4).unbind(0)
        attn = q @ k.transpose(-2, -1) * 0.125
        seq = x.shape[1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        attn = attn.masked_fill(causal, float("-inf"))
        attn = attn.softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).flatten(2))


def _sequences(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    target = torch.zeros(size, dtype=torch.long, device=device)
    return (torch.randn(size, ATTENTION_SEQ, WIDTH, device=device),), target


@pytest.mark.parametrize("precision", [Precision.FP16, Precision.BF16])
def test_masked_scores_keep_their_width_and_a_bf16_softmax_reads_an_fp32_copy(
    torchscript_onnx, precision: Precision
) -> None:
    graph = _exported(torchscript_onnx, _MaskedAttention, torch.randn(BATCH, ATTENTION_SEQ, WIDTH))
    held = _held(_MaskedAttention, _sequences, precision=precision.value)
    # measured when written: fp16 3.6 % under (the values' contiguous copy the matmul makes is
    # not in the graph), bf16 0.3 % under; before, with the Where read as fp32 (its boolean
    # condition taken for data) and no copy, fp16 19 % over and bf16 18 % under
    estimate = _estimated(graph, am.Rules.EAGER, precision=precision)
    assert estimate == pytest.approx(held, rel=0.05)
