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
from kubeseer.hardware import mig
from kubeseer.predictor import (
    analytic_memory,
    attention,
    cache,
    checkpoint,
    device,
    errors,
    extract,
    figures,
    inference,
    launch_limits,
    model_input,
    perfgraph,
    prior,
    targets,
)

DEFAULT_CHECKPOINT: Final[str] = "default.pt"
"""File name of the shipped checkpoint inside `kubeseer.predictor.checkpoints`."""

SHIPPED_CHECKPOINTS: Final[dict[str, str]] = {
    "default": DEFAULT_CHECKPOINT,
    "cpu": "cpu-amd-epyc.pt",
}
"""Checkpoints shipped as package data, by name: ``default`` learned from GPU labels (public
step times on four GPUs, derived GPU memory; device-aware), ``cpu`` the earlier one learned from
CPU measurements (docs/accuracy.md compares them)."""

Model = str | os.PathLike[str] | bytes | perfgraph.PerfGraph

MAX_BATCH_CEILING: Final[int] = 1 << 16
"""`max_batch` searches no further: an answer equal to it means "at least this"."""


@dataclass(frozen=True)
class Request:
    """One question for `Predictor.predict_many`."""

    model: Model
    batch_size: int
    mode: prediction.Mode | str = prediction.Mode.TRAIN
    precision: prediction.Precision | str = prediction.Precision.FP32
    inputs: Mapping[str, int] | None = None
    gpu: str | None = None
    optimizer: str = "adam"
    attention: prediction.Attention | str = prediction.Attention.AUTO


def default_checkpoint_path() -> Path:
    """Path of the checkpoint shipped as package data."""
    return shipped_checkpoint_path("default")


def shipped_checkpoint_path(name: str) -> Path:
    """Path of the shipped checkpoint called `name` (`SHIPPED_CHECKPOINTS`).

    Raises:
        checkpoint.CheckpointError: no shipped checkpoint has that name.
    """
    if name not in SHIPPED_CHECKPOINTS:
        raise checkpoint.CheckpointError(
            f"no shipped checkpoint is called {name!r}; shipped: " + ", ".join(SHIPPED_CHECKPOINTS)
        )
    package = importlib.resources.files("kubeseer.predictor.checkpoints")
    return Path(str(package / SHIPPED_CHECKPOINTS[name]))


def checkpoint_path(ckpt: str | os.PathLike[str] | None) -> Path:
    """A checkpoint file, or the shipped one a name denotes (`default`, `cpu`); None is
    `default`. A file of that name in the working directory wins over the shipped one."""
    if ckpt is None:
        return default_checkpoint_path()
    path = Path(ckpt)
    if not path.exists() and str(ckpt) in SHIPPED_CHECKPOINTS:
        return shipped_checkpoint_path(str(ckpt))
    return path


