"""Kernel limits that end a job before its memory does: what the probe sees per example, which
batches hit a limit, and which boundary a limit accounts for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from kubeseer.measure import gpu_memory, kernel_limits, public_gpu

RUNTIME = gpu_memory.RUNTIMES["torch2-cuda12"]


class Separable(nn.Module):
    """A depthwise 3x3 on 32 expanded channels, then a pointwise projection."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 32, 1)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.project = nn.Conv2d(32, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(self.depthwise(self.expand(x)))


class Windowed(nn.Module):
    """Attention over 16 windows of 4 tokens, 2 heads, the windows folded into the batch as
    Swin does: an attention batch of 16 per image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.reshape(x.shape[0] * 16, 2, 4, 8)
        return functional.scaled_dot_product_attention(q, q, q)


class WindowAxis(nn.Module):
    """The same windows kept on an axis of their own, as NesT does: a five-dimensional call,
    which runs PyTorch's math path and so launches no fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.reshape(x.shape[0], 2, 16, 4, 8)
        return functional.scaled_dot_product_attention(q, q, q)


def parts(build: type[nn.Module], shape: tuple[int, ...]) -> gpu_memory.StepParts:
    def batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return (torch.empty((size, *shape), device=device),), torch.empty(size, device=device)

    return gpu_memory.StepParts(build=build, batch=batch, loss=lambda out, _: out.sum())


def test_the_probe_sees_the_depthwise_tensor_and_not_the_grouped_ones_around_it():
    limits = kernel_limits.probe(parts(Separable, (3, 64, 64)), RUNTIME)
    assert limits.depthwise_elements_per_example == 32 * 64 * 64
    assert limits.attention_batch_per_example == 0
    assert limits.largest_elements_per_example == 32 * 64 * 64


def test_the_probe_counts_the_batch_of_a_four_dimensional_attention_call_windows_included():
    limits = kernel_limits.probe(parts(Windowed, (16 * 2 * 4 * 8,)), RUNTIME)
    assert limits.attention_batch_per_example == 16
    assert limits.depthwise_elements_per_example == 0


def test_an_attention_call_of_five_dimensions_launches_no_fused_kernel():
    limits = kernel_limits.probe(parts(WindowAxis, (16 * 2 * 4 * 8,)), RUNTIME)
    assert limits.attention_batch_per_example == 0


def test_a_depthwise_tensor_limit_is_hit_at_two_to_the_thirty_one_elements():
    limits = kernel_limits.Limits(0, 0, 2**21)  # 2^31 elements at batch 1,024
    assert limits.exceeded(1023) is None
    assert limits.exceeded(1024) == "a depthwise convolution tensor of 2^31 elements or more"


def test_an_attention_batch_limit_is_hit_above_the_grid_axis():
    limits = kernel_limits.Limits(0, 64, 0)
    assert limits.exceeded(1023) is None  # 65,472 blocks
    assert limits.exceeded(1024) == "an attention batch above 65,535"


def test_a_limit_explains_a_failure_only_when_the_batch_that_ran_stayed_under_it():
    limits = kernel_limits.Limits(0, 0, 2**21)
    assert limits.explains(768, 1024) is not None
    assert limits.explains(768, 1000) is None  # nothing hit at the batch that failed
    # the batch that ran already held such a tensor: this architecture's convolution was not
    # the native kernel's, so the limit cannot account for the next batch failing
    assert limits.explains(1024, 1536) is None


def test_a_limit_first_hit_at_the_failed_batch_explains_it_beside_one_already_hit() -> None:
    # maxxvit_rmlp_nano on the RTX PRO 6000: masked attention ran past the grid axis at 1,536,
    # the depthwise tensor first reached 2^31 elements at 2,048, where it failed
    limits = kernel_limits.Limits(0, 64, 2**20)
    assert limits.hit(1536) == ["an attention batch above 65,535"]
    assert limits.explains(1536, 2048) == "a depthwise convolution tensor of 2^31 elements or more"


def boundary(model: str, img: int) -> public_gpu.Boundary:
    row = public_gpu.TimmRow(
        model=model,
        gpu="RTX-4090",
        mode="infer",
        precision="fp16",
        channels_last=False,
        dynamo=False,
        torch="2.4",
        cuda="12.4",
        start_batch=1024,
        batch_size=768,
        img_size=img,
        step_time_s=0.1,
        params=1,
        source="benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
    )
    return public_gpu.Boundary(row=row, fit=768, fail=1024)


def test_lookup_reads_stored_probes_before_probing_and_caches_what_it_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    stored = tmp_path / "kernel-limits.jsonl"
    stored.write_text(json.dumps({"key": "known|224|torch2-cuda12", "limits": [5, 0, 3]}) + "\n")
    cache = tmp_path / "cache" / "limits.jsonl"
    probed: list[str] = []

    def fake_parts(model: str, img_size: int) -> gpu_memory.StepParts:
        probed.append(model)
        return parts(Separable, (3, img_size, img_size))

    monkeypatch.setattr(public_gpu, "timm_parts", fake_parts)
    found = kernel_limits.lookup(
        [boundary("known", 224), boundary("new", 16), boundary("new", 16)], [stored], cache
    )
    assert probed == ["new"]
    assert found["known|224|torch2-cuda12"] == kernel_limits.Limits(5, 0, 3)
    assert found["new|16|torch2-cuda12"] == kernel_limits.Limits(32 * 256, 0, 32 * 256)
    assert kernel_limits.read([cache]) == {"new|16|torch2-cuda12": found["new|16|torch2-cuda12"]}
