"""Does SeerNet-Multi trained on GPU labels beat every baseline, on architectures, GPUs and
families it has not seen?

Samples (`kubeseer.predictor.gpu_samples`): the zoo's derived H100 memory (derived-allocator-
replay rows), timm's public step times on four GPUs (fp16 AMP, eager) and the timm memory
derivations at the public out-of-memory boundaries, each sample with its GPU's specs, and the
Llama family's training draw (`data/llama-training`), which every split trains on and none
scores or calibrates on (`dataset.DatasetInfo.training_only`; its held-out draw,
`data/held-out-llama`, is `bench/llama_memory.py`'s), so the split of every other sample is the
one it was without them. Memory is scored as the target a GPU must hold (the reserved label
plus the runtime's 500 MiB context); step time in GPU seconds.

Splits (each trains every learned model afresh):

* ``architectures``: the random 2:1:1 split over configurations (a zoo configuration or a timm
  architecture at its image size), validation halved for calibration; every GPU in training.
  This is the shipped checkpoint's own split (--out writes it).
* ``gpus``: for each GPU with step times, the same split with that GPU's step rows taken out of
  training, validation and calibration; scored on its rows of the test architectures (the
  architecture and the GPU both unseen). Training rows exist on the 3090 only, so leaving the
  3090 out leaves no training step label: that split learns and scores inference only.
* ``families``: the timm families (the module that defines an architecture) in three seeded
  folds; each fold's families are the test set, the zoo and the other folds' families are split
  3:1 (validation halved for calibration). With --boundaries, each fold's model also predicts
  memory at both batches of every public out-of-memory boundary of its held-out families.

With ``--boundaries``, each fold's SeerNet-Multi memory bounds are widened on the public
out-of-memory boundaries of the other folds' held-out families (`cross_fold_widening`), and
``--margins-out`` writes the margin over all folds, which ``--boundary-margins`` applies to the
architectures split's checkpoint. Folds can run in separate processes (``--folds 0``, ``--folds
1``, ...), one core each: the last one reads the others' ``--json`` reports with
``--fold-reports`` and fits the margins over every fold.

With ``--censored``, SeerNet-Multi also trains on the public boundaries of its split's training
architectures as bounds (`gpu_samples.censored_samples`: torch 2 inference, memory evidence
only; the batch that ran needed at most the card, the one that failed more). A split's
validation, calibration and test architectures never contribute theirs.

Models, same samples and splits, every upper bound conformally calibrated on the split's
calibration samples (95 %, one score per configuration; memory scored on what the GPU must hold,
the label plus the context, `train.served_offsets`):

* ``seernet-multi``: device-aware SeerNet-Multi (step heads read the GPU's specs), memory heads
  correcting the analytic estimate, step heads correcting the device cost model;
* ``pmgns``: DIPPM's PMGNS with the device's specs among its static features, the same priors;
* ``trees-on-priors``: gradient-boosted trees correcting the same priors from the global and
  device features (the bar `bench/gpu_step_time.py` set: the scaling law plus trees);
* ``global-regressor``: the same trees predicting the label directly (no prior);
* ``analytic`` (memory): the analytic estimate of tensor bytes; ``live-tensor-peak`` (memory):
  the derivation's peak of live tensors, what a FakeTensor estimate gives (where derived);
  ``device-law`` (step): the device cost model alone, fitted on the training split;
* ``cpu-checkpoint``: the CPU-trained checkpoint kubeseer shipped before (memory: allocator
  peak + 596 MiB + batch; step time: CPU seconds).

    .venv/bin/python bench/gpu_predictor.py [--splits architectures,gpus,families]
        [--models ...] [--hidden 128] [--minutes 30] [--out CKPT] [--checkpoint CKPT]
        [--boundaries] [--margins-out PATH] [--boundary-margins PATH] [--censored]
        [--folds 0,1,2] [--fold-reports A.json,B.json] [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch_geometric.data import Batch, Data

from kubeseer.hardware import gpus
from kubeseer.measure import gpu_memory, kernel_limits, public_gpu
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import (
    analytic_memory,
    api,
    checkpoint,
    conformal,
    dataset,
    figures,
    gpu_samples,
    inference,
    model_input,
    normalise,
    prior,
    schema,
    splits,
    targets,
    timm_models,
    train,
)
from kubeseer.predictor.baselines import global_regressor, pmgns

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "public-gpu"
SOURCES = gpu_samples.Sources(
    replay=REPO / "data" / "cuda-nvidia-h100-80gb-hbm3-derived-allocator-replay",
    timm=SHARED / "timm",
    derivations=REPO / "data" / "derived-gpu-memory-timm" / "derivations.jsonl",
    training_only=(
        REPO / "data" / "llama-training" / "cuda-nvidia-h100-80gb-hbm3-derived-allocator-replay",
    ),
)
KERNEL_LIMITS = SOURCES.derivations.with_name("kernel-limits.jsonl")
KERNEL_LIMITS_CACHE = Path.home() / ".cache" / "kubeseer" / "gpu-memory" / "limits-v2.jsonl"
CPU_CHECKPOINT = REPO / "kubeseer" / "predictor" / "checkpoints" / "cpu-amd-epyc.pt"
METRICS = gpu_samples.METRICS
MODELS = (
    "seernet-multi",
    "pmgns",
    "trees-on-priors",
    "global-regressor",
    "analytic",
    "analytic-as-written",
    "live-tensor-peak",
    "device-law",
    "cpu-checkpoint",
)
COVERAGE = 0.95
FOLDS = 3
SEED = 0


@dataclasses.dataclass
class Scored:
    """One model's figures on one split's test samples, in label units ``(N, T)``."""

    model: str
    points: npt.NDArray[np.float64]
    uppers: npt.NDArray[np.float64] | None
    seconds: float = 0.0
    epochs: int | None = None


def is_step(sample: Data, metrics: Sequence[str]) -> bool:
    return any(
        bool(sample.y_mask[0, k]) for k, m in enumerate(metrics) if m.endswith("step_time_s")
    )


def architecture_split(samples: Sequence[Data], training_only: Sequence[str]) -> splits.Split:
    return splits.random_split(samples, SEED, training_only)


def gpu_split(base: splits.Split, gpu: str, metrics: Sequence[str]) -> splits.Split:
    """`base` without `gpu`'s step rows in training; its step rows of the test architectures."""

    def keep(s: Data) -> bool:
        return not (s.gpu == gpu and is_step(s, metrics))

    return dataclasses.replace(
        base,
        train=[s for s in base.train if keep(s)],
        val=[s for s in base.val if keep(s)],
        calibration=[s for s in base.calibration if keep(s)],
        test=[s for s in base.test if not keep(s)],
    )


