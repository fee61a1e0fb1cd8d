"""Feature standardisation and target normalisation, fitted on training data only.

Features: PerfGraph features are already log1p-compressed by `perfgraph.to_pyg`; each column
of ``x``, ``edge_attr`` and ``u`` is then standardised with the training set's mean and
standard deviation (constant columns keep scale 1), so no single feature dominates the first
linear layers.

Targets: labels span orders of magnitude (a 1 MiB MLP and a 20 GiB ViT; 50 us and 5 s steps)
and the evaluation is relative (MAPE), so each metric is modelled as
``(log(y) - mean) / std`` with mean and std of ``log(y)`` over the training labels that exist.
Minimising MSE in that space minimises squared relative error to first order; decoding is
``exp(z * std + mean)``. With a prior (`prior`: the analytic memory estimate), a memory metric
is modelled as ``(log(y) - log(prior) - mean) / std`` over the samples' ``prior_log`` and
decoded as ``prior * exp(z * std + mean)``: the network learns the correction to the physics.
A step-time prior works the same way with `cost_model.StepCostModel`'s estimate, which the
normaliser fits on the training split and keeps (it is part of the encoding).

Ablations that switch feature groups off zero the group's columns after standardisation (a
constant carries no information), keeping every tensor shape unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

from kubeseer.predictor import cost_model, schema, targets

# PerfSeer's feature groups (section 3.1, Table 1), by schema column name, for the ablations.
FEATURE_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "node.hp": ("x", schema.NODE_FEATURES[: schema.NODE_FEATURES.index("flops")]),
    "node.c": ("x", ("flops",)),
    "node.m": ("x", ("mac_bytes", "weight_bytes")),
    "node.a": ("x", ("arithmetic_intensity",)),
    "node.p": ("x", ("flops_share", "mac_share", "weight_share")),
    "edge.sz": ("edge_attr", ("tensor_bytes",)),
    "edge.sp": ("edge_attr", ("batch", "channels", "height", "width")),
    "global.gp": ("u", ("num_nodes", "num_edges", "density")),
    "global.c": ("u", tuple(n for n in schema.GLOBAL_FEATURES if n.startswith("flops_"))),
    "global.m": (
        "u",
        tuple(n for n in schema.GLOBAL_FEATURES if n.startswith(("mac_", "weight_", "edge_"))),
    ),
    "global.a": ("u", ("arithmetic_intensity",)),
    "global.b": ("u", ("batch_size",)),
}

_COLUMNS: dict[str, tuple[str, ...]] = {
    "x": schema.NODE_FEATURES,
    "edge_attr": schema.EDGE_FEATURES,
    "u": schema.GLOBAL_FEATURES,
}


def dropped_columns(groups: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Column indices of ``x``, ``edge_attr`` and ``u`` that switching `groups` off zeroes."""
    dropped: dict[str, list[int]] = {"x": [], "edge_attr": [], "u": []}
    for group in groups:
        if group not in FEATURE_GROUPS:
            raise ValueError(f"unknown feature group {group!r}; expected {sorted(FEATURE_GROUPS)}")
        where, names = FEATURE_GROUPS[group]
        dropped[where] += [_COLUMNS[where].index(n) for n in names]
    return {k: tuple(sorted(set(v))) for k, v in dropped.items()}


# Labels are strictly positive physical quantities; the floor only guards log() against a
# utilisation of exactly 0.
_LOG_FLOOR = 1e-12


