"""Attention as the GPU runs it: the SDPA export is recognised, its matrices are not counted."""

import dataclasses
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional

from kubeseer.measure import gpu_memory
from kubeseer.prediction import Attention, Mode, Precision
from kubeseer.predictor import analytic_memory as am
from kubeseer.predictor import api, attention, checkpoint, extract, prior

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 256, 16
WIDTH = HEADS * HEAD_DIM
SCORES = BATCH * HEADS * SEQ * SEQ  # elements of one (batch, heads, S, S) matrix


class SelfAttention(nn.Module):
    """One multi-head self-attention, through SDPA (as timm and Hugging Face call it) or
    written by hand (``q @ k.transpose``, softmax, ``@ v``)."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused:
            out = functional.scaled_dot_product_attention(q, k, v)
        else:
            out = ((q * HEAD_DIM**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, WIDTH))


@pytest.fixture(scope="module")
def sdpa(torchscript_onnx) -> bytes:
    return torchscript_onnx(SelfAttention(fused=True), torch.randn(BATCH, SEQ, WIDTH))


@pytest.fixture(scope="module")
def by_hand(torchscript_onnx) -> bytes:
    return torchscript_onnx(SelfAttention(fused=False), torch.randn(BATCH, SEQ, WIDTH))


class WindowedAttention(nn.Module):
    """SDPA over (batch, heads, windows, S, head_dim): NesT's and Hiera's five-dimensional call,
    which PyTorch's fused kernels refuse, so it runs the math path."""

    WINDOWS = 2

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        w = self.WINDOWS
        qkv = self.qkv(x).reshape(b, w, s // w, 3, HEADS, HEAD_DIM).permute(3, 0, 4, 1, 2, 5)
        q, k, v = qkv.unbind(0)
        out = functional.scaled_dot_product_attention(q, k, v)
        return out.permute(0, 2, 3, 1, 4).reshape(b, s, WIDTH)


@pytest.fixture(scope="module")
def five_dimensional(torchscript_onnx) -> bytes:
    return torchscript_onnx(WindowedAttention(), torch.randn(BATCH, SEQ, WIDTH))


def memory_graph(model: bytes) -> am.MemoryGraph:
    return am.from_perfgraph(extract.from_onnx(model, batch_size=BATCH))


def blocks(graph: am.MemoryGraph) -> list[attention.AttentionBlock]:
    return am.attention_blocks(graph)


def test_the_sdpa_export_is_told_from_attention_written_by_hand(
    sdpa: bytes, by_hand: bytes
) -> None:
    [fused] = blocks(memory_graph(sdpa))
    [written] = blocks(memory_graph(by_hand))
    assert fused.sdpa and not written.sdpa
    # SDPA's operand scales and the key's transpose never exist on the GPU either.
    ops = memory_graph(sdpa).nodes
    assert sorted(ops[n].op_type for n in fused.interior) == [
        "MatMul",
        "Mul",
        "Mul",
        "Softmax",
        "Transpose",
    ]
    assert ops[fused.output].op_type == "MatMul"


def test_five_dimensional_sdpa_runs_unfused_unless_the_job_forces_a_kernel(
    five_dimensional: bytes, sdpa: bytes
) -> None:
    [block] = blocks(memory_graph(five_dimensional))
    [four] = blocks(memory_graph(sdpa))
    assert block.sdpa and not block.four_dimensional and four.four_dimensional
    assert not attention.fused_kernel(block, Attention.AUTO)
    assert attention.fused_kernel(block, Attention.EFFICIENT)
    auto = activations(five_dimensional, Mode.INFER, Attention.AUTO, Precision.FP16)
    assert auto == activations(five_dimensional, Mode.INFER, Attention.MATH, Precision.FP16)
    # the windows split the sequence, so each window's scores are 1/WINDOWS of a full matrix
    windowed_scores = SCORES // WindowedAttention.WINDOWS
    forced = activations(five_dimensional, Mode.INFER, Attention.EFFICIENT, Precision.FP16)
    assert auto - forced >= windowed_scores * 2
    assert "1 not four-dimensional" in attention.describe([block], Attention.AUTO)


def test_a_rank_the_graph_did_not_record_counts_as_four() -> None:
    graph = am.MemoryGraph.from_dict(
        {
            "nodes": [["MatMul", 8, 0], ["Softmax", 8, 0]],
            "edges": [[0, 1]],
            "input_elements": 0,
            "shared_weight_elements": 0,
        }
    )
    assert all(node.rank == 0 for node in graph.nodes) and "ranks" not in graph.to_dict()
    ranked = dataclasses.replace(
        graph, nodes=tuple(dataclasses.replace(n, rank=5) for n in graph.nodes)
    )
    assert am.MemoryGraph.from_dict(ranked.to_dict()) == ranked


def test_the_dynamo_exporters_sdpa_carries_the_same_trace() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.export's own deprecations
        program = torch.onnx.export(
            SelfAttention(fused=True).eval(),
            (torch.randn(BATCH, SEQ, WIDTH),),
            dynamo=True,
            dynamic_shapes={"x": {0: torch.export.Dim("batch")}},
            opset_version=18,
            verbose=False,
        )
    assert program is not None
    [block] = blocks(memory_graph(program.model_proto.SerializeToString()))
    assert block.sdpa


def activations(model: bytes, mode: Mode, kernel: Attention, precision: Precision) -> int:
    return am.estimate(
        memory_graph(model),
        mode=mode,
        precision=precision,
        optimizer=am.Optimizer.SGD,
        attention_kernel=kernel,
    ).activations


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.FP16])
def test_a_fused_kernel_holds_no_sequence_by_sequence_matrix_in_inference(
    sdpa: bytes, precision: Precision
) -> None:
    fused = activations(sdpa, Mode.INFER, Attention.AUTO, precision)
    math = activations(sdpa, Mode.INFER, Attention.MATH, precision)
    # As written, the scores and the fp32 softmax are alive together at the peak.
    assert math - fused >= SCORES * 4
    # Fused, the peak is a few (batch, S, width) tensors: below one fp16 score matrix.
    assert fused < SCORES * 2


