"""What the predictor predicts: metric names, the record columns they come from, and units.

A metric is ``"{mode}.{quantity}"``: the paper's six targets are training and inference x
(memory, SM utilisation, step time). One sample carries both modes of one (model, batch size,
precision); a sample measured in only one mode has the other mode's labels missing, and the
loss masks them (`train.masked_mse`). Which record column feeds each quantity, and what it
means physically, is fixed by the dataset (docs/dataset.md) and copied into every checkpoint
(`TARGET_DEFINITIONS`), so a checkpoint always says what its "memory" is.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

from kubeseer import prediction

QUANTITIES: Final[tuple[str, ...]] = ("memory_bytes", "sm_util_percent", "step_time_s")
MODES: Final[tuple[str, ...]] = tuple(mode.value for mode in prediction.Mode)
METRICS: Final[tuple[str, ...]] = tuple(f"{m}.{q}" for m in MODES for q in QUANTITIES)

# Record column (kubeseer.measure.records) holding each quantity's label.
LABEL_COLUMNS: Final[dict[str, str]] = {
    "memory_bytes": "memory_bytes",
    "sm_util_percent": "sm_util_mean_percent",
    "step_time_s": "step_time_median_s",
}

# On a CPU the wall-clock step time of a shared machine is mostly scheduler noise; the dataset
# records the step's process CPU time beside it, which with one thread is the step's own
# compute (docs/dataset.md, "CPU"). CPU datasets therefore learn step time from that column.
CPU_LABEL_COLUMNS: Final[dict[str, str]] = {
    **LABEL_COLUMNS,
    "step_time_s": "step_cpu_time_median_s",
}

TARGET_DEFINITIONS: Final[dict[str, str]] = {
    "memory_bytes": (
        "peak device memory of one step in bytes, as the record's memory_bytes column "
        "defines it for its device and label source (docs/dataset.md): NVML used bytes "
        "including the CUDA context on GPUs, peak RSS growth plus baseline on CPUs"
    ),
    "sm_util_percent": "mean SM utilisation over the timed steps, percent (NVML)",
    "step_time_s": "median wall time of one timed step, seconds",
}

CPU_TARGET_DEFINITIONS: Final[dict[str, str]] = {
    "memory_bytes": "peak resident-set growth of the task's process in bytes (CPU memory_bytes)",
    "sm_util_percent": "process CPU time over wall time x threads, percent (CPU utilisation)",
    "step_time_s": "median process CPU time of one timed step on one thread, seconds",
}


class MemoryLabel(StrEnum):
    """Which record column a checkpoint learns memory from.

    ``device`` is the dataset's own memory label (NVML used bytes on GPUs, RSS growth on
    CPUs). ``allocator`` is the peak of live tensor bytes, which is the same quantity on every
    device (the CPU peak is within 1.4 % of the derived CUDA peak for the median
    configuration, docs/accuracy.md), repeats exactly, and exists in derived fake-CUDA rows
    that have no device label. A device's own runtime overhead is then added at prediction time.
    """

    DEVICE = "device"
    ALLOCATOR = "allocator"
    RESERVED = "reserved"
    """What a GPU must hold less the CUDA context: the caching allocator's reservation
    (`memory_bytes - context_bytes`). The context belongs to the runtime, not the model, and
    the checkpoint adds its own (`Checkpoint.runtime_context_bytes`) at prediction time."""


ALLOCATOR_COLUMN: Final[str] = "allocator_peak_allocated_bytes"

ALLOCATOR_DEFINITION: Final[str] = (
    "peak bytes of live tensors during one step (allocator_peak_allocated_bytes: "
    "torch.cuda.max_memory_allocated on GPUs, MemTracker on CPUs and derived rows), without "
    "the CUDA context, library workspaces or the caching allocator's reserve"
)


BATCH_COUNTING_SOURCES: Final[tuple[str, ...]] = ("measured", "derived-allocator-replay")
"""Label sources of CUDA rows whose allocator peak counts the input batch."""


RESERVED_DEFINITION: Final[str] = (
    "what a GPU must hold for one step less the CUDA context: the caching allocator's "
    "required reservation (its block and segment rounding, cuBLAS workspaces, every tensor "
    "including the input batch; memory_bytes - context_bytes), bytes"
)


def memory_counts_batch(memory: MemoryLabel, device_kind: str, label_source: str) -> bool:
    """Whether memory labels include the step's input batch.

    Device labels (NVML used bytes, RSS growth) always do. An allocator peak on a measured GPU
    does too: ``torch.cuda.max_memory_allocated`` is reset before the job creates its batch; so
    does a derived allocator replay (``derived-allocator-replay``), whose trace places the batch
    on the device before the first step, as the job does. CPU and fake-CUDA rows come from
    `kubeseer.measure.memtrack`, which follows the model's and optimiser's tensors and every
    storage created during the step, but not the batch made before it (on the CPU data,
    counting it put the analytic estimate 7 % off the vgg inference peaks on average, against
    0.2 % without; docs/predictor.md).
    """
    if memory in (MemoryLabel.DEVICE, MemoryLabel.RESERVED):
        return True
    return device_kind == "cuda" and label_source in BATCH_COUNTING_SOURCES


def label_columns(device_kind: str, memory: MemoryLabel = MemoryLabel.DEVICE) -> dict[str, str]:
    """Record column of each quantity for a device kind (``cpu`` or ``cuda``); a reserved
    memory label is the device column less the record's ``context_bytes``."""
    columns = dict(CPU_LABEL_COLUMNS if device_kind == "cpu" else LABEL_COLUMNS)
    if memory is MemoryLabel.ALLOCATOR:
        columns["memory_bytes"] = ALLOCATOR_COLUMN
    return columns