def family_split(samples: Sequence[Data], fold: int, training_only: Sequence[str]) -> splits.Split:
    """Fold `fold` of the timm families is the test set; the rest split 3:1, validation halved;
    the `training_only` configurations all in train."""
    samples, extra = splits.apart(samples, training_only)
    families = sorted({str(s.family) for s in samples if str(s.family).startswith("timm/")})
    random.Random(SEED).shuffle(families)
    held = set(families[fold::FOLDS])
    rest = [s for s in samples if str(s.family) not in held]
    hashes = sorted({str(s.config_hash) for s in rest})
    rng = random.Random(SEED)
    rng.shuffle(hashes)
    cut = round(len(hashes) * 3 / 4)
    train_h, val_h = set(hashes[:cut]), sorted(hashes[cut:])
    rng.shuffle(val_h)
    stop_h, cal_h = set(val_h[: len(val_h) // 2]), set(val_h[len(val_h) // 2 :])
    split = splits.Split(
        splits.SplitKind.FAMILY,
        SEED,
        ",".join(sorted(held)),
        [s for s in rest if s.config_hash in train_h],
        [s for s in rest if s.config_hash in stop_h],
        [s for s in rest if s.config_hash in cal_h],
        [s for s in samples if str(s.family) in held],
    )
    return splits.trained_also_on(split, extra)


def narrowed(split: splits.Split) -> tuple[splits.Split, tuple[str, ...]]:
    """The split's samples narrowed to the metrics its training and calibration sets label."""
    keep = tuple(
        m
        for k, m in enumerate(METRICS)
        if any(bool(s.y_mask[0, k]) for s in split.train)
        and any(bool(s.y_mask[0, k]) for s in split.calibration)
    )

    def cut(part: Sequence[Data]) -> list[Data]:
        return dataset.select_metrics(part, METRICS, keep)

    return (
        dataclasses.replace(
            split,
            train=cut(split.train),
            val=cut(split.val),
            calibration=cut(split.calibration),
            test=cut(split.test),
        ),
        keep,
    )


def bounds(
    predict: Callable[[Sequence[Data]], npt.NDArray[np.float64]],
    split: splits.Split,
    metrics: Sequence[str],
) -> Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]:
    """Split-conformal upper bounds for any model, on the split's calibration samples."""
    true, mask = labels(split.calibration)
    predicted = predict(split.calibration)
    usable = mask & np.isfinite(predicted) & (predicted > 0)
    calibrated = conformal.calibrate(
        np.where(usable, predicted, 1.0),
        true,
        usable,
        metrics,
        COVERAGE,
        groups=[str(s.config_hash) for s in split.calibration],
        offsets=train.served_offsets(metrics, CONTEXT),
    )
    return calibrated.upper


def labels(samples: Sequence[Data]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    y = torch.cat([s.y for s in samples]).double().numpy()
    mask = torch.cat([s.y_mask for s in samples]).bool().numpy()
    return y, mask


def metric_columns(metrics: Sequence[str]) -> list[int]:
    return [METRICS.index(m) for m in metrics]


def train_seernet(
    samples: Sequence[Data],
    info: dataset.DatasetInfo,
    split: splits.Split,
    metrics: tuple[str, ...],
    args: argparse.Namespace,
    censored: Sequence[Data] = (),
) -> tuple[checkpoint.Checkpoint, float]:
    """SeerNet-Multi trained on `split`, and on the `censored` samples (public boundaries as
    bounds) of the split's training architectures only: `train.train_checkpoint` would also
    take those of an architecture no part holds, which on a families split may belong to a
    held-out family."""
    started = time.monotonic()
    training = {str(s.config_hash) for s in split.train}
    bounds = [c for c in censored if str(c.config_hash) in training]
    config = train.TrainConfig(
        batch_size=args.batch_size,
        max_epochs=args.epochs,
        patience=args.patience,
        pcgrad=args.pcgrad,
        seed=args.train_seed,
        time_limit_s=args.minutes * 60,
    )
    options = train.Options(
        hidden_channels=args.hidden,
        memory_prior=True,
        step_prior=True,
        device_heads=args.device_heads,
        coverage=args.coverage,
        notes=(
            "device-aware SeerNet-Multi on GPU labels (bench/gpu_predictor.py, split "
            f"{split.describe()}); hidden {args.hidden}, PCGrad {args.pcgrad}, "
            f"device-reading step heads {args.device_heads}"
            + (f"; {len(bounds)} public out-of-memory bounds trained on" if bounds else "")
        ),
    )

    def show(log: train.EpochLog) -> None:
        print(
            f"  epoch {log.epoch}: loss {log.train_loss:.4f} val MAPE {log.val_mape:.2f} % "
            f"({log.seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    made = train.train_checkpoint(
        samples,
        dataclasses.replace(info, metrics=metrics),
        config,
        options,
        split=split,
        on_epoch=show,
        censored=bounds,
    )
    return made, time.monotonic() - started


def seernet_scored(ckpt: checkpoint.Checkpoint, test: Sequence[Data], seconds: float) -> Scored:
    model = ckpt.model()
    points = inference.predict(model, ckpt.normaliser, test)
    return Scored(
        "seernet-multi",
        points,
        ckpt.calibration.upper(points),
        seconds,
        int(ckpt.train_config["epochs_run"]),
    )


def log_priors(normaliser: normalise.Normaliser, samples: Sequence[Data]) -> npt.NDArray[Any]:
    """Each sample's log prior per metric of `normaliser` (memory estimate, device cost model)."""
    batch = Batch.from_data_list(list(samples))
    full = normaliser.log_priors(batch)
    assert full is not None
    return full[:, [targets.METRICS.index(m) for m in normaliser.metrics]].numpy()


def with_device_globals(samples: Sequence[Data]) -> list[Data]:
    """Copies whose global vector carries the device's specs too (for global-feature models)."""
    out = []
    for s in samples:
        copy = s.clone()
        copy.u = torch.cat([s.u, s.device_x.to(s.u)], dim=1)
        out.append(copy)
    return out


def trees(
    split: splits.Split,
    metrics: Sequence[str],
    normaliser: normalise.Normaliser,
    *,
    corrected: bool,
) -> Scored:
    """Gradient-boosted trees on the global and device features, correcting the priors or not."""
    started = time.monotonic()

    def features(samples: Sequence[Data]) -> list[Data]:
        out = with_device_globals(samples)
        if corrected:
            priors = log_priors(normaliser, samples)
            for s, p in zip(out, priors, strict=True):
                s.u = torch.cat([s.u, torch.from_numpy(p).reshape(1, -1).to(s.u.dtype)], dim=1)
                s.y = s.y / torch.tensor(np.exp(p)).reshape(1, -1)
        return out

    model = global_regressor.GradientBoostedRegressor(seed=SEED).fit(
        features(split.train), features(split.val)
    )

    def predict(samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        out = model.predict(features(samples))
        return out * np.exp(log_priors(normaliser, samples)) if corrected else out

    upper = bounds(predict, split, metrics)
    points = predict(split.test)
    name = "trees-on-priors" if corrected else "global-regressor"
    return Scored(name, points, upper(points), time.monotonic() - started)


def train_pmgns(split: splits.Split, metrics: tuple[str, ...], args: argparse.Namespace) -> Scored:
    """PMGNS (DIPPM) at its paper's width, the device's specs among its static features, the
    same priors and training loop as SeerNet-Multi."""
    started = time.monotonic()
    parts = {
        name: with_device_globals(getattr(split, name))
        for name in ("train", "val", "calibration", "test")
    }
    width = parts["train"][0].u.size(1)
    names = (*schema.GLOBAL_FEATURES, *targets.EXTRA_GLOBAL_FEATURES)
    static = (*pmgns.dippm_static_columns(names), *range(len(names), width))
    normaliser = normalise.Normaliser.fit(parts["train"], metrics, prior=True, step_prior=True)
    torch.manual_seed(SEED)
    model = pmgns.PMGNS(parts["train"][0].x.size(1), width, len(metrics), static_index=static)
    result = train.fit(
        model,
        parts["train"],
        parts["val"],
        train.TrainConfig(
            batch_size=args.batch_size,
            max_epochs=args.epochs,
            patience=args.patience,
            pcgrad=False,
            seed=SEED,
            time_limit_s=args.minutes * 60,
        ),
        metrics=metrics,
        normaliser=normaliser,
    )
    upper = bounds(lambda s: result.predict(with_device_globals(s)), split, metrics)
    points = result.predict(parts["test"])
    return Scored("pmgns", points, upper(points), time.monotonic() - started, len(result.history))


def memory_only(
    name: str,
    values: Callable[[Sequence[Data]], npt.NDArray[np.float64]],
    split: splits.Split,
    metrics: Sequence[str],
) -> Scored:
    """A baseline that predicts memory only (NaN elsewhere), with calibrated bounds."""

    def predict(samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        out = values(samples)
        for k, m in enumerate(metrics):
            if not m.endswith("memory_bytes"):
                out[:, k] = np.nan
        return out

    return with_bounds(name, predict, split, metrics)


def with_bounds(
    name: str,
    predict: Callable[[Sequence[Data]], npt.NDArray[np.float64]],
    split: splits.Split,
    metrics: Sequence[str],
) -> Scored:
    points = predict(split.test)
    cal_true, cal_mask = labels(split.calibration)
    cal_points = predict(split.calibration)
    usable = cal_mask & np.isfinite(cal_points) & (cal_points > 0)
    uppers = np.full_like(points, np.nan)
    for k, metric in enumerate(metrics):
        if usable[:, k].sum() < 20:
            continue
        calibrated = conformal.calibrate(
            cal_points[usable[:, k]][:, [k]],
            cal_true[usable[:, k]][:, [k]],
            np.ones((int(usable[:, k].sum()), 1), dtype=bool),
            [metric],
            COVERAGE,
            groups=[
                str(s.config_hash)
                for s, u in zip(split.calibration, usable[:, k], strict=True)
                if u
            ],
            offsets=train.served_offsets([metric], CONTEXT),
        )
        uppers[:, k] = calibrated.upper(points[:, [k]])[:, 0]
    return Scored(name, points, uppers)


def analytic(samples: Sequence[Data], metrics: Sequence[str]) -> npt.NDArray[np.float64]:
    priors = torch.cat([s.prior_log for s in samples]).numpy()
    return np.exp(priors[:, [targets.METRICS.index(m) for m in metrics]])


def analytic_as_written(samples: Sequence[Data], metrics: Sequence[str]) -> npt.NDArray[np.float64]:
    """The analytic estimate read as the graph is written (`analytic_memory.Rules.WRITTEN`:
    every activation at the job's precision, attention as exported), what the priors were
    before autocast widths and fused attention."""
    cache = dataset.GraphCache()
    priors = []
    for s in samples:
        memory_graph = cache.get_memory(str(s.config_hash), int(s.job_batch_size))
        assert memory_graph is not None, f"{s.config_hash} has no cached memory graph"
        terms = prior.breakdowns(
            memory_graph,
            Precision(s.precision),
            s.optimizer,
            rules=analytic_memory.Rules.WRITTEN,
        )
        priors.append(prior.log_priors(terms, with_batch=True))
    return np.exp(np.array(priors)[:, [targets.METRICS.index(m) for m in metrics]])


def live_peak(samples: Sequence[Data], metrics: Sequence[str]) -> npt.NDArray[np.float64]:
    peaks = torch.cat([s.live_peak for s in samples]).numpy()[:, metric_columns(metrics)]
    return np.where(peaks > 0, peaks, np.nan)


def device_law(
    normaliser: normalise.Normaliser, split: splits.Split, metrics: Sequence[str]
) -> Scored:
    def predict(samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        out = np.exp(log_priors(normaliser, samples))
        fitted = normaliser.step_costs.seconds_per_unit if normaliser.step_costs else {}
        for k, m in enumerate(metrics):
            if not m.endswith("step_time_s") or targets.split_metric(m)[0] not in fitted:
                out[:, k] = np.nan
        return out

    return with_bounds("device-law", predict, split, metrics)


def cpu_checkpoint(split: splits.Split, metrics: Sequence[str]) -> Scored | None:
    """The CPU-trained checkpoint's served figures (memory: allocator peak + runtime overhead +
    batch, as `figures.build` serves them; step time: CPU seconds)."""
    if not CPU_CHECKPOINT.exists():
        return None
    ckpt = checkpoint.load(CPU_CHECKPOINT)
    model = ckpt.model()
    cpu_profile = prior.label_device("cpu")

    def predict(samples: Sequence[Data]) -> npt.NDArray[np.float64]:
        inputs, extra = [], []
        cache = dataset.GraphCache()
        width = len(schema.GLOBAL_FEATURES)
        for s in samples:
            graph = Data(x=s.x, edge_index=s.edge_index, edge_attr=s.edge_attr, u=s.u[:, :width])
            sample = model_input.build(graph, s.precision, s.optimizer)
            memory_graph = cache.get_memory(str(s.config_hash), int(s.job_batch_size))
            assert memory_graph is not None, f"{s.model_name} has no cached memory graph"
            terms = prior.breakdowns(
                memory_graph,
                Precision(s.precision),
                s.optimizer,
                cpu_profile,
                rules=ckpt.prior_rules,
            )
            sample.prior_log = torch.tensor([prior.log_priors(terms, with_batch=False)])
            gpu_terms = prior.breakdowns(memory_graph, Precision(s.precision), s.optimizer)
            inputs.append(sample)
            extra.append(gpu_terms)
        raw = inference.predict(model, ckpt.normaliser, inputs)
        out = np.full((len(samples), len(metrics)), np.nan)
        for k, metric in enumerate(metrics):
            if metric not in ckpt.metrics:
                continue
            column = raw[:, ckpt.metrics.index(metric)]
            if metric.endswith("memory_bytes"):
                mode = Mode(targets.split_metric(metric)[0])
                floor = np.array([figures.state_bytes(t[mode]) for t in extra])
                batch = np.array([t[mode].batch for t in extra])
                column = np.maximum(column, floor) + figures.RUNTIME_OVERHEAD_BYTES + batch
                # scored against the reserved label: the checkpoint's context is the GPU one
                column = column - CONTEXT
            out[:, k] = column
        return out

    return with_bounds("cpu-checkpoint", predict, split, metrics)


CONTEXT = 500 * (1 << 20)
"""The runtime context every memory figure here is scored with (torch 2, CUDA 12)."""


def score(
    scored: Scored, test: Sequence[Data], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per metric and group: MAPE, accuracy within 10 %, bound coverage, share under-predicted.

    Memory is scored as the whole target (label + context).
    """
    true, mask = labels(test)
    groups: dict[str, npt.NDArray[np.bool_]] = {"all": np.ones(len(test), dtype=bool)}
    kinds = np.array(["zoo" if not str(s.family).startswith("timm/") else "timm" for s in test])
    gpu_names = np.array([str(s.gpu) for s in test])
    families = np.array([str(s.family) for s in test])
    for value in sorted(set(kinds.tolist())):
        groups[value] = kinds == value
    for value in sorted(set(gpu_names.tolist())):
        groups[f"gpu {value}"] = gpu_names == value
    for value in sorted(set(families.tolist())):
        groups[f"family {value}"] = families == value
    out: dict[str, dict[str, Any]] = {}
    for k, metric in enumerate(metrics):
        offset = CONTEXT if metric.endswith("memory_bytes") else 0.0
        for group, selected in groups.items():
            rows = selected & mask[:, k] & np.isfinite(scored.points[:, k])
            if not rows.any():
                continue
            t = true[rows, k] + offset
            p = scored.points[rows, k] + offset
            errors = np.abs(p - t) / t
            cell: dict[str, Any] = {
                "n": int(rows.sum()),
                "mape": float(100 * errors.mean()),
                "acc10": float(100 * (errors <= 0.10).mean()),
                "under": float(100 * (p < t).mean()),
            }
            if scored.uppers is not None and np.isfinite(scored.uppers[rows, k]).all():
                cell["coverage"] = float(100 * (scored.uppers[rows, k] + offset >= t).mean())
            out[f"{metric} | {group}"] = cell
    return out


def run_split(
    name: str,
    split: splits.Split,
    samples: Sequence[Data],
    info: dataset.DatasetInfo,
    args: argparse.Namespace,
    trained: checkpoint.Checkpoint | None = None,
    widen_by: Path | None = None,
    censored: Sequence[Data] = (),
) -> tuple[dict[str, Any], checkpoint.Checkpoint | None]:
    """Every model of `args.models` trained and scored on `split`; SeerNet-Multi is
    `trained` instead where given (a checkpoint of this split, re-scored), its memory bounds
    widened by the cross-fold boundary margins in `widen_by` where given."""
    split = splits.ensure_calibration(split, METRICS, conformal.minimum_calibration(COVERAGE))
    split, metrics = narrowed(split)
    print(f"\n## {name}: {split.describe()}; metrics {', '.join(metrics)}", flush=True)
    results: dict[str, Any] = {"split": split.describe(), "metrics": list(metrics), "models": {}}
    made: checkpoint.Checkpoint | None = None
    normaliser = normalise.Normaliser.fit(split.train, metrics, prior=True, step_prior=True)
    scored: list[Scored] = []
    if "seernet-multi" in args.models:
        if trained is not None:
            made, seconds = trained, 0.0
            if made.metrics != metrics:
                raise SystemExit(f"the --checkpoint predicts {made.metrics}, not {metrics}")
            if made.data_digest != info.digest and not args.relabelled:
                raise SystemExit(
                    "the --checkpoint was trained on other samples or other labels; with "
                    "--relabelled it is scored on today's, its split made anew"
                )
        else:
            made, seconds = train_seernet(samples, info, split, metrics, args, censored)
        if widen_by is not None:
            made = widen_checkpoint(made, widen_by, split.calibration)
        scored.append(seernet_scored(made, split.test, seconds))
        normaliser = made.normaliser
    if "pmgns" in args.models:
        scored.append(train_pmgns(split, metrics, args))
    if "trees-on-priors" in args.models:
        scored.append(trees(split, metrics, normaliser, corrected=True))
    if "global-regressor" in args.models:
        scored.append(trees(split, metrics, normaliser, corrected=False))
    if "analytic" in args.models:
        scored.append(memory_only("analytic", lambda s: analytic(s, metrics), split, metrics))
    if "analytic-as-written" in args.models:
        scored.append(
            memory_only(
                "analytic-as-written", lambda s: analytic_as_written(s, metrics), split, metrics
            )
        )
    if "live-tensor-peak" in args.models:
        scored.append(
            memory_only("live-tensor-peak", lambda s: live_peak(s, metrics), split, metrics)
        )
    if "device-law" in args.models:
        scored.append(device_law(normaliser, split, metrics))
    if "cpu-checkpoint" in args.models:
        cpu = cpu_checkpoint(split, metrics)
        if cpu is not None:
            scored.append(cpu)
    for item in scored:
        results["models"][item.model] = {
            "seconds": round(item.seconds, 1),
            "epochs": item.epochs,
            "scores": score(item, split.test, metrics),
        }
    print_table(name, results)
    return results, made


def print_unseen(found: dict[str, Any]) -> None:
    print(
        f"\n### {found['measured_on']} bounds on a GPU left out: the margin it adds\n\n"
        f"pooled over {found['configurations']} configurations: "
        f"x{math.exp(found['log_margin']):.3f}"
        "\n\n| GPU left out | configurations | covered by its own margins | the other GPUs' "
        "widening | covered with it |\n|---|---:|---:|---:|---:|"
    )
    for gpu, cell in found["gpus"].items():
        print(
            f"| {gpu} | {cell['configurations']} | "
            f"{100 * cell['own_coverage']:.1f} % | x{math.exp(cell['others_log_margin']):.3f} | "
            f"{100 * cell['widened_coverage']:.1f} % |"
        )


def print_table(name: str, results: dict[str, Any]) -> None:
    metrics = results["metrics"]
    print(f"\n### {name}: MAPE % / acc@10 % / bound coverage % (n), memory under-predicted %\n")
    print("| model | " + " | ".join(metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    for model, entry in results["models"].items():
        cells = []
        for metric in metrics:
            cell = entry["scores"].get(f"{metric} | all")
            if cell is None:
                cells.append("")
                continue
            text = f"{cell['mape']:.1f} / {cell['acc10']:.0f}"
            text += f" / {cell['coverage']:.0f}" if "coverage" in cell else " / -"
            text += f" ({cell['n']})"
            if metric.endswith("memory_bytes"):
                text += f", under {cell['under']:.0f}"
            cells.append(text)
        print(f"| {model} | " + " | ".join(cells) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", default="architectures")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--gpus", default="", help="GPUs to leave out (default: every one)")
    parser.add_argument("--folds", default="", help="family folds to run (default: all)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--pcgrad", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument(
        "--device-heads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="step-time heads read the GPU's specs (off: the device only through the step prior)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=30.0, help="training time per model")
    parser.add_argument("--limit", type=int, default=None, help="timm architectures at most")
    parser.add_argument("--export", action="store_true", help="export missing architectures")
    parser.add_argument(
        "--workers", type=int, default=1, help="processes that export and extract graphs at once"
    )
    parser.add_argument("--out", type=Path, help="write the architectures split's checkpoint")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="score this checkpoint of the architectures split instead of training one "
        "(with --boundaries --out: widen its memory bounds without retraining)",
    )
    parser.add_argument(
        "--training-draws",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train on the training-only draws (gpu_samples.Sources.training_only); without "
        "them, the samples of a checkpoint trained before they existed",
    )
    parser.add_argument(
        "--relabelled",
        action="store_true",
        help="score the --checkpoint although its training labels differ from today's (a "
        "derivation changed them): its split is today's where the configurations are the same",
    )
    parser.add_argument(
        "--boundaries",
        action="store_true",
        help="score memory at the public out-of-memory boundaries (families: of the held-out "
        "families, widened across folds; architectures: of the test architectures)",
    )
    parser.add_argument(
        "--margins-out", type=Path, help="write the cross-fold boundary margins (families)"
    )
    parser.add_argument(
        "--fold-reports",
        type=lambda text: [Path(p) for p in text.split(",")],
        default=[],
        help="families: --json reports of other folds run in other processes, whose held-out "
        "boundaries join this run's before the cross-fold margins are fitted",
    )
    parser.add_argument(
        "--boundary-margins",
        type=Path,
        help="widen the architectures split's checkpoint by these margins (a --margins-out)",
    )
    parser.add_argument(
        "--unseen-gpu-margins-out",
        type=Path,
        help="write the step-time margin a GPU without step labels adds (gpus split)",
    )
    parser.add_argument(
        "--unseen-gpu-margins",
        type=Path,
        help="give the architectures split's checkpoint this unseen-GPU step-time margin "
        "(a --unseen-gpu-margins-out)",
    )
    parser.add_argument(
        "--censored",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="SeerNet-Multi also trains on the public out-of-memory boundaries of its training "
        "architectures as bounds (gpu_samples.censored_samples)",
    )
    parser.add_argument(
        "--observed",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        help="gpus split: also fine-tune each GPU-left-out model on the step times of this many "
        "of that GPU's training architectures (comma-separated counts)",
    )
    parser.add_argument(
        "--observed-minutes", type=float, default=2.0, help="training time per such fine-tune"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--train-seed",
        type=int,
        default=SEED,
        help="SeerNet-Multi's initialisation and batch order (the splits keep seed 0)",
    )
    parser.add_argument("--coverage", type=float, default=0.95)
    args = parser.parse_args(argv)
    global COVERAGE
    COVERAGE = args.coverage
    args.models = tuple(args.models.split(","))
    torch.set_num_threads(args.threads)
    sources = SOURCES if args.training_draws else dataclasses.replace(SOURCES, training_only=())
    samples, info = gpu_samples.build(
        sources, limit=args.limit, export=args.export, workers=args.workers
    )
    counts = collections.Counter(
        ("step" if is_step(s, METRICS) else "memory", str(s.gpu)) for s in samples
    )
    print(f"{len(samples)} samples: {dict(counts)}; {len(info.failed)} left out")
    print("\n".join(info.sources))
    report: dict[str, Any] = {"samples": len(samples), "sources": list(info.sources)}
    censored: list[Data] = []
    if args.censored:
        censored, unavailable = gpu_samples.censored_samples(
            SOURCES, KERNEL_LIMITS, export=args.export, workers=args.workers
        )
        print(f"{len(censored)} censored boundary samples; {len(unavailable)} left out")
        report["censored"] = len(censored)
    base = architecture_split(samples, info.training_only)
    for split_name in args.splits.split(","):
        if split_name == "architectures":
            shipped = None if args.checkpoint is None else checkpoint.load(args.checkpoint)
            result, made = run_split(
                "held-out architectures, GPU seen",
                base,
                samples,
                info,
                args,
                shipped,
                args.boundary_margins,
                censored,
            )
            if args.boundaries and made is not None:
                result["boundaries"] = boundary_predictions(made, of_configurations(base.test))
                report["architectures boundary table"] = boundary_table(
                    result["boundaries"], "architectures held out, families seen"
                )
            report["architectures"] = result
            if made is not None and args.unseen_gpu_margins is not None:
                made = with_unseen_gpu_margins(made, args.unseen_gpu_margins)
                print(made.sources[-1])
            if made is not None and args.out is not None:
                checkpoint.save(made, args.out)
                print(f"checkpoint: {args.out}")
        elif split_name == "gpus":
            step_gpus = args.gpus.split(",") if args.gpus else list(info.step_time_gpus)
            excess: dict[str, list[float]] = {}
            for gpu in step_gpus:
                left_out = gpu_split(base, gpu, METRICS)
                result, made_without = run_split(
                    f"GPU left out: {gpu}", left_out, samples, info, args, censored=censored
                )
                report[f"gpu {gpu}"] = result
                if made_without is not None and UNSEEN_METRIC in made_without.metrics:
                    excess[gpu] = unseen_gpu_excess(made_without, left_out.test, gpu)
                if made_without is not None and args.observed:
                    zero_shot = result["models"]["seernet-multi"]["scores"]
                    result["observed"] = [
                        tuned_on_observed(made_without, info, base, left_out.test, gpu, count, args)
                        for count in args.observed
                    ]
                    print_observed(gpu, zero_shot, result["observed"])
            if len(excess) > 1:  # a shift is measured leaving each of several GPUs out
                report["unseen GPU margins"] = unseen_gpu_margins(excess)
                print_unseen(report["unseen GPU margins"])
                if args.unseen_gpu_margins_out is not None:
                    args.unseen_gpu_margins_out.write_text(
                        json.dumps(report["unseen GPU margins"], indent=1) + "\n"
                    )
        elif split_name == "families":
            folds = [int(f) for f in args.folds.split(",")] if args.folds else range(FOLDS)
            fold_entries: dict[int, list[dict[str, Any]]] = {}
            for fold in folds:
                split = family_split(samples, fold, info.training_only)
                result, made = run_split(
                    f"held-out families, fold {fold}",
                    split,
                    samples,
                    info,
                    args,
                    censored=censored,
                )
                if args.boundaries and made is not None:
                    held = set(str(split.held_out_family).split(","))
                    fold_entries[fold] = boundary_predictions(made, of_families(held))
                report[f"families {fold}"] = result
            for fold, result in folds_reported(args.fold_reports, set(fold_entries)).items():
                fold_entries[fold] = result.pop("boundaries")
                report[f"families {fold}"] = result
            if fold_entries:
                raw = [e for entries in fold_entries.values() for e in entries]
                report["boundary table, label margins"] = boundary_table(
                    raw, "families held out, label-calibrated bounds"
                )
                per_fold, report["boundary margins"] = cross_fold_widening(fold_entries)
                for fold, entries in fold_entries.items():
                    report[f"families {fold}"]["boundaries"] = entries
                report["boundary table"] = boundary_table(
                    [e for entries in per_fold.values() for e in entries],
                    "families held out, bounds widened on the other folds' boundaries",
                )
                if args.margins_out is not None:
                    args.margins_out.write_text(json.dumps(report["boundary margins"], indent=1))
        if args.json is not None:
            args.json.write_text(json.dumps(report, indent=1))
    return 0


def folds_reported(paths: Sequence[Path], run_here: set[int]) -> dict[int, dict[str, Any]]:
    """The families folds that other processes' `--json` reports hold, each with its held-out
    boundaries, so that folds trained one to a core still share one cross-fold margin.

    A fold run here, or reported twice, or a report without boundaries (a run without
    `--boundaries`) is an error: margins fitted on a silently missing or doubled fold would not
    be the margins the documentation describes."""
    found: dict[int, dict[str, Any]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for key, result in report.items():
            if not key.startswith("families "):
                continue
            fold = int(key.removeprefix("families "))
            if fold in run_here or fold in found:
                raise SystemExit(f"{path}: fold {fold} is reported twice")
            if "boundaries" not in result:
                raise SystemExit(f"{path}: fold {fold} has no boundaries (run with --boundaries)")
            found[fold] = result
    return found


def of_configurations(samples: Sequence[Data]) -> Callable[[str, int], bool]:
    """Whether a timm architecture at an image size is one of the samples' configurations."""
    hashes = {str(s.config_hash) for s in samples}
    return lambda model, img: timm_models.config_hash(model, img) in hashes


def of_families(families: set[str]) -> Callable[[str, int], bool]:
    """Whether a timm architecture belongs to one of `families`."""
    return lambda model, _img: gpu_samples._family(model) in families


def boundary_predictions(
    made: checkpoint.Checkpoint, architectures: Callable[[str, int], bool]
) -> list[dict[str, Any]]:
    """The model's memory (served point and bound, with the boundary's runtime context in place
    of the checkpoint's) and whether it reports a launch failure (`Prediction.launch_limits`)
    at both batches of every public boundary (fp16 AMP, NCHW, eager) of the architectures
    `architectures(model, img)` accepts that have an export, each with the kernel limit the
    meta-device probe says explains its failure and the run of the same job that shows the
    failed batch fits the card (`public_gpu.memory_contradictions`), None where neither."""
    rows = public_gpu.read_timm(SOURCES.timm)
    chosen = [
        b
        for b in public_gpu.boundaries(rows)
        if not b.row.channels_last
        and b.row.precision == "fp16"
        and architectures(b.row.model, b.row.img_size)
        and timm_models.onnx_path(b.row.model, b.row.img_size).exists()
    ]
    limits = kernel_limits.lookup(chosen, [KERNEL_LIMITS], KERNEL_LIMITS_CACHE)
    contradicted = public_gpu.memory_contradictions(rows)
    found = []
    predictor = api.Predictor(made)
    for b in chosen:
        probed = limits.get(kernel_limits.key(b.row.model, b.row.img_size, b.row.runtime))
        entry: dict[str, Any] = {
            "model": b.row.model,
            "img": b.row.img_size,
            "family": gpu_samples._family(b.row.model),
            "gpu": b.row.gpu,
            "mode": b.row.mode,
            "runtime": b.row.runtime,
            "capacity": gpus.by_key(b.row.gpu).memory_bytes,
            "fit": b.fit,
            "fail": b.fail,
            "limit": None if probed is None else probed.explains(b.fit, b.fail),
            "contradiction": contradicted.get(b),
        }
        # torch 1.x has no scaled_dot_product_attention: its jobs ran attention as written
        runtime = gpu_memory.RUNTIMES[b.row.runtime]
        attention = "auto" if runtime.fused_attention else "written"
        # the checkpoint serves its labels' runtime context; a job on another runtime holds
        # that runtime's documented context instead (torch 1.12: 700 MiB more)
        shift = runtime.context_bytes - made.runtime_context_bytes
        entry["shift"] = shift
        path = timm_models.onnx_path(b.row.model, b.row.img_size)
        try:
            for which in ("fit", "fail"):
                made_prediction = predictor.predict(
                    str(path),
                    getattr(b, which),
                    b.row.mode,
                    "fp16",
                    optimizer="sgd",
                    gpu=b.row.gpu,
                    attention=attention,
                )
                entry[which + "_point"] = made_prediction.memory_bytes.point + shift
                entry[which + "_upper"] = made_prediction.memory_bytes.upper + shift
                entry[which + "_launch"] = bool(made_prediction.launch_limits)
        except Exception as e:  # an export that does not bind at that batch
            entry["error"] = f"{type(e).__name__}: {e}"[:200]
        found.append(entry)
    return found


def memory_evidence(entry: dict[str, Any]) -> bool:
    """Only memory explains the boundary's failure: no kernel limit, no run of the same job
    that shows the failed batch fits."""
    return entry.get("limit") is None and entry.get("contradiction") is None


def boundary_margin(entries: Sequence[dict[str, Any]], mode: str) -> tuple[float, int] | None:
    """The log margin that puts `COVERAGE` of the failed batches of `mode` above their card
    (`conformal.censored_margin`, one score per architecture; failures a kernel limit or
    another run of the job explains are not memory evidence), and how many architectures it
    rests on; None when too few."""
    usable = [e for e in entries if e["mode"] == mode and memory_evidence(e) and "error" not in e]
    # the margin multiplies what the checkpoint serves; another runtime's context is added
    # after it, so it comes off the card instead
    groups = [f"{e['model']}|{e['img']}" for e in usable]
    try:
        log_margin = conformal.censored_margin(
            np.array([e["fail_point"] - e["shift"] for e in usable], dtype=np.float64),
            np.array([e["capacity"] - e["shift"] for e in usable], dtype=np.float64),
            groups,
            COVERAGE,
        )
    except conformal.CalibrationError:
        return None
    return log_margin, len(set(groups))


def widened(entries: Sequence[dict[str, Any]], margins: dict[str, float]) -> list[dict[str, Any]]:
    """`entries` with each bound raised to at least its point times its mode's margin, as
    `Calibration.widened` raises a checkpoint's."""
    out = []
    for e in entries:
        copy = dict(e)
        margin = margins.get(e["mode"])
        if margin is not None and "error" not in e:
            for which in ("fit", "fail"):
                point, upper = e[which + "_point"] - e["shift"], e[which + "_upper"] - e["shift"]
                copy[which + "_upper"] = max(upper, point * math.exp(margin)) + e["shift"]
        out.append(copy)
    return out


def cross_fold_widening(
    folds: dict[int, list[dict[str, Any]]],
) -> tuple[dict[int, list[dict[str, Any]]], dict[str, Any]]:
    """Each fold's boundary figures widened by the margin the *other* folds' held-out families
    need, and the margin all folds need (what the shipped checkpoint is widened by).

    Too few architectures carry usable public boundaries for a split's own calibration part to
    fit a 95 % margin (179 exported architectures have an inference boundary, 15 or so land in
    one fold's calibration), so the evidence is cross-validated over family folds instead: a
    fold model's errors on families it never saw are the errors a new family brings. A fold is
    scored with margins fitted on the other folds' families only."""
    per_fold: dict[int, list[dict[str, Any]]] = {}
    report: dict[str, Any] = {"coverage": COVERAGE, "folds": {}}
    for fold, entries in folds.items():
        others = [e for k, rest in folds.items() if k != fold for e in rest]
        margins = {
            mode: found[0]
            for mode in ("train", "infer")
            if (found := boundary_margin(others, mode)) is not None
        }
        report["folds"][fold] = {mode: math.exp(m) for mode, m in margins.items()}
        per_fold[fold] = widened(entries, margins)
    every = [e for entries in folds.values() for e in entries]
    for mode in ("train", "infer"):
        found = boundary_margin(every, mode)
        if found is not None:
            report[f"{mode}.memory_bytes"] = {"log_margin": found[0], "architectures": found[1]}
    print(f"\nboundary margins: {json.dumps(report)}", flush=True)
    return per_fold, report


WIDENED: str = "memory bounds widened on public out-of-memory boundaries"


def widen_checkpoint(
    made: checkpoint.Checkpoint, margins_path: Path, calibration_samples: Sequence[Data]
) -> checkpoint.Checkpoint:
    """`made` with its memory bounds widened by the cross-fold boundary margins a families run
    wrote (`--margins-out`).

    The widening starts from the margins of `made`'s predictions on its split's calibration
    labels, fitted again here (`train.calibrate_on_labels`), not from the margins it carries:
    `Calibration.widened` only raises a margin, so a checkpoint widened before by larger
    boundary margins would otherwise keep them. The notes and sources of an earlier widening
    are replaced, not added to."""
    margins = json.loads(margins_path.read_text())
    model = made.model()
    calibrated = train.calibrate_on_labels(
        lambda s: inference.predict(model, made.normaliser, s),
        calibration_samples,
        made.metrics,
        made.calibration.coverage,
        made.runtime_context_bytes if made.memory_label is targets.MemoryLabel.RESERVED else 0,
    )
    print(
        "label-calibrated margins: "
        + ", ".join(f"{m} x{calibrated.margin(m):.3f}" for m in calibrated.metrics),
        flush=True,
    )
    said = []
    for metric in made.calibration.metrics:
        found = margins.get(metric)
        if found is None:
            continue
        calibrated = calibrated.widened(metric, float(found["log_margin"]))
        said.append(
            f"{metric} x{calibrated.margin(metric):.3f} (the failed batches of "
            f"{found['architectures']} architectures of families held out in "
            f"{len(margins['folds'])} folds)"
        )
    trained_notes = str(made.train_config.get("notes", made.notes))
    kept_sources = tuple(x for x in made.sources if not x.startswith(WIDENED))
    if not said:
        return dataclasses.replace(
            made, calibration=calibrated, notes=trained_notes, sources=kept_sources
        )
    note = f"{WIDENED}: " + "; ".join(said)
    return dataclasses.replace(
        made,
        calibration=calibrated,
        notes=f"{trained_notes} {note}.",
        sources=(
            *kept_sources,
            f"{note}, timm's public benchmark (Apache-2.0), failures a kernel limit or another "
            "run of the same job explains left out",
        ),
    )


UNSEEN_METRIC = "infer.step_time_s"
"""The step time measured on more than one GPU (training: the RTX 3090 only), so the one whose
excess on a GPU left out can be measured."""


def unseen_gpu_excess(made: checkpoint.Checkpoint, test: Sequence[Data], gpu: str) -> list[float]:
    """How far beyond `made`'s own conformal margin each test configuration's inference step
    time on `gpu` (a GPU `made` never saw step times of) lay: per configuration, the largest
    ``log(true) - log(point) - margin`` over its batches (positive: the bound missed)."""
    rows = dataset.select_metrics(test, METRICS, made.metrics)
    column = made.metrics.index(UNSEEN_METRIC)
    points = inference.predict(made.model(), made.normaliser, rows)
    true, mask = labels(rows)
    own = math.log(made.calibration.margin(UNSEEN_METRIC))
    kept = [i for i, s in enumerate(rows) if str(s.gpu) == gpu and mask[i, column]]
    excess = np.log(true[kept, column]) - np.log(points[kept, column]) - own
    return conformal.worst_per_group([rows[i].config_hash for i in kept], excess).tolist()


def unseen_gpu_margins(excess: dict[str, list[float]]) -> dict[str, Any]:
    """The log margin a step-time bound adds on a GPU without step labels, from the excesses of
    each GPU left out in turn (`unseen_gpu_excess`; `conformal.shift_margin` says what it
    promises), as the JSON `--unseen-gpu-margins-out` writes."""
    found = conformal.shift_margin(excess, COVERAGE)
    return {
        "coverage": COVERAGE,
        "measured_on": UNSEEN_METRIC,
        "log_margin": found.log_margin,
        "configurations": found.configurations,
        "gpus": {gpu: dataclasses.asdict(check) for gpu, check in found.per_domain.items()},
    }


def observed_on(part: Sequence[Data], gpu: str) -> dict[str, list[Data]]:
    """`gpu`'s step-time rows in `part`, by configuration."""
    found: dict[str, list[Data]] = collections.defaultdict(list)
    for s in part:
        if str(s.gpu) == gpu and is_step(s, METRICS):
            found[str(s.config_hash)].append(s)
    return found


def tuned_on_observed(
    made: checkpoint.Checkpoint,
    info: dataset.DatasetInfo,
    base: splits.Split,
    test: Sequence[Data],
    gpu: str,
    count: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """`made` (trained without `gpu`'s step times) fine-tuned on `count` training
    architectures' step rows of `gpu`, as the learning loop would after the profiler watched
    that many jobs there (`train.start_from`: the heads those rows label, the step cost model
    refitted on them), and scored on `test` (the GPU's rows of the test architectures).

    Early stopping reads `gpu`'s rows of a quarter as many validation architectures (at least
    four); the conformal margin is fitted on `gpu`'s rows of every calibration architecture,
    more than such a loop would have, so the coverage here is the most it could reach."""
    rng = random.Random(SEED)
    observed = observed_on(base.train, gpu)
    chosen = rng.sample(sorted(observed), min(count, len(observed)))
    validating = observed_on(base.val, gpu)
    checked = rng.sample(sorted(validating), min(max(4, count // 4), len(validating)))
    rows = [r for h in chosen for r in observed[h]]
    # the step times `made` has heads for (the RTX 3090 left out takes training's with it)
    metrics = tuple(
        m
        for k, m in enumerate(METRICS)
        if m in made.metrics and any(bool(r.y_mask[0, k]) for r in rows)
    )

    def cut(part: Sequence[Data]) -> list[Data]:
        return dataset.select_metrics(part, METRICS, metrics)

    split = splits.Split(
        splits.SplitKind.RANDOM,
        SEED,
        None,
        cut(rows),
        cut([r for h in checked for r in validating[h]]),
        cut([r for group in observed_on(base.calibration, gpu).values() for r in group]),
        cut([s for s in test if str(s.gpu) == gpu]),
    )
    started = time.monotonic()
    tuned = train.train_checkpoint(
        [*split.train, *split.val, *split.calibration, *split.test],
        dataclasses.replace(info, metrics=metrics),
        train.TrainConfig(
            batch_size=min(args.batch_size, len(split.train)),
            max_epochs=args.epochs,
            patience=args.patience,
            seed=SEED,
            time_limit_s=args.observed_minutes * 60,
        ),
        train.Options(coverage=args.coverage),
        base=made,
        split=split,
    )
    scored = seernet_scored(tuned, split.test, time.monotonic() - started)
    return {
        "architectures": len(chosen),
        "rows": len(split.train),
        "split": split.describe(),
        "scores": score(scored, split.test, metrics),
    }


def print_observed(gpu: str, zero_shot: dict[str, Any], found: Sequence[dict[str, Any]]) -> None:
    """Step-time MAPE / within 10 % / coverage on a GPU left out, by observed architectures."""
    print(f"\n### {gpu}: fine-tuned on the step times of N observed architectures")
    print("| observed architectures (rows) | metric | MAPE % | within 10 % | bound covers % |")
    print("|---|---|---:|---:|---:|")
    cells = [
        ("0 (zero-shot)", zero_shot),
        *((f"{f['architectures']} ({f['rows']})", f["scores"]) for f in found),
    ]
    for label, scores in cells:
        for key, cell in scores.items():
            metric, _, group = key.partition(" | ")
            if not metric.endswith("step_time_s") or group != f"gpu {gpu}":
                continue
            covered = f"{cell['coverage']:.0f}" if "coverage" in cell else "-"
            print(f"| {label} | {metric} | {cell['mape']:.1f} | {cell['acc10']:.0f} | {covered} |")


UNSEEN_SOURCE: str = "step-time bounds on a GPU without step labels widened"


def with_unseen_gpu_margins(made: checkpoint.Checkpoint, path: Path) -> checkpoint.Checkpoint:
    """`made` with the unseen-GPU margin a gpus run wrote (`--unseen-gpu-margins-out`) on both
    step-time metrics: it was measured on inference, the only step time measured on more than
    one GPU, and a GPU's own clocks and memory slow training's kernels as they slow
    inference's (an assumption no data here checks)."""
    found = json.loads(path.read_text())
    extra = float(found["log_margin"])
    step = tuple(m for m in made.metrics if m.endswith("step_time_s"))
    kept = tuple(x for x in made.sources if not x.startswith(UNSEEN_SOURCE))
    said = (
        f"{UNSEEN_SOURCE} x{math.exp(extra):.3f}: the excess over their own margins of "
        f"{found['configurations']} configurations' {found['measured_on']} on "
        f"{len(found['gpus'])} GPUs, each left out in turn ({', '.join(found['gpus'])})"
    )
    return dataclasses.replace(
        made, unseen_gpu_margins=dict.fromkeys(step, extra), sources=(*kept, said)
    )


def boundary_table(entries: Sequence[dict[str, Any]], title: str) -> dict[str, dict[str, Any]]:
    """Memory against the public out-of-memory boundaries (goals: the bound at the failed batch
    exceeds the card in 95 %, the point at the batch that ran fits in 90 %, `--max-batch` in
    the measured interval in 80 %), for SeerNet-Multi, and on the same boundaries the
    derivation and the live-tensor peak with the runtime's documented context, where both
    batches were derived.

    Rows score the boundaries whose failure is memory evidence: no kernel limit explains it
    (`kernel_limits`: the failed batch launches an attention grid above 65,535 or a depthwise
    convolution tensor of 2^31 elements the batch that ran did not), and no run of the same job
    shows the failed batch fits the card (`public_gpu.memory_contradictions`); "every boundary"
    keeps those too.

    SeerNet-Multi's rows are the served predictions: a batch past a launch limit
    (`Prediction.launch_limits`, read off the export) counts as predicted to fail whatever its
    memory. `--max-batch` answers the largest batch whose upper bound fits and that launches,
    so it lands in the interval when the batch that ran does both and the one that failed does
    neither; a single figure (the derivation, the live-tensor peak) is its own bound."""
    derived: dict[tuple[str, int, str, int, str], gpu_samples.Derivation] = {
        (d.model, d.img, d.mode, d.batch, d.runtime): d
        for d in gpu_samples._derivations(SOURCES.derivations)
    }
    contexts = {"torch1-cuda11": 1200 << 20, "torch2-cuda12": 500 << 20}
    rows: dict[str, list[tuple[bool, bool, bool]]] = collections.defaultdict(list)
    for e in entries:
        if "error" in e:
            continue
        capacity = e["capacity"]
        # a batch the prediction says cannot launch is answered as failing, as the product does
        fails = e["fail_upper"] > capacity or e.get("fail_launch", False)
        launches = not e.get("fit_launch", False)
        verdict = (
            fails,
            launches and e["fit_point"] <= capacity,
            fails and launches and e["fit_upper"] <= capacity,
        )
        rows["seernet-multi | every boundary"].append(verdict)
        if not memory_evidence(e):
            continue
        groups = ["all", f"{e['gpu']} {e['mode']} {e['runtime']}", e["runtime"], e["family"]]
        for group in groups:
            rows[f"seernet-multi | {group}"].append(verdict)
        fit = derived.get((e["model"], e["img"], e["mode"], e["fit"], e["runtime"]))
        fail = derived.get((e["model"], e["img"], e["mode"], e["fail"], e["runtime"]))
        if fit is None or fail is None:
            continue
        context = contexts[e["runtime"]]
        rows[f"seernet-multi (derived subset) | {e['runtime']}"].append(verdict)
        for name, value in (("derived", "required"), ("live-tensor peak", "allocated")):
            exceeds = getattr(fail, value) + context > capacity
            fits = getattr(fit, value) + context <= capacity
            rows[f"{name} | {e['runtime']}"].append((exceeds, fits, exceeds and fits))
    table: dict[str, dict[str, Any]] = {}
    print(f"\n### memory at the public out-of-memory boundaries ({title})\n")
    print("| model | rows | n | failed batch: bound > card | ran batch: point fits | --max-batch |")
    print("|---|---|---:|---:|---:|---:|")
    for key in sorted(rows):
        verdicts = rows[key]
        n = len(verdicts)
        cell = {
            "n": n,
            "fail_exceeds": 100 * sum(v[0] for v in verdicts) / n,
            "fit_fits": 100 * sum(v[1] for v in verdicts) / n,
            "max_batch": 100 * sum(v[2] for v in verdicts) / n,
        }
        table[key] = cell
        print(
            f"| {key} | {n} | {cell['fail_exceeds']:.1f} % | {cell['fit_fits']:.1f} % | "
            f"{cell['max_batch']:.1f} % |"
        )
    return table


if __name__ == "__main__":
    raise SystemExit(main())
