"""Kernel launch limits read off an export: fused attention's batch, depthwise tensors."""

import pytest
import torch
from torch import nn
from torch.nn import functional

from kubeseer.prediction import Attention
from kubeseer.predictor import analytic_memory, extract, launch_limits
from kubeseer.predictor.launch_limits import GRID_LIMIT, INT32_ELEMENTS, LaunchSizes

HEADS, SEQ, HEAD_DIM, WINDOWS = 2, 16, 8, 3
WIDTH = HEADS * HEAD_DIM


class WindowAttention(nn.Module):
    """Self-attention over `WINDOWS` windows per example, as Swin runs it: the windows fold
    into the attention's batch. Through SDPA or written by hand."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        qkv = self.qkv(x).reshape(b * WINDOWS, SEQ, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused:
            out = functional.scaled_dot_product_attention(q, k, v)
        else:
            out = ((q * HEAD_DIM**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return out.reshape(b, WINDOWS * SEQ * WIDTH)


class WindowAxis(nn.Module):
    """The same windows kept on an axis of their own, as NesT does: SDPA on five-dimensional
    operands, which PyTorch runs on the math path."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        qkv = self.qkv(x).reshape(b, WINDOWS, SEQ, 3, HEADS, HEAD_DIM).permute(3, 0, 4, 1, 2, 5)
        q, k, v = qkv.unbind(0)
        return functional.scaled_dot_product_attention(q, k, v).reshape(b, -1)


class Depthwise(nn.Module):
    """A pointwise convolution widening 4 to 8 channels, then a depthwise one."""

    def __init__(self) -> None:
        super().__init__()
        self.pointwise = nn.Conv2d(4, 8, 1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.depthwise(self.pointwise(x))


def sizes(model: bytes, batch: int, kernel: Attention) -> LaunchSizes:
    graph = extract.from_onnx(model, batch_size=batch)
    memory = analytic_memory.from_perfgraph(graph)
    return launch_limits.measure(graph, memory, analytic_memory.attention_blocks(memory), kernel)


@pytest.fixture(scope="module")
def sdpa(torchscript_onnx) -> bytes:
    return torchscript_onnx(WindowAttention(fused=True), torch.randn(2, WINDOWS * SEQ, WIDTH))


@pytest.fixture(scope="module")
def by_hand(torchscript_onnx) -> bytes:
    return torchscript_onnx(WindowAttention(fused=False), torch.randn(2, WINDOWS * SEQ, WIDTH))


@pytest.fixture(scope="module")
def depthwise(torchscript_onnx) -> bytes:
    return torchscript_onnx(Depthwise(), torch.randn(2, 4, 32, 32))


def test_a_fused_attentions_batch_counts_its_windows(sdpa: bytes) -> None:
    found = sizes(sdpa, 5, Attention.AUTO)
    assert found.attention_batch == 5 * WINDOWS
    assert found.depthwise_elements == 0


def test_attention_run_as_written_launches_no_fused_kernel(sdpa: bytes, by_hand: bytes) -> None:
    assert sizes(sdpa, 5, Attention.MATH).attention_batch == 0
    assert sizes(by_hand, 5, Attention.AUTO).attention_batch == 0
    assert sizes(by_hand, 5, Attention.FLASH).attention_batch == 5 * WINDOWS


def test_five_dimensional_attention_launches_no_fused_kernel(torchscript_onnx) -> None:
    model = torchscript_onnx(WindowAxis(), torch.randn(2, WINDOWS * SEQ, WIDTH))
    assert sizes(model, 5, Attention.AUTO).attention_batch == 0
    assert sizes(model, 5 * 65_536, Attention.AUTO).failures() == ()


def test_a_depthwise_convolution_is_measured_and_a_grouped_one_is_not(depthwise: bytes) -> None:
    found = sizes(depthwise, 3, Attention.AUTO)
    assert found.depthwise_elements == 3 * 8 * 32 * 32
    assert found.attention_batch == 0


def test_fused_attention_past_the_grid_fails_and_names_the_largest_batch_below() -> None:
    per_example = 3
    largest = GRID_LIMIT // per_example
    assert LaunchSizes(largest, largest * per_example, 0).failures() == ()
    failed = LaunchSizes(largest + 1, (largest + 1) * per_example, 0).failures()
    assert len(failed) == 1
    assert "65,535" in failed[0] and f"batch {largest} or less" in failed[0]


def test_a_depthwise_tensor_of_2_31_elements_is_a_risk_not_a_failure() -> None:
    elements_per_example = 2**20
    batch = INT32_ELEMENTS // elements_per_example
    assert LaunchSizes(batch - 1, 0, (batch - 1) * elements_per_example).risks() == ()
    at_limit = LaunchSizes(batch, 0, INT32_ELEMENTS)
    assert at_limit.failures() == ()
    (risk,) = at_limit.risks()
    assert risk.startswith(f"batch {batch} runs a depthwise")
    assert f"batch {batch - 1} or less" in risk
