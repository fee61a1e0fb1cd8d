"""The predictor as the rest of kubeseer uses it: ONNX model in, `Prediction` out.

`Predictor.load()` opens the checkpoint that ships inside the package (or one you trained);
`predict` extracts the PerfGraph at the requested batch size, runs SeerNet-Multi and returns
point estimates with calibrated upper bounds. Results are kept in one cache keyed by the whole
request (`kubeseer.predictor.cache`), because the operator asks again for every reconcile of the
same job; `cached` answers from it for a model known only by its digest.

A prediction is only as good as its labels. Every prediction names the device its labels came
from, and its `warnings` say so when that is not the GPU being asked about, or when a metric
the checkpoint never learned (e.g. SM utilisation from CPU-only data) is filled by a stated
conservative default instead of a model output.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

import kubeseer
from kubeseer import prediction
from kubeseer.predictor import (
    cache,
    checkpoint,
    dataset,
    errors,
    extract,
    perfgraph,
    prior,
    targets,
    train,
)
from kubeseer.predictor.baselines import analytic_memory

DEFAULT_CHECKPOINT: Final[str] = "default.pt"
"""File name of the shipped checkpoint inside `kubeseer.predictor.checkpoints`."""

UNLEARNED_UTILISATION_PERCENT: Final[float] = 100.0
"""Stand-in for SM utilisation when the checkpoint has no such labels: assume the job keeps the
whole GPU busy, which never makes placement choose a slice that is too small."""

MIB: Final[int] = analytic_memory.MIB

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

ModelSource = str | os.PathLike[str] | bytes | perfgraph.PerfGraph

MAX_BATCH_CEILING: Final[int] = 1 << 16
"""`max_batch` searches no further: an answer equal to it means "at least this"."""


@dataclass(frozen=True)
class Request:
    """One question for `Predictor.predict_many`."""

    model: ModelSource
    batch_size: int
    mode: prediction.Mode | str = prediction.Mode.TRAIN
    precision: prediction.Precision | str = prediction.Precision.FP32
    inputs: Mapping[str, int] | None = None
    gpu: str | None = None
    optimizer: str = "adam"


def default_checkpoint_path() -> Path:
    """Path of the checkpoint shipped as package data."""
    resource = importlib.resources.files("kubeseer.predictor.checkpoints") / DEFAULT_CHECKPOINT
    return Path(str(resource))


def _digest(model: ModelSource) -> str:
    if isinstance(model, perfgraph.PerfGraph):
        return model.model_digest
    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    return hashlib.sha256(data).hexdigest()


class Predictor:
    """A loaded checkpoint, ready to predict.

    Safe to share between threads (the operator's workers do): the model only runs forward
    passes and the cache has its own lock.

    Args:
        ckpt: the checkpoint.
        cache_size: predictions remembered (least recently used are dropped first).
    """

    def __init__(self, ckpt: checkpoint.Checkpoint, *, cache_size: int = 4096) -> None:
        self.checkpoint = ckpt
        self.cache_size = cache_size
        self.model = ckpt.model()
        self.cache = cache.PredictionCache(cache_size)
        self._fingerprint = checkpoint.fingerprint(ckpt)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Predictor:
        """Open `path`, or the shipped default checkpoint when None.

        Raises:
            checkpoint.CheckpointError: unreadable file or schema mismatch.
        """
        return cls(checkpoint.load(default_checkpoint_path() if path is None else path))

    @property
    def metrics(self) -> tuple[str, ...]:
        """Metrics the checkpoint predicts."""
        return self.checkpoint.metrics

    @property
    def version(self) -> str:
        """kubeseer version plus the first 12 hex digits of the training-data digest."""
        return f"kubeseer {kubeseer.__version__}, data {self.checkpoint.data_digest[:12]}"

    def predict(
        self,
        model: ModelSource,
        batch_size: int,
        mode: prediction.Mode | str = prediction.Mode.TRAIN,
        precision: prediction.Precision | str = prediction.Precision.FP32,
        *,
        inputs: Mapping[str, int] | None = None,
        gpu: str | None = None,
        optimizer: str = "adam",
    ) -> prediction.Prediction:
        """Predict one model at one batch size, mode and precision.

        Args:
            model: ONNX path or bytes, or a PerfGraph extracted at `batch_size`.
            batch_size: samples per step.
            mode: ``train`` or ``infer``.
            precision: ``fp32``, ``fp16`` or ``bf16``.
            inputs: other symbolic input dimensions, e.g. ``{"seq": 128}``.
            gpu: the GPU this is being asked for (catalogue key or product label); a warning
                says when the labels come from another device.
            optimizer: the training optimizer (``adam`` or ``sgd``); ignored for inference.

        Raises:
            errors.PredictionError: the request cannot be answered; an `errors.GraphError`
                subclass when the model's graph is the reason (unreadable, control flow,
                inputs that do not bind, ...).
        """
        request = Request(model, batch_size, mode, precision, inputs, gpu, optimizer)
        return self.predict_many([request])[0]

    def cached(
        self,
        model_digest: str,
        batch_size: int,
        mode: prediction.Mode | str = prediction.Mode.TRAIN,
        precision: prediction.Precision | str = prediction.Precision.FP32,
        *,
        inputs: Mapping[str, int] | None = None,
        gpu: str | None = None,
        optimizer: str = "adam",
    ) -> prediction.Prediction | None:
        """The cached answer to `predict` for the model with this sha256, or None.

        Lets a caller that knows the digest (a DLJob that pins it) skip reading the model.
        """
        return self.cache.get(
            self._key(model_digest, batch_size, mode, precision, inputs, gpu, optimizer)
        )

    def _key(
        self,
        model_digest: str,
        batch_size: int,
        mode: prediction.Mode | str,
        precision: prediction.Precision | str,
        inputs: Mapping[str, int] | None,
        gpu: str | None,
        optimizer: str,
    ) -> cache.Key:
        """The cache key of a request, checking what can be checked without the model."""
        if batch_size < 1:
            raise errors.PredictionError(f"batch size must be at least 1, got {batch_size}")
        made = cache.key(
            self._fingerprint,
            model_digest,
            batch_size,
            prediction.Mode(mode),
            prediction.Precision(precision),
            optimizer=optimizer,
            inputs=inputs,
            gpu=gpu,
        )
        if made.optimizer not in (*targets.OPTIMIZERS, targets.NO_OPTIMIZER):
            raise errors.PredictionError(f"unknown optimizer {made.optimizer!r}")
        return made

    def predict_many(self, requests: Sequence[Request]) -> list[prediction.Prediction]:
        """Predict many requests with one batched forward pass over those not cached."""
        results: list[prediction.Prediction | None] = []
        pending: list[tuple[int, cache.Key, list[str], analytic_memory.MemoryBreakdown]] = []
        graphs = []
        for i, request in enumerate(requests):
            try:
                digest = _digest(request.model)
            except OSError as e:
                raise errors.PredictionError(f"cannot read model {request.model!r}: {e}") from e
            key = self._key(
                digest,
                request.batch_size,
                request.mode,
                request.precision,
                request.inputs,
                request.gpu,
                request.optimizer,
            )
            known = self.cache.get(key)
            if known is not None:
                results.append(known)
                continue
            results.append(None)
            mode, precision, optimizer = key.mode, key.precision, key.optimizer
            graph, notes = self._graph(request)
            sample = dataset.model_input(perfgraph.to_pyg(graph), precision.value, optimizer)
            # The floor and the far-range fallback are a GPU's, where the job runs; the priors
            # are estimated on the labels' kind of device, as in training.
            memory_graph = analytic_memory.from_perfgraph(graph)
            terms = prior.breakdowns(memory_graph, precision, optimizer)
            if self.checkpoint.normaliser.memory_prior:
                label_device = prior.label_device(self.checkpoint.label_device_kind)
                prior_terms = (
                    terms
                    if label_device == analytic_memory.DEFAULT_DEVICE
                    else prior.breakdowns(memory_graph, precision, optimizer, label_device)
                )
                logs = prior.log_priors(prior_terms, with_batch=self.checkpoint.memory_counts_batch)
                sample.prior_log = torch.tensor([logs], dtype=torch.float64)
            graphs.append(sample)
            pending.append((i, key, notes, terms[mode]))
        if pending:
            points = train.predict(self.model, self.checkpoint.normaliser, graphs)
            uppers = self.checkpoint.calibration.upper(points)
            for row, (i, key, notes, analytic) in enumerate(pending):
                made = self._prediction(key, points[row], uppers[row], notes, analytic)
                self.cache.put(key, made)
                results[i] = made
        return [r for r in results if r is not None]

    def max_batch(
        self,
        model: ModelSource,
        limits: Mapping[str, int],
        mode: prediction.Mode | str = prediction.Mode.TRAIN,
        precision: prediction.Precision | str = prediction.Precision.FP32,
        *,
        inputs: Mapping[str, int] | None = None,
        optimizer: str = "adam",
        ceiling: int = MAX_BATCH_CEILING,
    ) -> dict[str, int]:
        """Largest batch size whose memory upper bound fits each limit (0: not even batch 1).

        Assumes memory grows with batch size (it does: activations scale with it), so a
        doubling search followed by bisection needs O(log ceiling) predictions, shared by all
        limits.
        """
        if isinstance(model, perfgraph.PerfGraph):
            raise errors.PredictionError(
                "max_batch needs the ONNX model, not a fixed-batch PerfGraph"
            )
        memo: dict[int, float] = {}

        def upper(batch: int) -> float:
            if batch not in memo:
                memo[batch] = self.predict(
                    model, batch, mode, precision, inputs=inputs, optimizer=optimizer
                ).memory_bytes.upper
            return memo[batch]

        answers = {}
        for name, limit in limits.items():
            if upper(1) > limit:
                answers[name] = 0
                continue
            low, high = 1, 2
            while high <= ceiling and upper(high) <= limit:
                low, high = high, high * 2
            high = min(high, ceiling + 1)
            while high - low > 1:
                middle = (low + high) // 2
                if upper(middle) <= limit:
                    low = middle
                else:
                    high = middle
            answers[name] = low
        return answers

    def _graph(self, request: Request) -> tuple[perfgraph.PerfGraph, list[str]]:
        if isinstance(request.model, perfgraph.PerfGraph):
            if request.model.batch_size != request.batch_size:
                raise errors.PredictionError(
                    f"PerfGraph was extracted at batch size {request.model.batch_size}, "
                    f"not {request.batch_size}"
                )
            return request.model, []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", errors.UnknownOperatorWarning)
            graph = extract.from_onnx(
                request.model, batch_size=request.batch_size, inputs=request.inputs
            )
        return graph, [str(w.message) for w in caught]

    def _estimate(
        self,
        metric: str,
        points: npt.NDArray[np.float64],
        uppers: npt.NDArray[np.float64],
        notes: list[str],
    ) -> prediction.Estimate:
        metrics = self.metrics
        if metric in metrics:
            k = metrics.index(metric)
            return prediction.Estimate(float(points[k]), float(uppers[k]))
        if targets.split_metric(metric)[1] == "sm_util_percent":
            notes.append(
                f"this checkpoint has no {metric} labels (trained on "
                f"{self.checkpoint.label_device_name}); SM utilisation is the conservative "
                f"default {UNLEARNED_UTILISATION_PERCENT:.0f} %, not a prediction"
            )
            return prediction.Estimate(UNLEARNED_UTILISATION_PERCENT, UNLEARNED_UTILISATION_PERCENT)
        raise errors.PredictionError(
            f"this checkpoint does not predict {metric} (it predicts {', '.join(metrics)})"
        )

    def _prediction(
        self,
        key: cache.Key,
        points: npt.NDArray[np.float64],
        uppers: npt.NDArray[np.float64],
        notes: list[str],
        analytic: analytic_memory.MemoryBreakdown,
    ) -> prediction.Prediction:
        mode, optimizer = key.mode, key.optimizer
        notes = list(notes)
        memory_metric = targets.metric(mode, "memory_bytes")
        memory = self._estimate(memory_metric, points, uppers, notes)
        memory = self._within_learned_range(memory_metric, memory, analytic, notes)
        floor = state_bytes(analytic)
        if memory.point < floor:
            notes.append(
                f"the learned memory prediction ({memory.point / MIB:,.0f} MiB) is below what "
                f"the model's state alone occupies ({floor / MIB:,.0f} MiB: weights"
                f"{', gradients and optimiser state' if mode == prediction.Mode.TRAIN else ''}); "
                "raised to that floor, the model is outside what the predictor learned"
            )
        overhead = 0
        if self.checkpoint.memory_label is targets.MemoryLabel.ALLOCATOR:
            overhead = RUNTIME_OVERHEAD_BYTES
            notes.append(
                f"memory adds {overhead / MIB:,.0f} MiB of "
                "CUDA context and library workspace to the peak of live tensors (typical values, "
                "not measured); the caching allocator's reserve above them is not included"
            )
            if not self.checkpoint.memory_counts_batch:
                overhead += analytic.batch
                notes.append(
                    f"memory adds the input batch ({analytic.batch / MIB:,.1f} MiB), which the "
                    "labels of this checkpoint do not count"
                )
        memory = prediction.Estimate(
            max(memory.point, floor) + overhead, max(memory.upper, floor) + overhead
        )
        util = self._estimate(targets.metric(mode, "sm_util_percent"), points, uppers, notes)
        util = prediction.Estimate(min(util.point, 100.0), min(util.upper, 100.0))
        step_metric = targets.metric(mode, "step_time_s")
        step = self._estimate(step_metric, points, uppers, notes)
        step_range = self.checkpoint.label_ranges.get(step_metric)
        if step_range is not None and step.point > EXTRAPOLATION_FACTOR * step_range[1]:
            notes.append(
                f"the step time ({step.point * 1e3:,.1f} ms) extrapolates beyond the slowest "
                f"training step ({step_range[1] * 1e3:,.1f} ms): treat it as a rough guide"
            )
        ckpt = self.checkpoint
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
        if key.gpu is not None and not _same_device(key.gpu, ckpt.label_device_name):
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
            predictor_version=self.version,
            label_device=ckpt.label_device_name,
            warnings=tuple(notes),
            unlearned=tuple(
                q for q in ("sm_util_percent",) if targets.metric(mode, q) not in self.metrics
            ),
        )

    def _within_learned_range(
        self,
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
        learned = self.checkpoint.label_ranges.get(metric)
        physical = (
            analytic.total
            if self.checkpoint.memory_label is targets.MemoryLabel.DEVICE
            else prior.tensor_bytes(analytic, with_batch=self.checkpoint.memory_counts_batch)
        )
        if learned is None or max(memory.point, physical) <= EXTRAPOLATION_FACTOR * learned[1]:
            return memory
        notes.append(
            f"this job ({physical / MIB:,.0f} MiB by the analytic estimate) is more than "
            f"{EXTRAPOLATION_FACTOR:.0f}x the largest memory the predictor learned from "
            f"({learned[1] / MIB:,.0f} MiB): memory is the analytic estimate with the learned "
            f"model's relative margin, not the learned figure ({memory.point / MIB:,.0f} MiB)"
        )
        margin = memory.upper / memory.point if memory.point > 0 else 1.0
        return prediction.Estimate(float(physical), float(physical) * margin)


def _same_device(gpu: str, label_device_name: str) -> bool:
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
