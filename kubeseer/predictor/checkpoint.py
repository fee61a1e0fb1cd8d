"""The checkpoint: one file that holds a trained predictor and everything needed to trust it.

A checkpoint is ``torch.save`` of a plain dict (tensors, strings, numbers, lists, dicts only),
loaded with ``weights_only=True`` so opening one never runs code. It holds the weights and
the hyper-parameters to rebuild the model, the PerfGraph feature schema (version and column
names) the model was trained on, the normalisation, the metric names and their physical
definitions, the conformal margins, the device and label source the labels came from, the
digest of the training records and the evaluation tables.

A model reads feature columns by position, so a checkpoint built under another feature
schema would read shifted columns and predict nonsense without any error; `load` refuses it
with `SchemaMismatchError` instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch
from torch import nn

from kubeseer.predictor import (
    analytic_memory,
    calibration,
    device,
    normalise,
    report,
    schema,
    seernet,
    targets,
)

_Calibration = calibration.Calibration
"""The margins' type, by a name the `calibration` field does not hide in the class body."""

FORMAT: Final[str] = "kubeseer-predictor"
FORMAT_VERSION: Final[int] = 1


class CheckpointError(Exception):
    """A file that is not a readable kubeseer predictor checkpoint."""


class SchemaMismatchError(CheckpointError):
    """A checkpoint trained on another PerfGraph feature schema than this kubeseer extracts."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters that rebuild the model; `kind` is ``seernet`` or ``seernet_multi``."""

    kind: str
    node_channels: int
    edge_channels: int
    global_channels: int
    num_tasks: int
    hidden_channels: int = 256
    synmm: bool = True
    gnpb: bool = True
    device_channels: int = 0
    device_tasks: tuple[int, ...] = ()

    def build(self) -> nn.Module:
        """A freshly initialised model of this shape."""
        shape = (self.node_channels, self.edge_channels, self.global_channels)
        options = {"synmm": self.synmm, "gnpb": self.gnpb}
        if self.kind == "seernet_multi":
            return seernet.SeerNetMulti(
                *shape,
                self.num_tasks,
                self.hidden_channels,
                **options,
                device_channels=self.device_channels,
                device_tasks=tuple(self.device_tasks),
            )
        if self.device_channels:
            raise CheckpointError("only SeerNet-Multi reads a device")
        if self.kind == "seernet":
            return seernet.SeerNet(*shape, self.num_tasks, self.hidden_channels, **options)
        raise CheckpointError(f"unknown model kind {self.kind!r}")


