"""One finished DLJob attempt as training data: the `Observation` and its Arrow schema.

An observation keeps everything needed to learn from the attempt later without the cluster:
which model (its sha256 and, where stored, a reference to its PerfGraph), how it ran (batch,
mode, precision, optimizer, symbolic dimensions), where (GPU product, MIG profile, the memory
the placement gave it), what was predicted (point and calibrated upper bound, the checkpoint
that made them) and what was observed (the profiler's peak and mean memory, SM activity), with
the outcome. An attempt that ran out of memory is a censored memory label: its need exceeded
`memory_at_least_bytes` (the slice's usable memory), by an unknown amount.

The identifier is a hash of the DLJob's UID and the attempt, so writing the same attempt twice
names the same record (writes are idempotent), and two DLJobs of the same name (one deleted,
one created again) never collide. A change to the columns is a new `SCHEMA_VERSION`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

SCHEMA_VERSION: Final[int] = 1


class Outcome(enum.StrEnum):
    """How the attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OOM = "oom"


def observation_id(dljob_uid: str, attempt: int) -> str:
    """The record's identifier: 32 hex of sha256 over the DLJob's UID and the attempt."""
    if not dljob_uid:
        raise ValueError("an observation needs the DLJob's UID")
    return hashlib.sha256(f"{dljob_uid}/{attempt}".encode()).hexdigest()[:32]


def canonical_inputs(inputs: Mapping[str, int]) -> str:
    """The symbolic dimension bindings as canonical JSON (sorted keys, no spaces)."""
    return json.dumps(
        {str(k): int(v) for k, v in inputs.items()}, sort_keys=True, separators=(",", ":")
    )


@dataclass(frozen=True)
class Observation:
    """One finished attempt; docs/feedback.md describes every field and its unit."""

    observation_id: str
    namespace: str
    dljob: str
    dljob_uid: str
    attempt: int
    family: str
    model_digest: str
    model_source: str
    perfgraph_ref: str | None
    inputs_json: str
    batch_size: int
    mode: str
    precision: str
    optimizer: str
    gpu_product: str
    gpu_model_name: str | None
    mig_profile: str | None
    usable_memory_bytes: int | None
    predictor_version: str
    label_device: str
    coverage: float
    predicted_memory_bytes: float
    predicted_memory_upper_bytes: float
    predicted_sm_util_percent: float | None
    predicted_step_time_s: float | None
    observed_peak_memory_bytes: int | None
    observed_mean_memory_bytes: int | None
    observed_sm_activity_percent: float | None
    observed_sm_source: str | None
    observed_samples: int
    observed_source: str | None
    window_start: str | None
    window_end: str | None
    outcome: Outcome
    memory_at_least_bytes: int | None
    finished_at: str
    recorded_at: str
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.observation_id != observation_id(self.dljob_uid, self.attempt):
            raise ValueError("observation_id is not the hash of the DLJob UID and attempt")
        if self.outcome is Outcome.OOM and self.memory_at_least_bytes is None:
            raise ValueError("an out-of-memory observation needs the memory it exceeded")

    @property
    def censored(self) -> bool:
        """The memory label is a lower bound (the attempt ran out of memory)."""
        return self.outcome is Outcome.OOM

    @property
    def memory_label(self) -> int | None:
        """Observed peak memory, or for a censored attempt the bound it is known to exceed."""
        if self.censored:
            return self.memory_at_least_bytes
        return self.observed_peak_memory_bytes

    def inputs(self) -> dict[str, int]:
        """The symbolic dimension bindings."""
        return {str(k): int(v) for k, v in json.loads(self.inputs_json).items()}


_TYPES: Final[dict[str, pa.DataType]] = {
    "schema_version": pa.int32(),
    "observation_id": pa.string(),
    "namespace": pa.string(),
    "dljob": pa.string(),
    "dljob_uid": pa.string(),
    "attempt": pa.int32(),
    "family": pa.string(),
    "model_digest": pa.string(),
    "model_source": pa.string(),
    "perfgraph_ref": pa.string(),
    "inputs_json": pa.string(),
    "batch_size": pa.int32(),
    "mode": pa.string(),
    "precision": pa.string(),
    "optimizer": pa.string(),
    "gpu_product": pa.string(),
    "gpu_model_name": pa.string(),
    "mig_profile": pa.string(),
    "usable_memory_bytes": pa.int64(),
    "predictor_version": pa.string(),
    "label_device": pa.string(),
    "coverage": pa.float64(),
    "predicted_memory_bytes": pa.float64(),
    "predicted_memory_upper_bytes": pa.float64(),
    "predicted_sm_util_percent": pa.float64(),
    "predicted_step_time_s": pa.float64(),
    "observed_peak_memory_bytes": pa.int64(),
    "observed_mean_memory_bytes": pa.int64(),
    "observed_sm_activity_percent": pa.float64(),
    "observed_sm_source": pa.string(),
    "observed_samples": pa.int32(),
    "observed_source": pa.string(),
    "window_start": pa.string(),
    "window_end": pa.string(),
    "outcome": pa.string(),
    "memory_at_least_bytes": pa.int64(),
    "finished_at": pa.string(),
    "recorded_at": pa.string(),
}
_NULLABLE: Final[frozenset[str]] = frozenset(
    name
    for name, f in ((f.name, f) for f in dataclasses.fields(Observation))
    if "None" in str(f.type)
)

SCHEMA: Final[pa.Schema] = pa.schema(
    [pa.field(name, kind, nullable=name in _NULLABLE) for name, kind in _TYPES.items()],
    metadata={"kubeseer.observations.schema_version": str(SCHEMA_VERSION)},
)


class SchemaError(ValueError):
    """A row or file written under a schema this reader does not understand."""


def to_row(observation: Observation) -> dict[str, Any]:
    """One Arrow row."""
    row = dataclasses.asdict(observation)
    row["outcome"] = observation.outcome.value
    return row


def from_row(row: Mapping[str, Any]) -> Observation:
    """Inverse of `to_row`.

    Raises:
        SchemaError: another schema version, a missing column or a value that does not fit.
    """
    if row.get("schema_version") != SCHEMA_VERSION:
        raise SchemaError(
            f"schema version {row.get('schema_version')!r}; this reader understands "
            f"{SCHEMA_VERSION}"
        )
    try:
        values = {name: row[name] for name in _TYPES}
        values["outcome"] = Outcome(values["outcome"])
        return Observation(**values)
    except (KeyError, ValueError, TypeError) as e:
        raise SchemaError(f"row does not match observation schema {SCHEMA_VERSION}: {e}") from e


def to_table(observations: list[Observation]) -> pa.Table:
    """The Arrow table of `observations` under `SCHEMA`."""
    return pa.Table.from_pylist([to_row(o) for o in observations], schema=SCHEMA)
