"""The training loop shared by SeerNet, SeerNet-Multi and every baseline.

Paper settings by default (PerfSeer section 4.1): Adam at 1e-3, batches of 128 graphs, the
learning rate halved after 5 epochs without validation improvement down to 1e-6, at most 500
epochs, MSE on normalised targets (`normalise`: log, then standardised). Training stops early
when validation has not improved for `TrainConfig.patience` epochs, and the weights of the
best validation epoch are restored.

Validation is judged by mean MAPE over the metrics in label units, the quantity the
evaluation reports, rather than by the loss in normalised space.

Labels may be missing per sample (a configuration measured only in inference mode): the loss
of a task is the mean over the samples that carry its label, and a task with no label in a
batch contributes nothing. With PCGrad (`pcgrad`), the per-task losses are differentiated
separately and their gradients de-conflicted before the optimizer step.

`fit` works for any `torch.nn.Module` whose ``forward(batch)`` returns ``(B, T)`` predictions
in normalised target space.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn
from torch_geometric.data import Data

import kubeseer
from kubeseer.predictor import (
    calibration,
    checkpoint,
    conformal,
    dataset,
    device,
    evaluate,
    inference,
    normalise,
    pcgrad,
    seernet,
    splits,
    targets,
)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; defaults are the paper's, `patience` and `time_limit_s` ours."""

    lr: float = 1e-3
    batch_size: int = 128
    lr_factor: float = 0.5
    lr_patience: int = 5
    min_lr: float = 1e-6
    max_epochs: int = 500
    patience: int = 30
    pcgrad: bool = True
    seed: int = 0
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.min_lr <= 0 or not 0 < self.lr_factor < 1:
            raise ValueError("lr and min_lr must be positive and lr_factor in (0, 1)")
        if self.batch_size < 1 or self.max_epochs < 1 or self.patience < 1:
            raise ValueError("batch_size, max_epochs and patience must be at least 1")


@dataclass(frozen=True)
class EpochLog:
    """What one epoch did."""

    epoch: int
    train_loss: float
    val_mape: float
    lr: float
    seconds: float


