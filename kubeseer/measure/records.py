"""One measured (or derived) row of the performance dataset, and its versioned Arrow schema.

A `Record` is the unit the harness writes and the predictor reads. It carries everything
needed to regenerate the model exactly (the spec JSON), the key it is deduplicated on
(config hash, batch size, mode, precision, optimizer), the device it was measured on, the
provenance of its labels (`label_source`), and the labels themselves. Every column, its unit
and the definition of each target are documented in docs/dataset.md; a change to the columns
is a new `SCHEMA_VERSION`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

SCHEMA_VERSION: Final[int] = 1

# The three predicted targets, by column name (definitions in docs/dataset.md).
LABEL_MEMORY: Final[str] = "memory_bytes"
LABEL_UTILISATION: Final[str] = "sm_util_mean_percent"
LABEL_STEP_TIME: Final[str] = "step_time_median_s"
TARGET_LABELS: Final[tuple[str, str, str]] = (LABEL_MEMORY, LABEL_UTILISATION, LABEL_STEP_TIME)

# Written into every Parquet file's metadata, so a file explains its own targets.
TARGET_DEFINITIONS: Final[dict[str, str]] = {
    LABEL_MEMORY: "GPU: peak NVML device memory used during the task minus the idle baseline, "
    "including the CUDA context (the bytes a GPU or MIG slice must hold); CPU: peak resident "
    "set growth of the task's process; censored rows hold the exceeded limit",
    LABEL_UTILISATION: "GPU: mean SM activity (GPM) or NVML GPU utilisation over the timed "
    "iterations, percent; CPU: process CPU time / (wall time x threads), percent",
    LABEL_STEP_TIME: "median wall (CPU) or CUDA-event (GPU) time of one timed step, seconds",
}


class LabelSource(enum.StrEnum):
    """Where a record's labels come from; sources are never mixed inside one record."""

    MEASURED = "measured"
    DERIVED_FAKE_CUDA_ALLOCATOR = "derived-fake-cuda-allocator"
    DERIVED_ALLOCATOR_REPLAY = "derived-allocator-replay"


class Status(enum.StrEnum):
    """Outcome of one configuration: labelled, or censored because it did not fit."""

    OK = "ok"
    OUT_OF_MEMORY = "oom"


class DeviceKind(enum.StrEnum):
    """The kind of device a dataset describes; one Parquet dataset per concrete device."""

    CPU = "cpu"
    CUDA = "cuda"


NO_OPTIMIZER: Final[str] = "none"


@dataclass(frozen=True)
class DeviceDescriptor:
    """What a label is valid for: the same model behaves differently on another device.

    `memory_bytes` is the device's total memory (host RAM for CPUs); `sm_count` is the number of
    streaming multiprocessors (GPUs) and `cores` the number of cores the harness used (CPUs).
    """

    kind: DeviceKind
    name: str
    memory_bytes: int
    sm_count: int | None
    cores: int | None
    mig_profile: str | None
    driver_version: str | None
    cuda_version: str | None
    torch_version: str

    def slug(self) -> str:
        """A directory-safe name, so each device gets its own dataset directory."""
        text = f"{self.kind.value}-{self.name}" + (
            f"-{self.mig_profile}" if self.mig_profile else ""
        )
        return (
            "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-").replace("--", "-")
        )


@dataclass(frozen=True)
class Record:
    """One row of the dataset; see docs/dataset.md for the unit and meaning of every field.

    Censored rows (`status == "oom"`) did not fit: `memory_bytes` then holds the limit that was
    exceeded (a lower bound on the true need) and the time and utilisation labels are None.
    """

    schema_version: int
    config_hash: str
    family: str
    spec_json: str
    batch_size: int
    mode: str
    precision: str
    optimizer: str
    device: DeviceDescriptor
    label_source: LabelSource
    status: Status
    plan: str
    flops: int | None
    params: int | None
    warmup_iterations: int
    timed_iterations: int
    step_time_mean_s: float | None
    step_time_median_s: float | None
    step_time_p95_s: float | None
    step_cpu_time_median_s: float | None
    memory_bytes: int | None
    context_bytes: int | None
    allocator_peak_allocated_bytes: int | None
    allocator_peak_reserved_bytes: int | None
    rss_baseline_bytes: int | None
    rss_peak_delta_bytes: int | None
    sm_util_mean_percent: float | None
    sm_util_peak_percent: float | None
    utilisation_source: str | None
    utilisation_samples: int | None
    energy_j: float | None
    threads: int | None
    started_at: str
    finished_at: str

    @property
    def censored(self) -> bool:
        """True when the configuration ran out of memory and its labels are lower bounds."""
        return self.status is Status.OUT_OF_MEMORY

    @property
    def key(self) -> tuple[str, int, str, str, str]:
        """The deduplication key: one label per configuration per device."""
        return (self.config_hash, self.batch_size, self.mode, self.precision, self.optimizer)