@dataclass(frozen=True)
class Checkpoint:
    """A trained predictor and its provenance.

    Args:
        model_config: how to rebuild the model.
        state_dict: its weights.
        normaliser: feature and target normalisation.
        calibration: conformal margins per metric.
        label_device: slug of the device the labels were measured on (e.g. ``cuda-a100...``),
            or the slugs of several, comma-separated (a device-aware fine-tune on a cluster's
            GPUs and MIG slices, `dataset.select_records`).
        label_device_name: the device's product name (several: each, comma-separated).
        label_source: ``measured`` or a derived source (kubeseer.measure.records.LabelSource).
        train_optimizers: optimizers of the training-mode labels (a model input).
        data_digest: sha256 of the training records (`dataset.digest`).
        evaluations: evaluation tables, e.g. the random split and each held-out family.
        train_config: the `TrainConfig` used, as a dict.
        schema_version, node_features, edge_features, global_features: the feature schema.
        target_definitions: what each quantity physically is.
        memory_label: the record column memory was learned from; with ``allocator`` the
            predictor adds the GPU runtime's own overhead (`figures.RUNTIME_OVERHEAD_BYTES`).
        label_ranges: smallest and largest training label per metric, so a prediction can
            tell when it extrapolates (empty in checkpoints written before they were kept).
        kubeseer_version: the kubeseer that trained it.
        notes: free text (data caveats, epoch caps).
        device_features: `kubeseer.predictor.device.FEATURES` for a device-aware checkpoint
            (it predicts step time for a named GPU or MIG profile from its specs), empty for
            one whose labels come from one device.
        runtime_context_bytes: the CUDA context a ``reserved`` memory label leaves out, which
            the predictor adds back (the labels' runtime's).
        sources: where the labels come from, one line per kind of label (said with every
            prediction).
        step_time_gpus: hardware-table keys of the GPUs with step-time labels.
        unseen_gpu_margins: per step-time metric, the log margin a bound adds on a GPU outside
            `step_time_gpus` (`step_calibration`), measured by leaving each labelled GPU out
            in turn; empty: such a GPU gets the margins of the labelled ones.
        prior_rules: how the analytic memory prior the memory heads correct was read
            (`analytic_memory.Rules`); served with the same rules. Checkpoints written before
            the choice existed learned against ``written``.
    """

    model_config: ModelConfig
    state_dict: Mapping[str, torch.Tensor]
    normaliser: normalise.Normaliser
    calibration: calibration.Calibration
    label_device: str
    label_device_name: str
    label_source: str
    train_optimizers: tuple[str, ...]
    data_digest: str
    evaluations: tuple[report.EvaluationTable, ...] = ()
    train_config: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = schema.SCHEMA_VERSION
    node_features: tuple[str, ...] = schema.NODE_FEATURES
    edge_features: tuple[str, ...] = schema.EDGE_FEATURES
    global_features: tuple[str, ...] = schema.GLOBAL_FEATURES + targets.EXTRA_GLOBAL_FEATURES
    target_definitions: Mapping[str, str] = field(
        default_factory=lambda: dict(targets.TARGET_DEFINITIONS)
    )
    memory_label: targets.MemoryLabel = targets.MemoryLabel.DEVICE
    label_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    kubeseer_version: str = ""
    notes: str = ""
    device_features: tuple[str, ...] = ()
    runtime_context_bytes: int = 0
    sources: tuple[str, ...] = ()
    step_time_gpus: tuple[str, ...] = ()
    prior_rules: analytic_memory.Rules = analytic_memory.DEFAULT_RULES
    unseen_gpu_margins: Mapping[str, float] = field(default_factory=dict)

    @property
    def device_aware(self) -> bool:
        """Whether the checkpoint predicts for a named GPU from its specs."""
        return bool(self.device_features)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The predicted metrics, in output column order."""
        return self.normaliser.metrics

    @property
    def label_device_kind(self) -> str:
        """The kind of device the labels were measured on: "cpu" or "cuda"."""
        return self.label_device.split("-", 1)[0]

    @property
    def memory_counts_batch(self) -> bool:
        """Whether the memory labels include the input batch (`targets.memory_counts_batch`)."""
        return targets.memory_counts_batch(
            self.memory_label, self.label_device_kind, self.label_source
        )

    def step_calibration(self, gpu: str | None) -> _Calibration:
        """The margins for a prediction whose step time is for `gpu` (a hardware-table key;
        None for a checkpoint that predicts for no named GPU).

        The split-conformal margins hold for GPUs whose step times the calibration samples
        were measured on. A GPU outside `step_time_gpus` is a shift the calibration never saw:
        its own clocks, power limit and memory make it faster or slower than its specs say, by
        an amount the specs do not tell. Its step-time margins are widened by
        `unseen_gpu_margins`; memory is the same tensors on every GPU and keeps its margin.
        """
        if gpu is None or gpu in self.step_time_gpus or not self.unseen_gpu_margins:
            return self.calibration
        widened = self.calibration
        for metric, extra in self.unseen_gpu_margins.items():
            if metric in widened.metrics:
                widened = widened.raised(metric, extra)
        return widened

    def model(self) -> nn.Module:
        """The model with its trained weights, in eval mode."""
        model = self.model_config.build()
        try:
            model.load_state_dict(dict(self.state_dict))
        except RuntimeError as e:
            raise CheckpointError(f"weights do not fit the stored model shape: {e}") from e
        model.eval()
        return model

    def to_dict(self) -> dict[str, Any]:
        """The plain dict that is saved."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model_config": vars(self.model_config).copy(),
            "state_dict": {k: v.detach().cpu() for k, v in self.state_dict.items()},
            "normaliser": self.normaliser.to_dict(),
            "calibration": self.calibration.to_dict(),
            "label_device": self.label_device,
            "label_device_name": self.label_device_name,
            "label_source": self.label_source,
            "train_optimizers": list(self.train_optimizers),
            "data_digest": self.data_digest,
            "evaluations": [t.to_dict() for t in self.evaluations],
            "train_config": dict(self.train_config),
            "schema_version": self.schema_version,
            "node_features": list(self.node_features),
            "edge_features": list(self.edge_features),
            "global_features": list(self.global_features),
            "target_definitions": dict(self.target_definitions),
            "memory_label": self.memory_label.value,
            "label_ranges": {m: list(r) for m, r in self.label_ranges.items()},
            "kubeseer_version": self.kubeseer_version,
            "notes": self.notes,
            "device_features": list(self.device_features),
            "runtime_context_bytes": self.runtime_context_bytes,
            "sources": list(self.sources),
            "step_time_gpus": list(self.step_time_gpus),
            "prior_rules": self.prior_rules.value,
            "unseen_gpu_margins": dict(self.unseen_gpu_margins),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Checkpoint:
        """Rebuild from `to_dict` output, checking format and feature schema."""
        if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(
                f"not a {FORMAT} v{FORMAT_VERSION} checkpoint (format {data.get('format')!r}, "
                f"version {data.get('format_version')!r})"
            )
        expected = (
            schema.SCHEMA_VERSION,
            list(schema.NODE_FEATURES),
            list(schema.EDGE_FEATURES),
            list(schema.GLOBAL_FEATURES + targets.EXTRA_GLOBAL_FEATURES),
        )
        found = (
            data.get("schema_version"),
            data.get("node_features"),
            data.get("edge_features"),
            data.get("global_features"),
        )
        stored_device = tuple(data.get("device_features", ()))
        if stored_device and stored_device != device.FEATURES:
            raise SchemaMismatchError(
                f"checkpoint reads device features {list(stored_device)}, this kubeseer makes "
                f"{list(device.FEATURES)}; retrain it with `kubeseer train` or use a matching "
                "kubeseer"
            )
        if found != expected:
            raise SchemaMismatchError(
                f"checkpoint was trained on PerfGraph feature schema v{found[0]}, this kubeseer "
                f"extracts v{expected[0]}"
                + (" (same version, different columns)" if found[0] == expected[0] else "")
                + "; retrain it with `kubeseer train` or use a matching kubeseer"
            )
        try:
            return cls(
                model_config=ModelConfig(
                    **{
                        **data["model_config"],
                        "device_tasks": tuple(data["model_config"].get("device_tasks", ())),
                    }
                ),
                state_dict=dict(data["state_dict"]),
                normaliser=normalise.Normaliser.from_dict(data["normaliser"]),
                calibration=calibration.Calibration.from_dict(data["calibration"]),
                label_device=str(data["label_device"]),
                label_device_name=str(data["label_device_name"]),
                label_source=str(data["label_source"]),
                train_optimizers=tuple(str(o) for o in data["train_optimizers"]),
                data_digest=str(data["data_digest"]),
                evaluations=tuple(report.EvaluationTable.from_dict(t) for t in data["evaluations"]),
                train_config=dict(data["train_config"]),
                schema_version=int(data["schema_version"]),
                node_features=tuple(data["node_features"]),
                edge_features=tuple(data["edge_features"]),
                global_features=tuple(data["global_features"]),
                target_definitions=dict(data["target_definitions"]),
                # Checkpoints written before the choice existed learned the device label.
                memory_label=targets.MemoryLabel(data.get("memory_label", "device")),
                label_ranges={
                    str(m): (float(lo), float(hi))
                    for m, (lo, hi) in data.get("label_ranges", {}).items()
                },
                kubeseer_version=str(data["kubeseer_version"]),
                notes=str(data["notes"]),
                device_features=stored_device,
                runtime_context_bytes=int(data.get("runtime_context_bytes", 0)),
                sources=tuple(str(line) for line in data.get("sources", ())),
                step_time_gpus=tuple(str(g) for g in data.get("step_time_gpus", ())),
                prior_rules=analytic_memory.Rules(data.get("prior_rules", "written")),
                unseen_gpu_margins={
                    str(m): float(v) for m, v in data.get("unseen_gpu_margins", {}).items()
                },
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint is missing or mangles a field: {e}") from e


def fingerprint(checkpoint: Checkpoint) -> str:
    """sha256 of everything a checkpoint holds: its weights, normalisation, margins, provenance.

    Two checkpoints with the same fingerprint give the same prediction for the same request, so
    the prediction cache keys on it (`kubeseer.predictor.cache.Key.checkpoint`).
    """
    data = checkpoint.to_dict()
    digest = hashlib.sha256()
    for name, tensor in sorted(data.pop("state_dict").items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    digest.update(json.dumps(data, sort_keys=True).encode())
    return digest.hexdigest()


def save(checkpoint: Checkpoint, path: str | os.PathLike[str]) -> Path:
    """Write `checkpoint` to `path` (parent directories created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint.to_dict(), target)
    return target


def load(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint safely (``weights_only=True``).

    Raises:
        CheckpointError: missing, unreadable or not a kubeseer checkpoint.
        SchemaMismatchError: trained on another feature schema.
    """
    try:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"no checkpoint at {path}") from e
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path} is not a readable checkpoint: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, not a checkpoint dict")
    return Checkpoint.from_dict(data)