@dataclass
class TrainResult:
    """A trained model with everything needed to use it on raw samples."""

    model: nn.Module
    normaliser: normalise.Normaliser
    metrics: tuple[str, ...]
    config: TrainConfig
    history: list[EpochLog] = field(default_factory=list)
    best_epoch: int = 0
    best_val_mape: float = math.inf
    seconds: float = 0.0

    def predict(self, samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        """Predictions ``(N, T)`` in label units."""
        return inference.predict(self.model, self.normaliser, samples)


EpochCallback = Callable[[EpochLog], None]


def masked_task_losses(
    prediction: Tensor, target: Tensor, mask: Tensor, censor: Tensor | None = None
) -> list[Tensor]:
    """Per-task MSE over the samples that carry the task's label; tasks without any are skipped.

    With `censor` ``(B, T)``, a label may be a bound rather than a value: +1 says the truth is
    above it (a job that ran out of memory on a card of that size), -1 that it is at most it (a
    job that ran). A bound costs nothing while the prediction is on its side and the squared
    distance to it once it is not (a one-sided squared error: Tobit-like, without a noise
    model); 0 is an exact label. Targets are normalised monotonically, so a bound on the label
    is a bound on the target.

    Returns one scalar per task that has at least one label in the batch.
    """
    residual = prediction - target
    if censor is not None:
        residual = torch.where(censor > 0, residual.clamp(max=0.0), residual)
        residual = torch.where(censor < 0, residual.clamp(min=0.0), residual)
    losses = []
    for k in range(prediction.size(1)):
        present = mask[:, k]
        if present.any():
            losses.append((residual[present, k] ** 2).mean())
    return losses


def _with_censor(samples: Sequence[Data], metrics: Sequence[str]) -> list[Data]:
    """`samples` each carrying ``y_censor`` (exact labels: zeros), so that any mix collates."""
    for sample in samples:
        if getattr(sample, "y_censor", None) is None:
            sample.y_censor = torch.zeros(1, len(metrics), dtype=torch.int8)
    return list(samples)


def _val_mape(
    model: nn.Module,
    normaliser: normalise.Normaliser,
    prepared_val: Sequence[Data],
    true: npt.NDArray[np.float64],
    mask: npt.NDArray[np.bool_],
) -> float:
    predicted = inference.predict(model, normaliser, prepared_val, prepared=True)
    per_task = [
        float(evaluate.relative_errors(predicted[mask[:, k], k], true[mask[:, k], k]).mean())
        for k in range(true.shape[1])
        if mask[:, k].any()
    ]
    return 100 * float(np.mean(per_task))


def fit(
    model: nn.Module,
    train_set: Sequence[Data],
    val_set: Sequence[Data],
    config: TrainConfig,
    *,
    metrics: Sequence[str],
    normaliser: normalise.Normaliser | None = None,
    on_epoch: EpochCallback | None = None,
    censored: Sequence[Data] = (),
) -> TrainResult:
    """Train `model` on `train_set`, early-stopping on `val_set`; returns the best epoch's model.

    Args:
        model: predicts normalised targets ``(B, T)`` from a `Batch`; trained in place.
        train_set, val_set: samples (see docs/internals.md) with ``y``/``y_mask`` of width T.
        config: optimisation settings.
        metrics: the T metric names, in ``y`` column order.
        normaliser: fitted on `train_set` when not given.
        on_epoch: called after every epoch (progress display).
        censored: more training samples whose labels are bounds (``y_censor``, see
            `masked_task_losses`): trained on beside `train_set`, never fitted on by the
            normaliser (a bound is not a label's value) and never validated on.
    """
    if not train_set or not val_set:
        raise ValueError("training needs non-empty training and validation sets")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    normaliser = normaliser or normalise.Normaliser.fit(train_set, metrics)
    train_prepared = inference.prepare(train_set, normaliser)
    if censored:
        train_prepared = _with_censor(
            [*train_prepared, *inference.prepare(censored, normaliser)], metrics
        )
    val_prepared = inference.prepare(val_set, normaliser)
    val_true, val_mask = evaluate.labels(val_set)

    trained = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.Adam(trained, lr=config.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimiser, factor=config.lr_factor, patience=config.lr_patience, min_lr=config.min_lr
    )
    surgery = pcgrad.PCGrad(trained, generator) if config.pcgrad and len(metrics) > 1 else None
    result = TrainResult(model, normaliser, tuple(metrics), config)
    best_state = copy.deepcopy(model.state_dict())
    started = time.monotonic()
    for epoch in range(1, config.max_epochs + 1):
        epoch_started = time.monotonic()
        model.train()
        losses = []
        for batch in inference.batches(train_prepared, config.batch_size, generator):
            target = normaliser.encode_targets(batch.y.float(), normaliser.log_priors(batch))
            task_losses = masked_task_losses(
                model(batch), target, batch.y_mask.bool(), getattr(batch, "y_censor", None)
            )
            if not task_losses:
                continue
            optimiser.zero_grad(set_to_none=True)
            if surgery is not None:
                surgery.backward(task_losses)
            else:
                torch.autograd.backward(torch.stack(task_losses).sum())
            optimiser.step()
            losses.append(float(torch.stack(task_losses).mean().detach()))
        val_mape = _val_mape(model, normaliser, val_prepared, val_true, val_mask)
        scheduler.step(val_mape)
        log = EpochLog(
            epoch=epoch,
            train_loss=float(np.mean(losses)) if losses else math.nan,
            val_mape=val_mape,
            lr=float(optimiser.param_groups[0]["lr"]),
            seconds=time.monotonic() - epoch_started,
        )
        result.history.append(log)
        if on_epoch is not None:
            on_epoch(log)
        if val_mape < result.best_val_mape:
            result.best_val_mape = val_mape
            result.best_epoch = epoch
            best_state = copy.deepcopy(model.state_dict())
        if epoch - result.best_epoch >= config.patience:
            break
        if config.time_limit_s is not None and time.monotonic() - started > config.time_limit_s:
            break
    model.load_state_dict(best_state)
    model.eval()
    result.seconds = time.monotonic() - started
    return result


@dataclass(frozen=True)
class Options:
    """Everything `kubeseer train` decides beyond the optimisation settings.

    `device_heads`: on device-aware samples, the step-time heads also read the GPU's specs
    (held at the edge of the step-labelled GPUs', `Normaliser.device_range`). Off, the device
    reaches step time only through the step prior's device law, so the learned correction is
    one per graph: as good on a GPU left out, worse on the GPUs seen (docs/accuracy.md,
    "Twentieth session").

    `heads_only`: a fine-tune trains only the heads of the metrics its data labels, and keeps
    the base's block and every other head (`keep_heads`). A cluster's observations label
    memory and never step time; fine-tuning the whole network on them would move the block
    under the step-time heads, so those are dropped, and the checkpoint would stop predicting
    step time. With this option it predicts every metric the base did.
    """

    split: splits.SplitKind = splits.SplitKind.RANDOM
    held_out_family: str | None = None
    kind: str = "seernet_multi"
    hidden_channels: int = 256
    synmm: bool = True
    gnpb: bool = True
    drop_features: tuple[str, ...] = ()
    memory_prior: bool = False
    step_prior: bool = False
    device_heads: bool = True
    coverage: float = conformal.DEFAULT_COVERAGE
    notes: str = ""
    heads_only: bool = False


def train_checkpoint(
    samples: Sequence[Data],
    info: dataset.DatasetInfo,
    config: TrainConfig,
    options: Options,
    *,
    base: checkpoint.Checkpoint | None = None,
    on_epoch: EpochCallback | None = None,
    split: splits.Split | None = None,
    censored: Sequence[Data] = (),
) -> checkpoint.Checkpoint:
    """Split, train, calibrate on held-out data, evaluate on test, and package a checkpoint.

    With `base`, training starts from its weights and normalisation (a fine-tune on another
    device's labels, which may be few) and keeps its architecture, feature ablations and
    priors whatever `options` says of them: the weights only mean something with those.
    `split` replaces the one `options` describes (a benchmark's own: a GPU left out, folds of
    families). `censored` samples (labels that are bounds, `fit`; kept out of the split, since a
    bound can be neither validated, calibrated nor scored on) are trained on, but for those of
    configurations the split holds out for validation, calibration or test.

    A fine-tune's data may be too few to calibrate a metric at `options.coverage`: its split is
    then left as it is, its margin covers each calibration configuration it has, floored at the
    base's, and the checkpoint's notes say so (`_short_calibration`, `_at_least`).
    """
    metrics = info.metrics
    if base is not None:
        options = _inherited(options, base, metrics)
    if split is None:
        split = splits.make_split(
            samples, options.split, config.seed, options.held_out_family, info.training_only
        )
    short_ok = base is not None
    split = splits.ensure_calibration(
        split, metrics, conformal.minimum_calibration(options.coverage), short_ok=short_ok
    )
    held_out = {
        str(s.config_hash) for part in (split.val, split.calibration, split.test) for s in part
    }
    trained_censored = [c for c in censored if str(c.config_hash) not in held_out]
    if base is None:
        normaliser, model_config, model = fresh_start(split.train, metrics, options, config.seed)
    else:
        normaliser, model_config, model = start_from(
            base, split.train, metrics, heads_only=options.heads_only
        )
    result = fit(
        model,
        split.train,
        split.val,
        config,
        metrics=metrics,
        normaliser=normaliser,
        on_epoch=on_epoch,
        censored=trained_censored,
    )
    train_true, train_mask = evaluate.labels(split.train)
    label_ranges = {
        m: (
            float(train_true[train_mask[:, k], k].min()),
            float(train_true[train_mask[:, k], k].max()),
        )
        for k, m in enumerate(metrics)
        if train_mask[:, k].any()
    }
    provenance = _provenance_fields(info, base)
    bounds = calibrate_on_labels(
        result.predict,
        split.calibration,
        metrics,
        options.coverage,
        provenance["runtime_context_bytes"]
        if info.memory_label is targets.MemoryLabel.RESERVED
        else 0,
        short_covers_all=short_ok,
    )
    notes = options.notes
    if base is not None:
        short = _short_calibration(bounds, options.coverage)
        notes = " ".join([notes, *short.values()]).strip()
        floored = bounds.metrics if options.heads_only else tuple(short)
        bounds = _at_least(bounds, base.calibration, floored)
    label = (
        f"{options.kind}, {split.describe()}; labels: {info.device_name} "
        f"({info.device}, {info.label_source})"
    )
    table = evaluate.evaluate(
        result.predict,
        split.test,
        metrics,
        upper=lambda s: bounds.upper(result.predict(s)),
        label=label,
    )
    state_dict = result.model.state_dict()
    if base is not None and options.heads_only:
        kept = keep_heads(base, result.model, normaliser, bounds, label_ranges)
        model_config, state_dict, normaliser, bounds, label_ranges = kept
    return checkpoint.Checkpoint(
        model_config=model_config,
        state_dict=state_dict,
        normaliser=normaliser,
        calibration=bounds,
        label_device=info.device,
        label_device_name=info.device_name,
        label_source=info.label_source,
        train_optimizers=info.optimizers,
        data_digest=info.digest,
        evaluations=(table,),
        train_config={
            **asdict(config),
            **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items()},
            "split": options.split.value,
            "init": None if base is None else _provenance(base),
            "epochs_run": len(result.history),
            "best_epoch": result.best_epoch,
            "best_val_mape": result.best_val_mape,
            "train_seconds": result.seconds,
            "calibration_moved": dict(split.moved),
            "samples": {
                "train": len(split.train),
                "censored": len(trained_censored),
                "val": len(split.val),
                "calibration": len(split.calibration),
                "test": len(split.test),
            },
        },
        target_definitions=targets.definitions(info.device_kind, info.memory_label),
        memory_label=info.memory_label,
        label_ranges=label_ranges,
        kubeseer_version=kubeseer.__version__,
        notes=notes,
        device_features=device.FEATURES if normaliser.device is not None else (),
        **provenance,
    )