def test_training_through_a_fused_kernel_saves_q_k_v_not_the_probabilities(sdpa: bytes) -> None:
    fused = activations(sdpa, Mode.TRAIN, Attention.AUTO, Precision.FP32)
    math = activations(sdpa, Mode.TRAIN, Attention.MATH, Precision.FP32)
    # As written, backward keeps the scaled scores and the probabilities (two fp32 matrices).
    assert math - fused >= 2 * SCORES * 4
    assert fused < SCORES * 2


def test_auto_runs_attention_written_by_hand_as_written_and_flash_fuses_it(by_hand: bytes) -> None:
    auto = activations(by_hand, Mode.INFER, Attention.AUTO, Precision.FP16)
    assert auto == activations(by_hand, Mode.INFER, Attention.MATH, Precision.FP16)
    for kernel in (Attention.FLASH, Attention.EFFICIENT):
        assert activations(by_hand, Mode.INFER, kernel, Precision.FP16) < auto - SCORES * 2


def test_read_as_written_the_estimate_ignores_the_kernel(sdpa: bytes) -> None:
    graph = memory_graph(sdpa)
    written = {
        am.estimate(
            graph,
            mode=Mode.INFER,
            precision=Precision.FP16,
            attention_kernel=kernel,
            rules=am.Rules.WRITTEN,
        )
        for kernel in Attention
    }
    assert len(written) == 1


def test_a_request_names_its_kernel_and_each_kernel_is_its_own_answer(sdpa: bytes) -> None:
    shipped = checkpoint.load(api.checkpoint_path("default"))
    predictor = api.Predictor(dataclasses.replace(shipped, prior_rules=am.Rules.RUNTIME))
    auto = predictor.predict(sdpa, 64, "infer", "fp16")
    math = predictor.predict(sdpa, 64, "infer", "fp16", attention="math")
    assert math.memory_bytes.point > auto.memory_bytes.point
    # the assumption is said with the prediction
    assert any(
        w.startswith("attention (auto): 1 blocks, 1 through scaled_dot_product_attention; "
                     "1 counted fused")
        for w in auto.warnings
    )  # fmt: skip
    assert any("attention (math): 1 blocks" in w and "0 counted fused" in w for w in math.warnings)
    assert predictor.predict(sdpa, 64, "infer", "fp16", attention="auto") is auto
    with pytest.raises(api.errors.PredictionError, match="unknown attention kernel 'paged'"):
        predictor.predict(sdpa, 64, "infer", "fp16", attention="paged")


def _window_batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    return (torch.randn(size, SEQ, WIDTH, device=device),), torch.zeros(size, device=device)


def test_the_math_path_computes_fp16_attention_in_fp32_as_pytorch_does(
    five_dimensional: bytes,
) -> None:
    """PyTorch 2.5+ runs a five-dimensional SDPA call on its math path, which copies query, key
    and value to fp32: the estimate read eagerly holds what the meta-device run of the same
    module allocates, and `written` (PyTorch 1.x, attention in fp16) does not."""
    runtime = gpu_memory.RUNTIMES["torch2-cuda12"]
    parts = gpu_memory.StepParts(
        build=WindowedAttention, batch=_window_batch, loss=lambda o, t: o.sum()
    )
    derived = gpu_memory.derive(parts, gpu_memory.Job("infer", "fp16", "none", BATCH), runtime)
    held = derived.allocated_peak - runtime.cublas_workspace_bytes
    graph = memory_graph(five_dimensional)

    def estimate(kernel: Attention) -> int:
        return prior.tensor_bytes(
            prior.breakdown(graph, Mode.INFER, Precision.FP16, "none", attention_kernel=kernel)
        )

    assert estimate(Attention.AUTO) == estimate(Attention.MATH)
    assert estimate(Attention.AUTO) == pytest.approx(held, rel=0.1)
    assert estimate(Attention.WRITTEN) < 0.8 * held
    [block] = blocks(graph)
    assert attention.upcasts(block, Attention.AUTO)
    assert not attention.upcasts(block, Attention.WRITTEN)
    assert not attention.upcasts(block, Attention.EFFICIENT)