def _digest(model: Model) -> str:
    if isinstance(model, perfgraph.PerfGraph):
        return model.model_digest
    if isinstance(model, bytes):
        return hashlib.sha256(model).hexdigest()
    # In steps: a model file (the operator's, up to its fetch limit) is never held in memory.
    with Path(model).open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


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
        """Open `path` (a file or a shipped checkpoint's name, `checkpoint_path`), or the
        shipped default checkpoint when None.

        Raises:
            checkpoint.CheckpointError: unreadable file or schema mismatch.
        """
        return cls(checkpoint.load(checkpoint_path(path)))

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
        model: Model,
        batch_size: int,
        mode: prediction.Mode | str = prediction.Mode.TRAIN,
        precision: prediction.Precision | str = prediction.Precision.FP32,
        *,
        inputs: Mapping[str, int] | None = None,
        gpu: str | None = None,
        optimizer: str = "adam",
        attention: prediction.Attention | str = prediction.Attention.AUTO,
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
            attention: the kernel the job's attention runs (`prediction.Attention`); ``auto``
                is PyTorch's choice on an SM80+ GPU.

        Raises:
            errors.PredictionError: the request cannot be answered; an `errors.GraphError`
                subclass when the model's graph is the reason (unreadable, control flow,
                inputs that do not bind, ...).
        """
        request = Request(model, batch_size, mode, precision, inputs, gpu, optimizer, attention)
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
        attention: prediction.Attention | str = prediction.Attention.AUTO,
    ) -> prediction.Prediction | None:
        """The cached answer to `predict` for the model with this sha256, or None.

        Lets a caller that knows the digest (a DLJob that pins it) skip reading the model.
        """
        return self.cache.get(
            self._key(model_digest, batch_size, mode, precision, inputs, gpu, optimizer, attention)
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
        attention: prediction.Attention | str,
    ) -> cache.Key:
        """The cache key of a request, checking what can be checked without the model."""
        if batch_size < 1:
            raise errors.PredictionError(f"batch size must be at least 1, got {batch_size}")
        try:
            kernel = prediction.Attention(attention)
        except ValueError as e:
            raise errors.PredictionError(
                f"unknown attention kernel {attention!r}; one of "
                + ", ".join(k.value for k in prediction.Attention)
            ) from e
        made = cache.key(
            self._fingerprint,
            model_digest,
            batch_size,
            prediction.Mode(mode),
            prediction.Precision(precision),
            optimizer=optimizer,
            inputs=inputs,
            gpu=gpu,
            attention=kernel,
        )
        if made.optimizer not in (*targets.OPTIMIZERS, targets.NO_OPTIMIZER):
            raise errors.PredictionError(f"unknown optimizer {made.optimizer!r}")
        return made

    def predict_many(self, requests: Sequence[Request]) -> list[prediction.Prediction]:
        """Predict many requests with one batched forward pass over those not cached."""
        results: list[prediction.Prediction | None] = []
        pending: list[
            tuple[
                int,
                cache.Key,
                list[str],
                analytic_memory.MemoryBreakdown,
                prediction.StepWork,
                str | None,
                tuple[str, ...],
            ]
        ] = []
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
                request.attention,
            )
            known = self.cache.get(key)
            if known is not None:
                results.append(known)
                continue
            results.append(None)
            mode, precision, optimizer = key.mode, key.precision, key.optimizer
            on = self._step_device(request.gpu)
            step_device = None if on is None else on.name
            graph, notes = self._graph(request)
            sample = model_input.build(perfgraph.to_pyg(graph), precision.value, optimizer, on)
            # The floor and the far-range fallback are a GPU's, where the job runs, counted as
            # CUDA runs the job; the priors are estimated on the labels' kind of device with the
            # rules the checkpoint learned against, as in training.
            memory_graph = analytic_memory.from_perfgraph(graph)
            blocks = analytic_memory.attention_blocks(memory_graph)
            if blocks:
                notes.append(attention.describe(blocks, key.attention))
            terms = prior.breakdowns(
                memory_graph, precision, optimizer, attention_kernel=key.attention
            )
            if self.checkpoint.normaliser.memory_prior:
                label_device = prior.label_device(self.checkpoint.label_device_kind)
                rules = self.checkpoint.prior_rules
                prior_terms = (
                    terms
                    if label_device == analytic_memory.DEFAULT_DEVICE
                    and rules is analytic_memory.DEFAULT_RULES
                    else prior.breakdowns(
                        memory_graph,
                        precision,
                        optimizer,
                        label_device,
                        attention_kernel=key.attention,
                        rules=rules,
                    )
                )
                logs = prior.log_priors(prior_terms, with_batch=self.checkpoint.memory_counts_batch)
                sample.prior_log = torch.tensor([logs], dtype=torch.float64)
            graphs.append(sample)
            work = device.work(graph, mode, precision.value)
            sizes = launch_limits.measure(graph, memory_graph, blocks, key.attention)
            notes.extend(sizes.risks())
            pending.append((i, key, notes, terms[mode], work, step_device, sizes.failures()))
        if pending:
            points = inference.predict(self.model, self.checkpoint.normaliser, graphs)
            uppers = self._uppers(points, [entry[5] for entry in pending])
            for row, (i, key, notes, analytic, work, step_device, launch) in enumerate(pending):
                made = figures.build(
                    self.checkpoint,
                    key,
                    points[row],
                    uppers[row],
                    notes,
                    analytic,
                    version=self.version,
                    work=work,
                    step_device=step_device,
                    launch=launch,
                )
                self.cache.put(key, made)
                results[i] = made
        return [r for r in results if r is not None]

    def _uppers(
        self, points: npt.NDArray[np.float64], step_devices: Sequence[str | None]
    ) -> npt.NDArray[np.float64]:
        """Upper bounds of `points`, each row with the margins of the GPU its step time is
        for (`checkpoint.Checkpoint.step_calibration`)."""
        uppers = np.empty_like(points)
        gpus = [None if d is None else d.split("/", 1)[0] for d in step_devices]
        for gpu in set(gpus):
            rows = [k for k, g in enumerate(gpus) if g == gpu]
            uppers[rows] = self.checkpoint.step_calibration(gpu).upper(points[rows])
        return uppers

    def _step_device(self, gpu: str | None) -> mig.Device | None:
        """The device a device-aware checkpoint predicts step time for: `gpu` (`GPU` or
        `GPU/profile`), else `device.REFERENCE_GPU`; None for any other checkpoint.

        Raises:
            errors.PredictionError: the hardware table knows no such GPU or profile.
        """
        if not self.checkpoint.device_aware:
            return None
        return device.resolve(gpu or device.REFERENCE_GPU)

    def max_batch(
        self,
        model: Model,
        limits: Mapping[str, int],
        mode: prediction.Mode | str = prediction.Mode.TRAIN,
        precision: prediction.Precision | str = prediction.Precision.FP32,
        *,
        inputs: Mapping[str, int] | None = None,
        optimizer: str = "adam",
        attention: prediction.Attention | str = prediction.Attention.AUTO,
        ceiling: int = MAX_BATCH_CEILING,
    ) -> dict[str, int]:
        """Largest batch size whose memory upper bound fits each limit and that crosses no
        kernel launch limit (`Prediction.launch_limits`; 0: not even batch 1).

        Assumes memory and launch sizes grow with batch size (they do: activations scale with
        it), so a doubling search followed by bisection needs O(log ceiling) predictions,
        shared by all limits.
        """
        if isinstance(model, perfgraph.PerfGraph):
            raise errors.PredictionError(
                "max_batch needs the ONNX model, not a fixed-batch PerfGraph"
            )
        memo: dict[int, float] = {}

        def upper(batch: int) -> float:
            """The memory bound at `batch`; infinite where a kernel cannot launch."""
            if batch not in memo:
                made = self.predict(
                    model,
                    batch,
                    mode,
                    precision,
                    inputs=inputs,
                    optimizer=optimizer,
                    attention=attention,
                )
                memo[batch] = math.inf if made.launch_limits else made.memory_bytes.upper
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
            warnings.simplefilter("always", errors.ExtractionWarning)
            graph = extract.from_onnx(
                request.model, batch_size=request.batch_size, inputs=request.inputs
            )
        return graph, [str(w.message) for w in caught]