def calibrate_on_labels(
    predict: Callable[[Sequence[Data]], npt.NDArray[np.float64]],
    calibration_samples: Sequence[Data],
    metrics: Sequence[str],
    coverage: float,
    context_bytes: int,
    *,
    short_covers_all: bool = False,
) -> calibration.Calibration:
    """Conformal margins of `predict` on the calibration samples' labels: one score per
    configuration, memory scored on what a GPU must hold (the label plus `context_bytes`, the
    runtime context a `RESERVED` label leaves out; 0 for a label that holds it).
    `short_covers_all` as in `conformal.calibrate`.

    Training calls it once; a benchmark that widens a trained checkpoint by evidence beyond the
    labels calls it again first, so that the widening starts from the labels' margins.
    """
    true, mask = evaluate.labels(calibration_samples)
    return conformal.calibrate(
        predict(calibration_samples),
        true,
        mask,
        metrics,
        coverage,
        groups=[str(s.config_hash) for s in calibration_samples],
        offsets=served_offsets(metrics, context_bytes),
        short_covers_all=short_covers_all,
    )


def served_offsets(metrics: Sequence[str], context_bytes: int) -> tuple[float, ...] | None:
    """What serving adds to each metric's label (the runtime context to a memory label that
    leaves it out), so that bounds are calibrated on what a GPU must hold; None when nothing."""
    if not context_bytes:
        return None
    return tuple(
        float(context_bytes) if targets.split_metric(m)[1] == "memory_bytes" else 0.0
        for m in metrics
    )


