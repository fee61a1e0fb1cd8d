"""Readers for the public GPU measurements in `shared/data/public-gpu/` (its README explains
them), and the timm jobs those measurements ran.

timm's `benchmark.py` ran each architecture at the largest batch of a fixed sequence that fit
the card (1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, ...): a row below
the run's starting batch says the next larger batch ran out of memory. That is the memory
evidence (`Boundary`); its step times are the step-time evidence (`TimmRow`).

Not every failure in that sequence is for want of memory: the benchmark retries with a smaller
batch after any `RuntimeError`. `memory_contradictions` finds the failures that another run of
the same job shows were not (`kernel_limits` finds those a kernel's launch limit explains).
"""

from __future__ import annotations

import collections
import csv
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch
from torch import nn
from torch.nn import functional

from kubeseer.hardware import gpus
from kubeseer.measure import gpu_memory

__all__ = [
    "BATCH_SEQUENCE",
    "CONTRADICTION_TOLERANCE",
    "Boundary",
    "TimmRow",
    "boundaries",
    "memory_contradictions",
    "read_timm",
    "timm_parts",
]

BATCH_SEQUENCE: Final[tuple[int, ...]] = (
    2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1,
)  # fmt: skip
"""timm's `decay_batch_step` sequence from its largest starting batch down."""

# The file name's GPU tag -> the hardware table's key.
GPU_TAGS: Final = {
    "rtx3090": "RTX-3090",
    "3090": "RTX-3090",
    "rtx4090": "RTX-4090",
    "4090": "RTX-4090",
    "5090": "RTX-5090",
    "pro6000maxq": "RTX-PRO-6000-MAXQ",
}

_NAME: Final = re.compile(
    r"benchmark-(?P<mode>infer|train)-(?P<precision>amp_bf16|amp|bf16)-(?P<layout>nchw|nhwc)"
    r"-pt(?P<torch>\d+)-cu(?P<cuda>\d+)-(?P<gpu>[a-z0-9]+?)(?P<dynamo>-dynamo)?\.csv"
)


@dataclass(frozen=True)
class TimmRow:
    """One architecture in one benchmark file.

    Attributes:
        model: timm model name; gpu: hardware table key; mode: infer | train;
        precision: `fp16` (AMP over FP32 weights), `bf16-amp`, or `bf16` (BF16 weights);
        channels_last: NHWC layout; dynamo: compiled with `torch.compile`;
        torch: e.g. "2.4" ; start_batch: the file's starting (largest tried) batch;
        batch_size, img_size, step_time_s, params (count).
    """

    model: str
    gpu: str
    mode: str
    precision: str
    channels_last: bool
    dynamo: bool
    torch: str
    cuda: str
    start_batch: int
    batch_size: int
    img_size: int
    step_time_s: float
    params: int
    source: str

    @property
    def runtime(self) -> str:
        """The `gpu_memory.RUNTIMES` entry the file's software stack matches."""
        return "torch1-cuda11" if self.torch.startswith("1.") else "torch2-cuda12"


@dataclass(frozen=True)
class Boundary:
    """The memory evidence of one row: `fit` ran on the card, `fail` (next larger) did not."""

    row: TimmRow
    fit: int
    fail: int


def _version(digits: str) -> str:
    return f"{digits[0]}.{digits[1:]}"


def read_timm(directory: Path) -> list[TimmRow]:
    """Every row of every `benchmark-*.csv` under `directory` that has a batch and a time.

    Raises:
        FileNotFoundError: `directory` holds no such file (a checkout without
            `shared/data/public-gpu` beside it would otherwise train on no public row at all).
        ValueError: a file name that does not follow the benchmark's naming.
    """
    rows: list[TimmRow] = []
    files = sorted(directory.glob("benchmark-*.csv"))
    if not files:
        raise FileNotFoundError(f"no timm benchmark file (benchmark-*.csv) in {directory}")
    for path in files:
        match = _NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path.name}: not a timm benchmark result file name")
        mode = match["mode"]
        precision = {"amp": "fp16", "amp_bf16": "bf16-amp", "bf16": "bf16"}[match["precision"]]
        with path.open(newline="") as handle:
            records = [r for r in csv.DictReader(handle) if r.get(f"{mode}_batch_size")]
        batches = [int(float(r[f"{mode}_batch_size"])) for r in records]
        start = max(batches, default=0)
        for record, batch in zip(records, batches, strict=True):
            if batch <= 0 or not record.get(f"{mode}_step_time"):
                continue
            rows.append(
                TimmRow(
                    model=record["model"],
                    gpu=GPU_TAGS[match["gpu"]],
                    mode=mode,
                    precision=precision,
                    channels_last=match["layout"] == "nhwc",
                    dynamo=match["dynamo"] is not None,
                    torch=_version(match["torch"]),
                    cuda=_version(match["cuda"]),
                    start_batch=start,
                    batch_size=batch,
                    img_size=int(float(record[f"{mode}_img_size"])),
                    step_time_s=float(record[f"{mode}_step_time"]) / 1e3,
                    params=round(float(record["param_count"]) * 1e6),
                    source=path.name,
                )
            )
    return rows


