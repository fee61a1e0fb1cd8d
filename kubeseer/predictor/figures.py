"""From the network's outputs to the figures a placement can trust.

The learned model's points and conformal bounds are not yet what the operator sizes a GPU slice
by. Here they become the served `Prediction`: a metric the checkpoint never learned is a stated
conservative stand-in; memory is at least the model's own state (weights, gradients, optimiser
state, which follow from the graph at any size); far beyond the training labels, memory is the
analytic estimate with the learned relative margin; allocator-peak labels get the GPU runtime's
context and workspace added. Every adjustment is said in the prediction's `warnings`.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

from kubeseer import prediction, units
from kubeseer.predictor import analytic_memory, cache, checkpoint, errors, prior, targets

UNLEARNED_UTILISATION_PERCENT: Final[float] = 100.0
"""Stand-in for SM utilisation when the checkpoint has no such labels: assume the job keeps the
whole GPU busy, which never makes placement choose a slice that is too small."""

RUNTIME_OVERHEAD_BYTES: Final[int] = max(
    profile.context_bytes + profile.workspace_bytes
    for name, profile in analytic_memory.DEVICE_PROFILES.items()
    if name != "cpu"
)
"""Added to a checkpoint's allocator-peak memory to get what a GPU must hold: the largest CUDA
context plus cuBLAS/cuDNN workspace of the catalogue's GPUs (typical values, not measurements;
see `analytic_memory.DEVICE_PROFILES`), so the figure is safe on any of them."""

EXTRAPOLATION_FACTOR: Final[float] = 4.0
"""How far beyond its largest training label a learned figure is still trusted."""


def _estimate(
    ckpt: checkpoint.Checkpoint,
    metric: str,
    points: npt.NDArray[np.float64],
    uppers: npt.NDArray[np.float64],
    notes: list[str],
) -> prediction.Estimate:
    metrics = ckpt.metrics
    if metric in metrics:
        k = metrics.index(metric)
        return prediction.Estimate(float(points[k]), float(uppers[k]))
    if targets.split_metric(metric)[1] == "sm_util_percent":
        notes.append(
            f"this checkpoint has no {metric} labels (trained on "
            f"{ckpt.label_device_name}); SM utilisation is the conservative "
            f"default {UNLEARNED_UTILISATION_PERCENT:.0f} %, not a prediction"
        )
        return prediction.Estimate(UNLEARNED_UTILISATION_PERCENT, UNLEARNED_UTILISATION_PERCENT)
    raise errors.PredictionError(
        f"this checkpoint does not predict {metric} (it predicts {', '.join(metrics)})"
    )


def build(
    ckpt: checkpoint.Checkpoint,
    key: cache.Key,
    points: npt.NDArray[np.float64],
    uppers: npt.NDArray[np.float64],
    notes: list[str],
    analytic: analytic_memory.MemoryBreakdown,
    *,
    version: str,
    work: prediction.StepWork | None = None,
    step_device: str | None = None,
    launch: tuple[str, ...] = (),
) -> prediction.Prediction:
    """The served prediction of one request from the network's points and bounds ``(T,)``.

    Args:
        ckpt: the checkpoint that made `points` and `uppers`.
        key: the request.
        points, uppers: the network's figures in label units, one per `ckpt.metrics` entry.
        notes: warnings so far (extraction's); the adjustments made here are added.
        analytic: the analytic memory breakdown of the request on a GPU.
        version: `Predictor.version`, recorded in the prediction.
        work: the step's work as the graph counts it, carried into the prediction.
        step_device: for a device-aware checkpoint, the device (`GPU` or `GPU/profile`) the
            step time was predicted for.
        launch: the kernel launch limits the step crosses (`launch_limits`).

    Raises:
        errors.PredictionError: the checkpoint never learned the mode, or a figure is not finite.
    """
    mode, optimizer = key.mode, key.optimizer
    notes = list(notes)
    memory_metric = targets.metric(mode, "memory_bytes")
    memory = _estimate(ckpt, memory_metric, points, uppers, notes)
    memory = _within_learned_range(ckpt, memory_metric, memory, analytic, notes)
    floor = state_bytes(analytic)
    if memory.point < floor:
        notes.append(
            f"the learned memory prediction ({memory.point / units.MIB:,.0f} MiB) is below what "
            f"the model's state alone occupies ({floor / units.MIB:,.0f} MiB: weights"
            f"{', gradients and optimiser state' if mode == prediction.Mode.TRAIN else ''}); "
            "raised to that floor, the model is outside what the predictor learned"
        )
    overhead = 0
    if ckpt.memory_label is targets.MemoryLabel.RESERVED:
        overhead = ckpt.runtime_context_bytes
    elif ckpt.memory_label is targets.MemoryLabel.ALLOCATOR:
        overhead = RUNTIME_OVERHEAD_BYTES
        notes.append(
            f"memory adds {overhead / units.MIB:,.0f} MiB of "
            "CUDA context and library workspace to the peak of live tensors (typical values, "
            "not measured); the caching allocator's reserve above them is not included"
        )
        if not ckpt.memory_counts_batch:
            overhead += analytic.batch
            notes.append(
                f"memory adds the input batch ({analytic.batch / units.MIB:,.1f} MiB), which the "
                "labels of this checkpoint do not count"
            )
    memory = prediction.Estimate(
        max(memory.point, floor) + overhead, max(memory.upper, floor) + overhead
    )
    util = _estimate(ckpt, targets.metric(mode, "sm_util_percent"), points, uppers, notes)
    util = prediction.Estimate(min(util.point, 100.0), min(util.upper, 100.0))
    step_metric = targets.metric(mode, "step_time_s")
    step = _estimate(ckpt, step_metric, points, uppers, notes)
    step_range = ckpt.label_ranges.get(step_metric)
    if step_range is not None and step.point > EXTRAPOLATION_FACTOR * step_range[1]:
        notes.append(
            f"the step time ({step.point * 1e3:,.1f} ms) extrapolates beyond the slowest "
            f"training step ({step_range[1] * 1e3:,.1f} ms): treat it as a rough guide"
        )
    if not ckpt.label_device.startswith("cuda"):
        notes.append(
            f"labels come from {ckpt.label_device_name} ({ckpt.label_device}, "
            f"{ckpt.label_source}), not a GPU: treat these figures as indicative only"
        )
    if mode == prediction.Mode.TRAIN and optimizer not in ckpt.train_optimizers:
        learned = ", ".join(ckpt.train_optimizers) or "none"
        notes.append(
            f"no training labels with the {optimizer} optimizer (learned: {learned}); "
            "its effect on memory is extrapolated"
        )
    if any(not math.isfinite(v) for v in (memory.upper, step.upper)):
        raise errors.PredictionError("the model produced a non-finite prediction")
    if ckpt.device_aware:
        notes.extend(_device_notes(ckpt, key.gpu, step_device))
    elif key.gpu is not None and not same_device(key.gpu, ckpt.label_device_name):
        notes.append(
            f"requested GPU {key.gpu} is not the device the labels came from "
            f"({ckpt.label_device_name})"
        )
    return prediction.Prediction(
        mode=mode,
        batch_size=key.batch_size,
        precision=key.precision,
        memory_bytes=memory,
        sm_util_percent=util,
        step_time_s=step,
        coverage=ckpt.calibration.coverage,
        model_digest=key.model_digest,
        predictor_version=version,
        label_device=ckpt.label_device_name,
        warnings=tuple(notes),
        unlearned=tuple(
            q for q in ("sm_util_percent",) if targets.metric(mode, q) not in ckpt.metrics
        ),
        launch_limits=launch,
        work=work,
    )


def _device_notes(ckpt: checkpoint.Checkpoint, asked: str | None, device: str | None) -> list[str]:
    """What a device-aware prediction's step time stands on, where that needs saying: the
    reference GPU when none was named, a GPU no step time was measured on."""
    if device is None:
        return []
    gpu = device.split("/", 1)[0]
    notes = []
    if asked is None:
        notes.append(
            f"step time is for a whole {gpu} (no GPU named); placement scales it to each "
            "candidate device with the step's work"
        )
    elif gpu not in ckpt.step_time_gpus:
        notes.append(
            f"no step time was measured on {gpu}: {device}'s is predicted from its specs "
            f"(step-time labels from {', '.join(ckpt.step_time_gpus)})"
        )
    if gpu not in ckpt.step_time_gpus and ckpt.unseen_gpu_margins:
        widening = ", ".join(
            f"{metric} x{math.exp(extra):.2f}"
            for metric, extra in sorted(ckpt.unseen_gpu_margins.items())
        )
        notes.append(
            f"the step-time bound on a GPU without step labels is widened ({widening}) by what "
            "leaving each labelled GPU out measured"
        )
    return notes


def _within_learned_range(
    ckpt: checkpoint.Checkpoint,
    metric: str,
    memory: prediction.Estimate,
    analytic: analytic_memory.MemoryBreakdown,
    notes: list[str],
) -> prediction.Estimate:
    """The learned estimate, or the analytic one where the job lies far beyond the data.

    A network trained on models of at most a few hundred MiB says little about a
    50 GiB job, while the analytic terms (weights, gradients, optimiser state, activations)
    follow from the graph at any size. Beyond `EXTRAPOLATION_FACTOR` times the largest
    training label, memory is the analytic estimate with the learned estimate's relative
    conformal margin.
    """
    learned = ckpt.label_ranges.get(metric)
    physical = (
        analytic.total
        if ckpt.memory_label is targets.MemoryLabel.DEVICE
        else prior.tensor_bytes(analytic, with_batch=ckpt.memory_counts_batch)
    )
    if learned is None or max(memory.point, physical) <= EXTRAPOLATION_FACTOR * learned[1]:
        return memory
    notes.append(
        f"this job ({physical / units.MIB:,.0f} MiB by the analytic estimate) is more than "
        f"{EXTRAPOLATION_FACTOR:.0f}x the largest memory the predictor learned from "
        f"({learned[1] / units.MIB:,.0f} MiB): memory is the analytic estimate with the learned "
        f"model's relative margin, not the learned figure ({memory.point / units.MIB:,.0f} MiB)"
    )
    margin = memory.upper / memory.point if memory.point > 0 else 1.0
    return prediction.Estimate(float(physical), float(physical) * margin)


def same_device(gpu: str, label_device_name: str) -> bool:
    """Loose product match: `a100-80gb` matches `NVIDIA A100-SXM4-80GB`."""

    def words(text: str) -> set[str]:
        cleaned = "".join(c if c.isalnum() else " " for c in text.lower())
        return set(cleaned.split()) - {"nvidia"}

    asked, have = words(gpu), words(label_device_name)
    return bool(asked) and asked <= have


def state_bytes(breakdown: analytic_memory.MemoryBreakdown) -> int:
    """Bytes the job holds whatever its activations: weights, autocast copies, gradients, state.

    A learned model extrapolates badly far outside its training data (a 34-billion-parameter job
    once came out at under 1 GiB), while these terms follow from the graph alone, so every
    memory prediction is at least this much.
    """
    return (
        breakdown.weights
        + breakdown.weight_copies
        + breakdown.gradients
        + breakdown.optimizer_state
    )