def _provenance_fields(
    info: dataset.DatasetInfo, base: checkpoint.Checkpoint | None
) -> dict[str, Any]:
    """Where a checkpoint's labels come from: its data's, and its base's for a fine-tune."""
    context = info.context_bytes if info.memory_label is targets.MemoryLabel.RESERVED else 0
    if base is None:
        return {
            "runtime_context_bytes": context,
            "sources": info.sources,
            "step_time_gpus": info.step_time_gpus,
        }
    return {
        "runtime_context_bytes": context or base.runtime_context_bytes,
        "sources": (*base.sources, *(f"fine-tuned on {line}" for line in info.sources)),
        "step_time_gpus": tuple(dict.fromkeys((*base.step_time_gpus, *info.step_time_gpus))),
        # The shift a GPU without step labels adds is its own, not the base's weights'; a GPU
        # the fine-tune labels is in `step_time_gpus` now and no longer gets it.
        "unseen_gpu_margins": dict(base.unseen_gpu_margins),
    }


def fresh_start(
    train_set: Sequence[Data], metrics: Sequence[str], options: Options, seed: int
) -> tuple[normalise.Normaliser, checkpoint.ModelConfig, nn.Module]:
    """A normaliser fitted on `train_set` and a model initialised from `seed`.

    Raises:
        ValueError: device-aware samples, and neither the step heads nor a step prior read
            the device.
    """
    first = train_set[0]
    device_x = getattr(first, "device_x", None)
    if device_x is not None and not (options.device_heads or options.step_prior):
        raise ValueError(
            "step heads that do not read the device need the step prior to: without either, "
            "step time would be the same on every GPU"
        )
    dropped = normalise.dropped_columns(options.drop_features)
    normaliser = normalise.Normaliser.fit(
        train_set,
        metrics,
        drop_x=dropped["x"],
        drop_edge_attr=dropped["edge_attr"],
        drop_u=dropped["u"],
        prior=options.memory_prior,
        step_prior=options.step_prior,
    )
    model_config = checkpoint.ModelConfig(
        kind=options.kind,
        node_channels=first.x.size(1),
        edge_channels=first.edge_attr.size(1),
        global_channels=first.u.size(1),
        num_tasks=len(metrics),
        hidden_channels=options.hidden_channels,
        synmm=options.synmm,
        gnpb=options.gnpb,
        # A device-aware sample set: the step-time heads read the device (memory is the same
        # tensors on every GPU), unless `device_heads` leaves the device to the step prior.
        device_channels=0 if device_x is None or not options.device_heads else device_x.size(1),
        device_tasks=()
        if device_x is None or not options.device_heads
        else tuple(
            k for k, m in enumerate(metrics) if targets.split_metric(m)[1] != "memory_bytes"
        ),
    )
    torch.manual_seed(seed)
    return normaliser, model_config, model_config.build()


