"""CUDA autocast and attention on the meta device, checked against PyTorch's own CUDA autocast
on fake CUDA tensors (which can run a forward pass without a GPU, though not a backward)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import timm
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn import functional

from kubeseer.measure import alloc_trace, caching_allocator, meta_cuda


@contextlib.contextmanager
def _real_cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    # torch.autocast("cuda") disables itself without a GPU; its dispatch keys still work on
    # fake CUDA tensors when switched on directly.
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        torch.autocast_decrement_nesting()
        torch.set_autocast_enabled("cuda", False)
        torch.clear_autocast_cache()


def _forward_trace(
    make: Callable[[], nn.Module],
    shape: tuple[int, ...],
    *,
    fake: bool,
    grad_mode: Callable[[], object],
) -> caching_allocator.Replay:
    cpu_model = make().eval()
    recorder = alloc_trace.Recorder()
    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = cpu_model.to("cuda")
            x = torch.randn(shape, device="cuda")
            recorder.track([*model.parameters(), *model.buffers(), x])
            with recorder, grad_mode(), _real_cuda_autocast(torch.float16):  # type: ignore[attr-defined]
                model(x)
    else:
        with torch.device("meta"):
            model = make().eval()
        x = torch.randn(shape, device="meta")
        recorder.track([*model.parameters(), *model.buffers(), x])
        with recorder, grad_mode(), meta_cuda.CudaSemantics(torch.float16, "math"):  # type: ignore[attr-defined]
            model(x)
    return caching_allocator.replay(recorder.close())


@pytest.mark.parametrize("name", ["test_resnet", "test_convnext", "test_vit", "test_efficientnet"])
@pytest.mark.parametrize(
    "grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"]
)
def test_meta_autocast_allocates_what_cuda_autocast_allocates(name, grad_mode):
    def make() -> nn.Module:
        return timm.create_model(name, pretrained=False)

    fake = _forward_trace(make, (4, 3, 160, 160), fake=True, grad_mode=grad_mode)
    meta = _forward_trace(make, (4, 3, 160, 160), fake=False, grad_mode=grad_mode)
    # BatchNorm on meta returns its (tiny) batch statistics where cuDNN returns none, and the
    # fake path casts a convolution's weight before its input: a small segment at most.
    assert meta.peak_allocated == pytest.approx(fake.peak_allocated, rel=0.002)
    assert abs(meta.peak_reserved - fake.peak_reserved) <= max(2 << 20, fake.peak_reserved // 100)


class _Scores(nn.Module):
    """Attention written by hand: fp16 scores from a matmul, then a softmax with an fp32 output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ x.transpose(-2, -1)).softmax(-1)


@pytest.mark.parametrize(
    "grad_mode", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"]
)
def test_an_fp16_softmax_makes_no_fp32_copy_of_its_input_as_on_a_gpu(grad_mode):
    fake = _forward_trace(_Scores, (4, 256, 32), fake=True, grad_mode=grad_mode)
    meta = _forward_trace(_Scores, (4, 256, 32), fake=False, grad_mode=grad_mode)
    # fp16 scores (512 KiB) and the fp32 probabilities (1 MiB); meta's own softmax would copy
    # the scores to fp32 first (1 MiB more)
    assert meta.peak_allocated == fake.peak_allocated


class _Dropped(nn.Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(64, 256), nn.Dropout(0.1, inplace=inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc(x))


def _training_forward_peak(inplace: bool, *, fake: bool) -> int:
    """The allocated peak of `_Dropped`'s training forward under fp16 autocast."""
    recorder = alloc_trace.Recorder()
    device = "cuda" if fake else "meta"
    precision = (
        _real_cuda_autocast(torch.float16)
        if fake
        else meta_cuda.CudaSemantics(torch.float16, "math")
    )
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        with torch.device(device):
            model = _Dropped(inplace).train()
        x = torch.randn(512, 64, device=device)
        recorder.track([*model.parameters(), x])
        with recorder, precision:
            model(x)
    return caching_allocator.replay(recorder.close()).peak_allocated


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_in_training_keeps_what_cuda_keeps(inplace: bool) -> None:
    # out of place, CUDA's fused kernel keeps a one-byte mask (meta's own dropout: a noise
    # tensor of the input's dtype); in place, CUDA multiplies by such a noise tensor too
    meta = _training_forward_peak(inplace, fake=False)
    assert meta == _training_forward_peak(inplace, fake=True)


def test_autocast_policy_per_operator():
    x = torch.randn(8, 16, device="meta")
    w = torch.randn(32, 16, device="meta", requires_grad=True)
    with meta_cuda.CudaSemantics(torch.bfloat16):
        y = functional.linear(x, w)
        assert y.dtype == torch.bfloat16
        assert functional.layer_norm(y, (32,)).dtype == torch.float32
        assert y.softmax(-1).dtype == torch.float32
        assert torch.cat([y, x.new_empty(8, 32)]).dtype == torch.float32
        assert functional.gelu(y).dtype == torch.bfloat16
        loss = functional.cross_entropy(y, torch.zeros(8, dtype=torch.long, device="meta"))
        assert loss.dtype == torch.float32
    with meta_cuda.CudaSemantics(None):
        assert functional.linear(x, w).dtype == torch.float32


def test_weights_are_cast_once_per_autocast_region():
    w = torch.randn(64, 64, device="meta", requires_grad=True)
    x = torch.randn(4, 64, device="meta")
    recorder = alloc_trace.Recorder()
    recorder.track([w, x])
    with recorder, meta_cuda.CudaSemantics(torch.float16):
        a = x @ w
        b = x @ w
    events = recorder.close()
    casts_of_w = [
        e for e in events if isinstance(e, caching_allocator.Alloc) and e.size == 64 * 64 * 2
    ]
    assert len(casts_of_w) == 1
    del a, b


def _attention_alloc_sizes(kernel: meta_cuda.AttentionKernel, dtype: torch.dtype) -> list[int]:
    q = torch.randn(2, 4, 1024, 64, device="meta", dtype=dtype, requires_grad=True)
    recorder = alloc_trace.Recorder()
    recorder.track([q])
    with recorder, meta_cuda.CudaSemantics(None, kernel):
        out = functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        out.sum().backward()
    return [e.size for e in recorder.close() if isinstance(e, caching_allocator.Alloc)]


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [
        ("auto", torch.float16),
        ("flash", torch.float16),
        ("auto", torch.float32),
        ("efficient", torch.float32),
    ],
)
def test_fused_attention_keeps_no_sequence_by_sequence_matrix(kernel, dtype):
    scores = 2 * 4 * 1024 * 1024 * dtype.itemsize
    assert max(_attention_alloc_sizes(kernel, dtype)) < scores


def test_math_attention_materialises_the_scores():
    scores = 2 * 4 * 1024 * 1024 * 2
    assert max(_attention_alloc_sizes("math", torch.float16)) >= scores


def test_unknown_attention_kernel_is_refused():
    with pytest.raises(ValueError, match="attention must be one of"):
        meta_cuda.CudaSemantics(None, "sparse")  # type: ignore[arg-type]