def boundaries(rows: list[TimmRow]) -> Iterator[Boundary]:
    """The rows that pin a memory boundary: batch below the file's start (eager runs only;
    `torch.compile` changes what is allocated)."""
    for row in rows:
        if row.dynamo or row.batch_size >= row.start_batch:
            continue
        index = BATCH_SEQUENCE.index(row.batch_size)
        yield Boundary(row=row, fit=row.batch_size, fail=BATCH_SEQUENCE[index - 1])


CONTRADICTION_TOLERANCE: Final = 0.95
"""A failure is put down to something other than memory only when another run shows that the
failed batch needs at most this fraction of the card. The slack covers what differs between two
cards on one software release and what no row shows: the context of another GPU architecture,
cuDNN's choice of algorithm and workspace, a display's framebuffer on a desktop card."""


def _job(row: TimmRow) -> tuple[str, str, str, str, bool, bool]:
    """What must match for two rows to be the same job: the architecture, the mode, the torch
    release, the precision, the layout and eager execution."""
    return (row.model, row.mode, row.torch, row.precision, row.channels_last, row.dynamo)


def memory_contradictions(
    rows: Sequence[TimmRow], *, tolerance: float = CONTRADICTION_TOLERANCE
) -> dict[Boundary, str]:
    """Every boundary of `rows` whose failed batch another row shows fits the card, with why.

    An eager job's memory does not shrink with a larger image and grows at most in proportion
    to its batch (weights, the CUDA context and library workspaces do not grow at all). So if
    the same job ran batch ``b`` at an image at least as large on a card of ``C`` bytes, batch
    ``F`` needs at most ``C * max(1, F / b)``. Where that is at most `tolerance` of the failing
    card, the failure there was not for want of memory: a boundary timm's benchmark recorded on
    the RTX PRO 6000 (96 GB) at batch 1,536, say, for a job a 24 GB card ran at 1,024. Such a
    failure is no evidence of what the job needs, and a margin fitted on it would only widen
    every bound.
    """
    by_job: dict[tuple[str, str, str, str, bool, bool], list[TimmRow]] = collections.defaultdict(
        list
    )
    for row in rows:
        by_job[_job(row)].append(row)
    found: dict[Boundary, str] = {}
    for boundary in boundaries(list(rows)):
        failed = boundary.row
        capacity = gpus.by_key(failed.gpu).memory_bytes
        for other in by_job[_job(failed)]:
            if other == failed or other.img_size < failed.img_size:
                continue
            needs_at_most = gpus.by_key(other.gpu).memory_bytes * max(
                1.0, boundary.fail / other.batch_size
            )
            if needs_at_most <= tolerance * capacity:
                found[boundary] = (
                    f"{other.gpu} ran batch {other.batch_size} at {other.img_size} px "
                    f"({other.source}), so batch {boundary.fail} needs at most "
                    f"{needs_at_most / capacity:.0%} of this card"
                )
                break
    return found


def timm_parts(model: str, img_size: int, *, channels_last: bool = False) -> gpu_memory.StepParts:
    """The job timm's `benchmark.py` runs: `timm.create_model(model)` with random weights, a
    batch of random images and random class targets, cross-entropy loss.

    Raises:
        ImportError: timm is not installed.
    """
    import timm

    def build() -> nn.Module:
        module: nn.Module = timm.create_model(model, pretrained=False)
        return module

    def batch(size: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        images = torch.empty((size, 3, img_size, img_size), device=device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return (images,), torch.empty((size,), dtype=torch.long, device=device)

    def loss(output: torch.Tensor | tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
        # Distilled models return (class, distillation) logits; the benchmark trains the first.
        logits = output[0] if isinstance(output, tuple) else output
        return functional.cross_entropy(logits, target)

    return gpu_memory.StepParts(build=build, batch=batch, loss=loss)