def start_from(
    base: checkpoint.Checkpoint,
    train_set: Sequence[Data],
    metrics: Sequence[str],
    *,
    heads_only: bool = False,
) -> tuple[normalise.Normaliser, checkpoint.ModelConfig, nn.Module]:
    """`base`'s normaliser and model narrowed to `metrics`, to fine-tune on `train_set`; with
    `heads_only`, everything but the heads is frozen.

    Raises:
        ValueError: a metric `base` does not predict, too few step labels to refit its
            step-time prior, or fewer metrics than a SeerNet base (one head for all) predicts.
    """
    normaliser = base.normaliser.for_fine_tuning(metrics, train_set)
    model = base.model()
    if heads_only and not isinstance(model, seernet.SeerNetMulti):
        raise ValueError(
            f"a {base.model_config.kind} checkpoint has no head per metric to fine-tune alone"
        )
    if tuple(metrics) != base.metrics:
        if not isinstance(model, seernet.SeerNetMulti):
            raise ValueError(
                f"a {base.model_config.kind} checkpoint can only be fine-tuned on all of its "
                f"metrics ({', '.join(base.metrics)}); SeerNet-Multi can drop heads"
            )
        model = model.with_heads([base.metrics.index(m) for m in metrics])
    if heads_only:
        assert isinstance(model, seernet.SeerNetMulti)
        for parameter in model.block.parameters():
            parameter.requires_grad_(False)
    shape = model.device_tasks if isinstance(model, seernet.SeerNetMulti) else ()
    return (
        normaliser,
        replace(
            base.model_config,
            num_tasks=len(metrics),
            device_channels=base.model_config.device_channels if shape else 0,
            device_tasks=tuple(shape),
        ),
        model,
    )


def _short_calibration(bounds: calibration.Calibration, coverage: float) -> dict[str, str]:
    """Each metric calibrated on fewer configurations than `coverage` needs, and a sentence
    that says so."""
    needed = conformal.minimum_calibration(coverage)
    return {
        metric: f"{metric}: {count} calibration configurations, fewer than the {needed} a "
        f"{100 * coverage:.0f} % bound needs; the margin that covers each of them "
        f"(x{math.exp(margin):.3f}) replaces the base's only where it is larger."
        for metric, count, margin in zip(
            bounds.metrics, bounds.samples, bounds.log_margins, strict=True
        )
        if count < needed
    }


