"""The GPU a prediction is for, as the model reads it: specs from the hardware table.

A device-aware checkpoint predicts step time for a named GPU or MIG profile from the device's
specs (`kubeseer.hardware`: SMs, peak FLOP/s per precision, DRAM bandwidth, L2), so a GPU that no
label was measured on is predicted from what it is, not refused. The specs reach the model two
ways: as the step-time prior's denominators (`cost_model.device_terms`: seconds at the device's
peak rate per unit of work) and as the step heads' extra inputs (`features`, ``device_x``).
Memory does not depend on the device (the same tensors, allocator and CUDA runtime on every
NVIDIA GPU), so memory heads do not read them.

Also here: the step's work as the graph counts it (`work`), which placement scales from one
device to another (`kubeseer.placement.slowdown.from_work`).
"""

from __future__ import annotations

import math
from typing import Final

import torch
from torch import Tensor

from kubeseer import prediction
from kubeseer.hardware import gpus, mig
from kubeseer.predictor import errors, perfgraph

FEATURES: Final[tuple[str, ...]] = (
    "log_peak_matmul_flops",
    "log_peak_fp32_flops",
    "log_memory_bandwidth",
    "log_sms",
    "log_l2_bytes",
    "log_ridge_point",
)
"""``device_x`` columns: natural logs of the device's peak FLOP/s for the job's matrix products
and convolutions (tensor cores at fp16/bf16, TF32 for fp32), its FP32 CUDA-core peak, its
bandwidth in bytes/s, its SMs, its L2 bytes, and the ridge point (matrix peak over bandwidth)."""

REFERENCE_GPU: Final[str] = "H100-SXM5-80GB"
"""The GPU a device-aware checkpoint predicts step time for when no GPU is named (the operator
asks once per job; placement scales the step to each candidate with the job's work)."""

_MATMUL_PRECISION: Final[dict[str, gpus.Precision]] = {
    "fp32": "tf32",
    "fp16": "fp16",
    "bf16": "bf16",
}

AUTOCAST_BYTES: Final[float] = 0.5
"""Bytes an fp16/bf16 autocast step moves per byte of the fp32 graph: matrix products and
convolutions read and write half-width tensors, and the elementwise operators between them
receive those. The graph is exported in fp32, so its byte counts are scaled by this."""

TRAIN_PASSES: Final[float] = 3.0
"""A training step's work in forward passes: forward, and a backward of about twice its FLOPs
and traffic (gradients of activations and of weights)."""


def resolve(gpu: str) -> mig.Device:
    """`GPU` or `GPU/PROFILE` (any name `gpus.lookup` accepts, a MIG profile such as
    `3g.40gb`) as a device.

    Raises:
        errors.PredictionError: the hardware table knows no such GPU or profile.
    """
    name, _, profile = gpu.partition("/")
    try:
        return mig.device(name, profile or None)
    except (gpus.UnknownGpuError, mig.UnknownProfileError) as e:
        raise errors.PredictionError(str(e.args[0] if e.args else e)) from e


def matmul_precision(precision: str) -> gpus.Precision:
    """The hardware table's precision for matrix products and convolutions of a job."""
    return _MATMUL_PRECISION[precision]


def features(device: mig.Device, precision: str) -> Tensor:
    """``device_x`` of one sample, ``(1, len(FEATURES))`` float32."""
    matmul = device.peak_flops(matmul_precision(precision))
    values = (
        matmul,
        device.peak_flops("fp32"),
        device.memory_bandwidth,
        float(device.sms),
        float(device.l2_bytes),
        matmul / device.memory_bandwidth,
    )
    return torch.tensor([[math.log(v) for v in values]], dtype=torch.float32)


def work(graph: perfgraph.PerfGraph, mode: prediction.Mode, precision: str) -> prediction.StepWork:
    """The step's work from its graph: FLOPs, bytes at autocast width, operators; a training
    step counts `TRAIN_PASSES` forward passes."""
    passes = TRAIN_PASSES if mode is prediction.Mode.TRAIN else 1.0
    width = 1.0 if precision == "fp32" else AUTOCAST_BYTES
    return prediction.StepWork(
        flops=float(graph.flops) * passes,
        bytes_moved=float(graph.mac) * width * passes,
        kernels=float(graph.num_nodes) * passes,
    )