_DEVICE_COLUMNS: Final[tuple[tuple[str, pa.DataType], ...]] = (
    ("device_kind", pa.string()),
    ("device_name", pa.string()),
    ("device_memory_bytes", pa.int64()),
    ("device_sm_count", pa.int32()),
    ("device_cores", pa.int32()),
    ("device_mig_profile", pa.string()),
    ("driver_version", pa.string()),
    ("cuda_version", pa.string()),
    ("torch_version", pa.string()),
)

_RECORD_TYPES: Final[dict[str, pa.DataType]] = {
    "schema_version": pa.int32(),
    "config_hash": pa.string(),
    "family": pa.string(),
    "spec_json": pa.string(),
    "batch_size": pa.int32(),
    "mode": pa.string(),
    "precision": pa.string(),
    "optimizer": pa.string(),
    "label_source": pa.string(),
    "status": pa.string(),
    "plan": pa.string(),
    "flops": pa.int64(),
    "params": pa.int64(),
    "warmup_iterations": pa.int32(),
    "timed_iterations": pa.int32(),
    "step_time_mean_s": pa.float64(),
    "step_time_median_s": pa.float64(),
    "step_time_p95_s": pa.float64(),
    "step_cpu_time_median_s": pa.float64(),
    "memory_bytes": pa.int64(),
    "context_bytes": pa.int64(),
    "allocator_peak_allocated_bytes": pa.int64(),
    "allocator_peak_reserved_bytes": pa.int64(),
    "rss_baseline_bytes": pa.int64(),
    "rss_peak_delta_bytes": pa.int64(),
    "sm_util_mean_percent": pa.float64(),
    "sm_util_peak_percent": pa.float64(),
    "utilisation_source": pa.string(),
    "utilisation_samples": pa.int32(),
    "energy_j": pa.float64(),
    "threads": pa.int32(),
    "started_at": pa.string(),
    "finished_at": pa.string(),
}

_NOT_NULL: Final[frozenset[str]] = frozenset(
    {
        "schema_version",
        "config_hash",
        "family",
        "spec_json",
        "batch_size",
        "mode",
        "precision",
        "optimizer",
        "label_source",
        "status",
        "plan",
        "warmup_iterations",
        "timed_iterations",
        "started_at",
        "finished_at",
        "device_kind",
        "device_name",
        "device_memory_bytes",
        "torch_version",
    }
)


def _field(name: str, kind: pa.DataType) -> pa.Field:
    return pa.field(name, kind, nullable=name not in _NOT_NULL)


SCHEMA: Final[pa.Schema] = pa.schema(
    [
        *(_field(name, kind) for name, kind in _RECORD_TYPES.items()),
        *(_field(name, kind) for name, kind in _DEVICE_COLUMNS),
    ],
    metadata={
        "kubeseer.schema_version": str(SCHEMA_VERSION),
        "kubeseer.targets": json.dumps(TARGET_DEFINITIONS, sort_keys=True),
    },
)


class SchemaError(ValueError):
    """A Parquet file whose columns or schema version this reader does not understand."""


def to_row(record: Record) -> dict[str, Any]:
    """Flatten a record into one Arrow row (device fields become `device_*` columns)."""
    row = {
        f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "device"
    }
    row["label_source"] = record.label_source.value
    row["status"] = record.status.value
    device = record.device
    row.update(
        device_kind=device.kind.value,
        device_name=device.name,
        device_memory_bytes=device.memory_bytes,
        device_sm_count=device.sm_count,
        device_cores=device.cores,
        device_mig_profile=device.mig_profile,
        driver_version=device.driver_version,
        cuda_version=device.cuda_version,
        torch_version=device.torch_version,
    )
    return row


def from_row(row: Mapping[str, Any]) -> Record:
    """Rebuild a record from one Arrow row written by `to_row`.

    Raises:
        SchemaError: the row was written under another schema version or lacks a column.
    """
    version = row.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(f"schema version {version!r}; this reader understands {SCHEMA_VERSION}")
    try:
        device = DeviceDescriptor(
            kind=DeviceKind(row["device_kind"]),
            name=row["device_name"],
            memory_bytes=row["device_memory_bytes"],
            sm_count=row["device_sm_count"],
            cores=row["device_cores"],
            mig_profile=row["device_mig_profile"],
            driver_version=row["driver_version"],
            cuda_version=row["cuda_version"],
            torch_version=row["torch_version"],
        )
        values = {name: row[name] for name in _RECORD_TYPES}
    except (KeyError, ValueError) as e:
        raise SchemaError(f"row does not match schema version {SCHEMA_VERSION}: {e}") from e
    values["label_source"] = LabelSource(values["label_source"])
    values["status"] = Status(values["status"])
    return Record(device=device, **values)


def to_table(records: list[Record]) -> pa.Table:
    """The Arrow table of `records` under `SCHEMA` (column order fixed by the schema)."""
    rows = [to_row(r) for r in records]
    return pa.Table.from_pylist(rows, schema=SCHEMA)