def _at_least(
    bounds: calibration.Calibration, base: calibration.Calibration, metrics: Sequence[str]
) -> calibration.Calibration:
    """`bounds` with the margin of each of `metrics` raised to `base`'s. A fine-tune's
    observations are few, of a few families and one GPU; where they cannot calibrate a metric,
    or where every family shares what the fine-tune changed (a heads-only fine-tune's heads),
    they cannot stand in for the evidence the base's margins hold beyond its own labels
    (`bench/gpu_predictor.py --boundary-margins`)."""
    for metric in metrics:
        bounds = bounds.widened(metric, base.log_margins[base.metrics.index(metric)])
    return bounds


def keep_heads(
    base: checkpoint.Checkpoint,
    tuned: nn.Module,
    normaliser: normalise.Normaliser,
    bounds: calibration.Calibration,
    label_ranges: Mapping[str, tuple[float, float]],
) -> tuple[
    checkpoint.ModelConfig,
    dict[str, torch.Tensor],
    normalise.Normaliser,
    calibration.Calibration,
    dict[str, tuple[float, float]],
]:
    """`base` with the heads a heads-only fine-tune trained (`tuned`, narrowed to
    `normaliser.metrics`) in place of its own: its model config, weights, normaliser,
    calibration and label ranges, every metric of `base` kept.

    The block is the base's (it was frozen), so every other head predicts exactly what it did
    and keeps its margin; a tuned metric's margin is `bounds`' (`_at_least` the base's). Its
    label range is the union, and a refitted step-time prior replaces the base's.
    """
    assert isinstance(tuned, seernet.SeerNetMulti)
    model = base.model()
    assert isinstance(model, seernet.SeerNetMulti)
    tuned_metrics = normaliser.metrics
    for k, metric in enumerate(tuned_metrics):
        model.heads[base.metrics.index(metric)].load_state_dict(tuned.heads[k].state_dict())
    margins = list(base.calibration.log_margins)
    counts = list(base.calibration.samples)
    for k, metric in enumerate(bounds.metrics):
        at = base.calibration.metrics.index(metric)
        margins[at], counts[at] = bounds.log_margins[k], bounds.samples[k]
    ranges = dict(base.label_ranges)
    for metric, (low, high) in label_ranges.items():
        old = ranges.get(metric, (low, high))
        ranges[metric] = (min(low, old[0]), max(high, old[1]))
    kept = replace(
        base.normaliser,
        step_costs=normaliser.step_costs or base.normaliser.step_costs,
        device_range=normaliser.device_range,
    )
    return (
        base.model_config,
        dict(model.state_dict()),
        kept,
        replace(base.calibration, log_margins=tuple(margins), samples=tuple(counts)),
        ranges,
    )


def _inherited(options: Options, base: checkpoint.Checkpoint, metrics: Sequence[str]) -> Options:
    """`options` with the architecture and feature ablations of `base`, and the priors it has
    for `metrics`."""
    shape = base.model_config
    with_prior = {targets.split_metric(m)[1] for m in metrics if m in base.normaliser.prior_metrics}
    return replace(
        options,
        kind=shape.kind,
        hidden_channels=shape.hidden_channels,
        synmm=shape.synmm,
        gnpb=shape.gnpb,
        drop_features=tuple(base.train_config.get("drop_features", ())),
        memory_prior="memory_bytes" in with_prior,
        step_prior="step_time_s" in with_prior,
        device_heads=bool(shape.device_tasks) or not base.device_aware,
    )


def _provenance(base: checkpoint.Checkpoint) -> dict[str, Any]:
    """What a fine-tuned checkpoint records of the one it started from."""
    return {
        "label_device": base.label_device,
        "label_device_name": base.label_device_name,
        "label_source": base.label_source,
        "data_digest": base.data_digest,
        "metrics": list(base.metrics),
        "kubeseer_version": base.kubeseer_version,
    }