@dataclass(frozen=True)
class Standardiser:
    """Column-wise ``(value - mean) / std``; columns in `dropped` become 0."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    dropped: tuple[int, ...] = ()

    @classmethod
    def fit(cls, values: Tensor, dropped: Sequence[int] = ()) -> Standardiser:
        """Mean and std of each column of `values` (rows are observations)."""
        if values.dim() != 2 or values.size(0) == 0:
            raise ValueError(f"need a non-empty (rows, columns) tensor, got {tuple(values.shape)}")
        values = values.double()
        std = values.std(dim=0, unbiased=False)
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        for column in dropped:
            if not 0 <= column < values.size(1):
                raise ValueError(f"dropped column {column} outside 0..{values.size(1) - 1}")
        return cls(
            tuple(values.mean(dim=0).tolist()), tuple(std.tolist()), tuple(sorted(set(dropped)))
        )

    @functools.cached_property
    def _tensors(self) -> tuple[Tensor, Tensor]:
        """Mean and std as float32 tensors, built once (prediction calls this per graph)."""
        return torch.tensor(self.mean), torch.tensor(self.std)

    def __call__(self, values: Tensor) -> Tensor:
        if values.size(-1) != len(self.mean):
            raise ValueError(f"expected {len(self.mean)} columns, got {values.size(-1)}")
        mean, std = self._tensors
        out = (values - mean.to(values)) / std.to(values)
        if self.dropped:
            out[..., list(self.dropped)] = 0.0
        return out


@dataclass(frozen=True)
class Normaliser:
    """Everything needed to turn raw samples into model inputs and outputs back into labels.

    Args:
        metrics: target metric names, in the column order of ``y``.
        x, edge_attr, u: standardisers of node, edge and global features.
        target_mean, target_std: mean and std of ``log(y)`` (less the log prior, for
            `prior_metrics`) per metric.
        prior_metrics: metrics learned relative to a prior; their encoding and decoding need
            the batch's `log_priors`.
        step_costs: the step-time prior of the step metrics in `prior_metrics`.
        device: standardiser of the samples' ``device_x`` (a device-aware model's GPU specs,
            `kubeseer.predictor.device`), None for a model that reads no device.
        device_range: the smallest and the largest ``device_x`` (per column) of the training
            samples with a step-time label. The step heads learned nothing outside that box,
            and a network extrapolates its correction badly there (an RTX 3090 left out of
            training: 41 % inference MAPE, its bound covering 8 %; 13.7 % and 93 % when held
            at the edge), so `features` holds a device outside it at the box's edge: the
            correction of the nearest GPU seen, while the step prior's device law carries the
            rest of the difference in specs, as a tree ensemble extrapolates. None: no clamp
            (a checkpoint from before it).
    """

    metrics: tuple[str, ...]
    x: Standardiser
    edge_attr: Standardiser
    u: Standardiser
    target_mean: tuple[float, ...]
    target_std: tuple[float, ...]
    prior_metrics: tuple[str, ...] = ()
    step_costs: cost_model.StepCostModel | None = None
    device: Standardiser | None = None
    device_range: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @classmethod
    def fit(
        cls,
        samples: Sequence[Data],
        metrics: Sequence[str],
        *,
        drop_x: Sequence[int] = (),
        drop_edge_attr: Sequence[int] = (),
        drop_u: Sequence[int] = (),
        prior: bool = False,
        step_prior: bool = False,
    ) -> Normaliser:
        """Fit on training samples; a metric with no label at all is an error.

        With `prior`, the memory metrics are learned relative to each sample's ``prior_log``
        (`kubeseer.predictor.prior`), which every sample must then carry. With `step_prior`,
        the step metrics are learned relative to a `cost_model.StepCostModel` fitted here on
        the samples' ``cost_terms``; a mode with too few labels for the fit keeps no prior.
        """
        if not samples:
            raise ValueError("cannot fit a normaliser on no samples")
        memory_metrics = tuple(
            m for m in metrics if prior and targets.split_metric(m)[1] == "memory_bytes"
        )
        if memory_metrics and any(getattr(s, "prior_log", None) is None for s in samples):
            raise ValueError("a memory prior needs every sample to carry prior_log")
        step_costs = cost_model.fit_samples(samples, metrics) if step_prior else None
        if step_costs is not None and not step_costs.seconds_per_unit:
            step_costs = None
        step_metrics = tuple(
            m
            for m in metrics
            if step_costs is not None
            and targets.split_metric(m)[1] == "step_time_s"
            and targets.split_metric(m)[0] in step_costs.seconds_per_unit
        )
        prior_metrics = tuple(m for m in metrics if m in memory_metrics + step_metrics)
        x = torch.cat([s.x for s in samples])
        edges = [s.edge_attr for s in samples if s.edge_attr.size(0) > 0]
        edge_attr = torch.cat(edges) if edges else torch.zeros(1, samples[0].edge_attr.size(1))
        u = torch.cat([s.u for s in samples])
        y = torch.cat([s.y for s in samples]).double()
        mask = torch.cat([s.y_mask for s in samples])
        if y.size(1) != len(metrics):
            raise ValueError(f"samples carry {y.size(1)} targets but {len(metrics)} metrics given")
        device_rows = [getattr(s, "device_x", None) for s in samples]
        devices = [d for d in device_rows if d is not None]
        if devices and len(devices) != len(device_rows):
            raise ValueError("either every sample carries device_x or none does")
        unfitted = cls(
            metrics=tuple(metrics),
            x=Standardiser.fit(x, drop_x),
            edge_attr=Standardiser.fit(edge_attr, drop_edge_attr),
            u=Standardiser.fit(u, drop_u),
            target_mean=(0.0,) * len(metrics),
            target_std=(1.0,) * len(metrics),
            prior_metrics=prior_metrics,
            step_costs=step_costs,
            device=Standardiser.fit(torch.cat(devices)) if devices else None,
            device_range=_timed_device_range(samples, metrics),
        )
        carried = torch.cat([s.prior_log for s in samples]).double() if memory_metrics else None
        work = torch.cat([s.cost_terms for s in samples]) if step_costs is not None else None
        offset = unfitted._offset(unfitted._log_priors(carried, work, len(samples)), y)
        means, stds = [], []
        for k, name in enumerate(metrics):
            present = y[mask[:, k], k]
            if present.numel() == 0:
                raise ValueError(f"no training sample has a label for {name}")
            logs = present.clamp_min(_LOG_FLOOR).log()
            if isinstance(offset, Tensor):
                logs = logs - offset[mask[:, k], k]
            std = float(logs.std(unbiased=False)) if logs.numel() > 1 else 0.0
            means.append(float(logs.mean()))
            stds.append(std if std > 1e-12 else 1.0)
        return dataclasses.replace(unfitted, target_mean=tuple(means), target_std=tuple(stds))

    def for_fine_tuning(self, metrics: Sequence[str], samples: Sequence[Data]) -> Normaliser:
        """This normaliser narrowed to `metrics`, for fine-tuning on `samples` of another device.

        The feature scales and target statistics stay, so the inputs and outputs keep the
        meaning the network learned. The step-time cost model is fitted again on `samples`
        for each mode with `cost_model.MIN_SAMPLES` labels: what a unit of work costs in
        seconds belongs to the device, and the heads learned the correction to a cost model,
        not to another device's seconds. A device-aware cost model (`DEVICE_TERMS`) keeps its
        fit for a mode with fewer new labels: its coefficients are efficiencies against the
        specs of whichever GPU a row names, so they already speak for the new one (a short
        plan's few step times on a new GPU product are enough to fine-tune on).
        The memory prior is per sample (the analytic estimate for the samples' own device) and
        needs nothing.

        Raises:
            ValueError: a metric this normaliser does not know, or, for a device-free cost
                model, too few step-time labels in `samples` to refit the prior of a step
                metric learned relative to one.
        """
        unknown = [m for m in metrics if m not in self.metrics]
        if unknown or not metrics:
            raise ValueError(
                f"fine-tuning needs metrics among {', '.join(self.metrics)}; got "
                f"{', '.join(metrics) or 'none'}"
            )
        index = [self.metrics.index(m) for m in metrics]
        step_metrics = [
            m
            for m in metrics
            if m in self.prior_metrics and targets.split_metric(m)[1] == "step_time_s"
        ]
        step_costs = None
        if step_metrics:
            refitted = cost_model.fit_samples(samples, metrics)
            coefficients = dict(refitted.seconds_per_unit)
            carried = self.step_costs
            if carried is not None and carried.terms == refitted.terms == cost_model.DEVICE_TERMS:
                # On a named device the coefficients are efficiencies against each GPU's peaks
                # and bandwidth, fitted on other GPUs and read through the new one's specs: a
                # mode with too few new labels to refit keeps them, as zero-shot serving does.
                for mode, kept in carried.seconds_per_unit.items():
                    coefficients.setdefault(mode, kept)
            missing = [m for m in step_metrics if targets.split_metric(m)[0] not in coefficients]
            if missing:
                raise ValueError(f"too few labels to refit the step-time prior of {missing}")
            step_costs = cost_model.StepCostModel(coefficients, refitted.terms)
        return dataclasses.replace(
            self,
            metrics=tuple(metrics),
            target_mean=tuple(self.target_mean[k] for k in index),
            target_std=tuple(self.target_std[k] for k in index),
            prior_metrics=tuple(m for m in metrics if m in self.prior_metrics),
            step_costs=step_costs,
            device_range=_union(self.device_range, _timed_device_range(samples, metrics)),
        )

    @functools.cached_property
    def _device_bounds(self) -> tuple[Tensor, Tensor] | None:
        if self.device_range is None:
            return None
        low, high = self.device_range
        return torch.tensor(low), torch.tensor(high)

    def features(self, batch: Batch) -> Batch:
        """A shallow copy of `batch` with standardised ``x``, ``edge_attr`` and ``u``."""
        out = copy.copy(batch)
        out.x = self.x(batch.x.float())
        out.edge_attr = self.edge_attr(batch.edge_attr.float())
        out.u = self.u(batch.u.float())
        if self.device is not None:
            device_x = getattr(batch, "device_x", None)
            if device_x is None:
                raise ValueError("this model reads the device: the sample needs device_x")
            device_x = device_x.float()
            if self._device_bounds is not None:
                device_x = device_x.clamp(*self._device_bounds)
            out.device_x = self.device(device_x)
        return out

    @functools.cached_property
    def _target_tensors(self) -> tuple[Tensor, Tensor]:
        return (
            torch.tensor(self.target_mean, dtype=torch.float64),
            torch.tensor(self.target_std, dtype=torch.float64),
        )

    def _stats(self, like: Tensor) -> tuple[Tensor, Tensor]:
        mean, std = self._target_tensors
        return mean.to(like), std.to(like)

    @property
    def memory_prior(self) -> bool:
        """Whether memory metrics are learned relative to the samples' ``prior_log``."""
        return any(targets.split_metric(m)[1] == "memory_bytes" for m in self.prior_metrics)

    def log_priors(self, batch: Batch | Data) -> Tensor | None:
        """The log prior of each (sample, `targets.METRICS` entry) of `batch`, ``(B, 6)``.

        Memory columns come from the samples' ``prior_log`` (required with a memory prior, 0
        without one), step columns from `step_costs` on their ``cost_terms``; None when no
        metric has a prior.
        """
        size = int(batch.num_graphs) if isinstance(batch, Batch) else 1
        return self._log_priors(
            getattr(batch, "prior_log", None), getattr(batch, "cost_terms", None), size
        )

    def _log_priors(self, carried: Tensor | None, work: Tensor | None, size: int) -> Tensor | None:
        if not self.prior_metrics:
            return None
        if carried is None:
            if self.memory_prior:
                raise ValueError("memory metrics are learned relative to the samples' prior_log")
            carried = torch.zeros(size, len(targets.METRICS), dtype=torch.float64)
        if self.step_costs is None:
            return carried
        if work is None:
            raise ValueError("a step-time prior needs the samples' cost_terms")
        out = carried.double().clone()
        for name in self.prior_metrics:
            mode, quantity = targets.split_metric(name)
            if quantity == "step_time_s":
                estimate = self.step_costs.log_estimate(mode, work)
                if estimate is not None:
                    out[:, targets.METRICS.index(name)] = estimate
        return out

    def _offset(self, prior_log: Tensor | None, like: Tensor) -> Tensor | float:
        """The log prior of each (sample, metric), 0 where a metric has none.

        `prior_log` has a column per `targets.METRICS` entry (`log_priors`).
        """
        if not self.prior_metrics:
            return 0.0
        if prior_log is None:
            raise self._missing_prior()
        if prior_log.size(-1) != len(targets.METRICS):
            raise ValueError(f"prior_log needs {len(targets.METRICS)} columns (targets.METRICS)")
        offset = torch.zeros(prior_log.size(0), len(self.metrics), dtype=like.dtype)
        for k, name in enumerate(self.metrics):
            if name in self.prior_metrics:
                offset[:, k] = prior_log[:, targets.METRICS.index(name)]
        return offset

    def _missing_prior(self) -> ValueError:
        return ValueError(f"{', '.join(self.prior_metrics)} are learned relative to a prior")

    @functools.cached_property
    def _memory_prior_columns(self) -> tuple[list[int], list[int]]:
        """Output columns of the memory metrics learned relative to the analytic estimate, and
        the `targets.METRICS` columns of ``prior_log`` their estimates sit in."""
        names = [
            name
            for name in self.metrics
            if name in self.prior_metrics and targets.split_metric(name)[1] == "memory_bytes"
        ]
        return [self.metrics.index(n) for n in names], [targets.METRICS.index(n) for n in names]

    def at_least_memory_prior(self, decoded: Tensor, prior_log: Tensor | None) -> Tensor:
        """`decoded` ``(B, T)`` with each memory metric learned relative to the analytic
        estimate raised to that estimate where the learned correction would lower it.

        The correction may raise memory, not lower it. The estimate counts the tensors a step
        must hold, and leans to the safe side where the graph cannot tell (a BatchNorm folded
        into every convolution); a correction below it is learned from families where the
        rules lean over, and applied to a graph where they do not, it runs the job out of
        memory, where one above only costs a larger slice. Measured: this rule lowered the
        error on training and inference memory on both the random split and held-out families
        (docs/accuracy.md).
        """
        columns, sources = self._memory_prior_columns
        if not columns:
            return decoded
        if prior_log is None:
            raise self._missing_prior()
        out = decoded.clone()
        floor = torch.exp(prior_log[:, sources].to(decoded.dtype))
        out[:, columns] = torch.maximum(decoded[:, columns], floor)
        return out

    def encode_targets(self, y: Tensor, prior_log: Tensor | None = None) -> Tensor:
        """Labels ``(B, T)`` -> normalised targets (missing labels become meaningless numbers)."""
        mean, std = self._stats(y)
        return (y.clamp_min(_LOG_FLOOR).log() - self._offset(prior_log, y) - mean) / std

    def decode_targets(self, z: Tensor, prior_log: Tensor | None = None) -> Tensor:
        """Normalised predictions ``(B, T)`` -> labels in metric units."""
        mean, std = self._stats(z)
        return torch.exp(z * std + mean + self._offset(prior_log, z))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers only, so a checkpoint loads with ``weights_only=True``."""
        return {
            "metrics": list(self.metrics),
            "x": _standardiser_dict(self.x),
            "edge_attr": _standardiser_dict(self.edge_attr),
            "u": _standardiser_dict(self.u),
            "target_mean": list(self.target_mean),
            "target_std": list(self.target_std),
            "prior_metrics": list(self.prior_metrics),
            "step_costs": None if self.step_costs is None else self.step_costs.to_dict(),
            "device": None if self.device is None else _standardiser_dict(self.device),
            "device_range": None
            if self.device_range is None
            else [list(self.device_range[0]), list(self.device_range[1])],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Normaliser:
        """Inverse of `to_dict`."""
        try:
            normaliser = cls(
                metrics=tuple(data["metrics"]),
                x=Standardiser(**_standardiser_args(data["x"])),
                edge_attr=Standardiser(**_standardiser_args(data["edge_attr"])),
                u=Standardiser(**_standardiser_args(data["u"])),
                target_mean=tuple(float(v) for v in data["target_mean"]),
                target_std=tuple(float(v) for v in data["target_std"]),
                prior_metrics=tuple(str(m) for m in data.get("prior_metrics", ())),
                step_costs=(
                    None
                    if data.get("step_costs") is None
                    else cost_model.StepCostModel.from_dict(data["step_costs"])
                ),
                device=(
                    None
                    if data.get("device") is None
                    else Standardiser(**_standardiser_args(data["device"]))
                ),
                device_range=(
                    None
                    if data.get("device_range") is None
                    else (
                        tuple(float(v) for v in data["device_range"][0]),
                        tuple(float(v) for v in data["device_range"][1]),
                    )
                ),
            )
        except (KeyError, TypeError, cost_model.CostModelError) as e:
            raise ValueError(f"not a normaliser: {e}") from e
        if not all(math.isfinite(v) for v in normaliser.target_mean + normaliser.target_std):
            raise ValueError("normaliser holds non-finite target statistics")
        return normaliser


def _timed_device_range(
    samples: Sequence[Data], metrics: Sequence[str]
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Per-column min and max of ``device_x`` over the samples with a step-time label (None
    when none carries both)."""
    carrying = [s for s in samples if getattr(s, "device_x", None) is not None]
    if not carrying:
        return None
    columns = [k for k, m in enumerate(metrics) if targets.split_metric(m)[1] == "step_time_s"]
    timed = [s.device_x for s in carrying if bool(s.y_mask[0, columns].any())] if columns else []
    if not timed:
        return None
    rows = torch.cat(timed).double()
    return tuple(rows.min(dim=0).values.tolist()), tuple(rows.max(dim=0).values.tolist())


def _union(
    a: tuple[tuple[float, ...], tuple[float, ...]] | None,
    b: tuple[tuple[float, ...], tuple[float, ...]] | None,
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The smallest box holding both device ranges."""
    if a is None or b is None:
        return a or b
    return (
        tuple(map(min, a[0], b[0])),
        tuple(map(max, a[1], b[1])),
    )


def _standardiser_dict(s: Standardiser) -> dict[str, list[float] | list[int]]:
    return {k: list(v) for k, v in dataclasses.asdict(s).items()}


def _standardiser_args(data: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {
        "mean": tuple(float(v) for v in data["mean"]),
        "std": tuple(float(v) for v in data["std"]),
        "dropped": tuple(int(v) for v in data.get("dropped", ())),
    }
