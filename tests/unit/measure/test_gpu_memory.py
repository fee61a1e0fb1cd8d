"""The derived GPU memory target: allocation traces, the runtime's parts, and the public
timm boundaries reader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from kubeseer.measure import alloc_trace, caching_allocator, gpu_memory, public_gpu
from kubeseer.measure.caching_allocator import Alloc, Free

MIB = 1 << 20


def test_a_view_keeps_its_storage_alive_and_the_free_follows_the_last_user():
    x = torch.empty(1 << 18, device="meta")  # 1 MiB
    recorder = alloc_trace.Recorder()
    recorder.track([x])
    with recorder:
        y = x * 2
        view = y.view(512, 512)
        del y
        z = x + 1  # an allocation after `del y`: y's storage must still be live
        del view
        w = x + 1  # now it is free, and the free is ordered before this allocation
    events = recorder.close()
    assert events == [Alloc(0, MIB), Alloc(1, MIB), Alloc(2, MIB), Free(1), Alloc(3, MIB)]
    del z, w


def test_tensors_saved_for_backward_are_live_until_backward_releases_them():
    w = torch.empty(256, 256, device="meta", requires_grad=True)
    recorder = alloc_trace.Recorder()
    recorder.track([w])
    with recorder:
        hidden = (w * 2).exp()  # exp saves its output
        loss = hidden.sum()
        del hidden
        marker = torch.empty(1, device="meta")
        loss.backward()
    events = recorder.close()
    marker_index = next(i for i, e in enumerate(events) if isinstance(e, Alloc) and e.size == 4)
    exp_output = [e.key for e in events[:marker_index] if isinstance(e, Alloc)][2]
    assert Free(exp_output) not in events[:marker_index]
    assert Free(exp_output) in events[marker_index:]
    del marker


def test_cublas_workspace_once_for_the_forward_thread_and_once_for_backward():
    w = torch.empty(64, 64, device="meta", requires_grad=True)
    recorder = alloc_trace.Recorder(cublas_workspace_bytes=8 * MIB)
    recorder.track([w])
    with recorder:
        for _ in range(2):
            (w @ w).sum().backward()
    workspaces = [e for e in recorder.close() if isinstance(e, Alloc) and e.size == 8 * MIB]
    assert len(workspaces) == 2


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1024, 4096)
        self.b = nn.Linear(4096, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(functional.relu(self.a(x)))


def _parts() -> gpu_memory.StepParts:
    def batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return (torch.empty(size, 1024, device=device),), torch.empty(
            size, dtype=torch.long, device=device
        )

    return gpu_memory.StepParts(build=_MLP, batch=batch, loss=functional.cross_entropy)


PARAMS = 1024 * 4096 + 4096 + 4096 * 10 + 10
RUNTIME = gpu_memory.RUNTIMES["torch2-cuda12"]


def test_adam_training_holds_weights_gradients_and_two_moments():
    job = gpu_memory.Job(mode="train", precision="fp32", optimizer="adam", batch_size=8)
    derived = gpu_memory.derive(_parts(), job, RUNTIME)
    workspaces = 2 * RUNTIME.cublas_workspace_bytes  # forward and backward cuBLAS handles
    # Weights, gradients, two moments, and the step's one foreach temporary (sqrt of v).
    assert derived.allocated_peak - workspaces == pytest.approx(5 * PARAMS * 4, rel=0.01)
    assert derived.required_reservation >= derived.allocated_peak
    assert derived.reserved_peak >= derived.required_reservation
    assert derived.memory_bytes == derived.required_reservation + RUNTIME.context_bytes


def test_gradients_zeroed_in_place_on_torch1_exist_during_the_forward():
    job = gpu_memory.Job(mode="train", precision="fp32", optimizer="sgd", batch_size=512)
    torch1 = gpu_memory.RUNTIMES["torch1-cuda11"]
    to_none = gpu_memory.derive(_parts(), job, RUNTIME)
    in_place = gpu_memory.derive(_parts(), job, torch1)
    assert in_place.allocated_peak > to_none.allocated_peak


def test_fp16_inference_holds_fp32_weights_and_their_cached_half_copies():
    fp32 = gpu_memory.Job(mode="infer", precision="fp32", optimizer="none", batch_size=1)
    fp16 = gpu_memory.Job(mode="infer", precision="fp16", optimizer="none", batch_size=1)
    a = gpu_memory.derive(_parts(), fp32, RUNTIME).allocated_peak
    b = gpu_memory.derive(_parts(), fp16, RUNTIME).allocated_peak
    assert b - a == pytest.approx(PARAMS * 2, rel=0.05)


def test_jobs_are_validated():
    with pytest.raises(ValueError, match="optimizer"):
        gpu_memory.Job(mode="infer", precision="fp32", optimizer="adam", batch_size=1)
    with pytest.raises(ValueError, match="batch size"):
        gpu_memory.Job(mode="train", precision="fp32", optimizer="adam", batch_size=0)


def test_timm_benchmark_files_give_rows_and_boundaries(tmp_path: Path):
    (tmp_path / "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv").write_text(
        "model,infer_img_size,infer_samples_per_sec,infer_step_time,infer_batch_size,param_count,infer_gmacs,infer_macts\n"
        "small,224,1000,10.0,1024,5.0,1.0,2.0\n"
        "big,224,100,50.0,384,300.0,60.0,80.0\n"
        "broken,224,,,,1.0,1.0,1.0\n"
    )
    rows = public_gpu.read_timm(tmp_path)
    assert [(r.model, r.gpu, r.batch_size, r.runtime) for r in rows] == [
        ("small", "RTX-4090", 1024, "torch2-cuda12"),
        ("big", "RTX-4090", 384, "torch2-cuda12"),
    ]
    assert rows[0].step_time_s == pytest.approx(0.010)
    boundaries = list(public_gpu.boundaries(rows))
    assert [(b.row.model, b.fit, b.fail) for b in boundaries] == [("big", 384, 512)]


def test_a_directory_without_benchmark_files_is_an_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no timm benchmark file"):
        public_gpu.read_timm(tmp_path / "missing")


def test_an_unknown_benchmark_file_name_is_an_error(tmp_path: Path):
    (tmp_path / "benchmark-something.csv").write_text("model\n")
    with pytest.raises(ValueError, match="not a timm benchmark"):
        public_gpu.read_timm(tmp_path)


def test_a_timm_job_derives_on_meta():
    parts = public_gpu.timm_parts("test_vit", 160)
    job = gpu_memory.Job(mode="train", precision="fp16", optimizer="sgd-nesterov", batch_size=4)
    derived = gpu_memory.derive(parts, job, RUNTIME)
    assert 0 < derived.allocated_peak <= derived.required_reservation <= derived.reserved_peak
    assert caching_allocator.round_size(derived.allocated_peak) == derived.allocated_peak