def definitions(device_kind: str, memory: MemoryLabel = MemoryLabel.DEVICE) -> dict[str, str]:
    """What each quantity physically means on a device kind (stored in checkpoints)."""
    meanings = dict(CPU_TARGET_DEFINITIONS if device_kind == "cpu" else TARGET_DEFINITIONS)
    if memory is MemoryLabel.ALLOCATOR:
        meanings["memory_bytes"] = ALLOCATOR_DEFINITION
    elif memory is MemoryLabel.RESERVED:
        meanings["memory_bytes"] = RESERVED_DEFINITION
    return meanings


PRECISIONS: Final[tuple[str, ...]] = tuple(p.value for p in prediction.Precision)

# Training optimizers the harness runs (kubeseer.measure.steps.OPTIMIZERS); inference has none.
OPTIMIZERS: Final[tuple[str, ...]] = ("sgd", "adam")
NO_OPTIMIZER: Final[str] = "none"

# Appended to the PerfGraph's global features: the graph is the same at every precision and
# with every optimizer, the labels are not. "none" (inference only) is all optimizer zeros.
EXTRA_GLOBAL_FEATURES: Final[tuple[str, ...]] = tuple(f"precision={p}" for p in PRECISIONS) + (
    tuple(f"optimizer={o}" for o in OPTIMIZERS)
)


class UnknownMetricError(ValueError):
    """A metric name outside `METRICS`."""


def metric(mode: str, quantity: str) -> str:
    """The metric name of `quantity` in `mode`."""
    name = f"{mode}.{quantity}"
    if name not in METRICS:
        raise UnknownMetricError(f"unknown metric {name!r}; expected one of {METRICS}")
    return name


def split_metric(name: str) -> tuple[str, str]:
    """(mode, quantity) of a metric name."""
    if name not in METRICS:
        raise UnknownMetricError(f"unknown metric {name!r}; expected one of {METRICS}")
    mode, quantity = name.split(".", 1)
    return mode, quantity


def validate_metrics(names: Sequence[str]) -> tuple[str, ...]:
    """`names` in canonical order, rejecting unknown and duplicate names."""
    for name in names:
        split_metric(name)
    if len(set(names)) != len(names):
        raise UnknownMetricError(f"duplicate metric in {list(names)}")
    return tuple(m for m in METRICS if m in names)


def extra_globals(precision: str, optimizer: str) -> list[float]:
    """One-hot precision and optimizer features, in `EXTRA_GLOBAL_FEATURES` order."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if optimizer not in (*OPTIMIZERS, NO_OPTIMIZER):
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {OPTIMIZERS} or none")
    return [1.0 if p == precision else 0.0 for p in PRECISIONS] + [
        1.0 if o == optimizer else 0.0 for o in OPTIMIZERS
    ]
