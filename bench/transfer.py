"""Does memory learned from CPU allocator peaks transfer to CUDA allocator peaks, as it is and
fine-tuned on a few of them?

The shipped checkpoint learns memory as the allocator peak of live tensors on a CPU
(docs/predictor.md, "Which memory"). The derived fake-CUDA rows hold the same quantity for an
H100, for fp32 inference at batch sizes 1-512.

Zero-shot: the checkpoint's inference memory on those rows, split by whether the configuration
was in the checkpoint's own test split (never trained, validated or calibrated on), in its
other parts, or never in the CPU data at all, and by batch size (the CPU data stops at 32).

Fine-tuned (skip with --no-fine-tune): the first labels of a new device will be few, and
`kubeseer train --init` starts from the checkpoint's weights instead of random ones. On the same
new-device labels and test rows this compares the zero-shot checkpoint, the analytic estimate
alone (for the new device's kind), the shipped recipe trained from scratch on the new labels,
and the same training started from the checkpoint (`train.start_from`). The splits follow the
checkpoint's own: its test configurations are the test rows (neither model has seen them), a
growing fraction of its training configurations (whole configurations, seeded) is the new
device's training part, and its validation configurations stop every row early.

    .venv/bin/python bench/transfer.py [--ckpt CKPT] [--derived DIR] [--cpu DIR] [--export]
        [--no-fine-tune] [--fractions 0.125,0.25,0.5,1] [--seeds 0,1,2] [--json PATH]

Without --export only configurations whose PerfGraphs are already cached are scored (exporting
the rest takes about 8 s per configuration).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch_geometric.data import Data

from kubeseer.measure import storage
from kubeseer.predictor import (
    api,
    checkpoint,
    dataset,
    evaluate,
    inference,
    normalise,
    splits,
    targets,
    train,
)

REPO = Path(__file__).resolve().parents[1]
METRIC = "infer.memory_bytes"


def line(name: str, errors: npt.NDArray[np.float64]) -> str:
    """One Markdown row: samples, MAPE and accuracy within 10 %."""
    if not errors.size:
        return f"| {name} | 0 | - | - |"
    return (
        f"| {name} | {errors.size} | {100 * errors.mean():.2f} | "
        f"{100 * (errors <= 0.1).mean():.1f} |"
    )


def checkpoint_split(ckpt: checkpoint.Checkpoint, cpu: Path) -> splits.Split:
    """The checkpoint's own split, re-derived from its CPU data (kind and seed are stored)."""
    rows = dataset.select_records(storage.read_records(cpu), ckpt.label_device)
    cpu_samples, _ = dataset.build_samples(
        rows, metrics=list(ckpt.metrics), memory_label=ckpt.memory_label
    )
    return splits.make_split(
        cpu_samples,
        str(ckpt.train_config.get("split", "random")),
        int(ckpt.train_config.get("seed", 0)),
        ckpt.train_config.get("held_out_family"),
    )


def zero_shot(
    predictor: api.Predictor, samples: Sequence[Data], split: splits.Split, heading: str
) -> None:
    """Print the checkpoint's error on `samples`, by where their configuration was."""
    ckpt = predictor.checkpoint
    predicted = inference.predict(predictor.model, ckpt.normaliser, samples)
    predicted = predicted[:, ckpt.metrics.index(METRIC)]
    true, _ = evaluate.labels(samples)
    errors = evaluate.relative_errors(predicted, true[:, 0])
    test = {str(s.config_hash) for s in split.test}
    seen = {str(s.config_hash) for s in (*split.train, *split.val, *split.calibration)}
    hashes = np.array([str(s.config_hash) for s in samples])
    batches = np.array([int(s.job_batch_size) for s in samples])
    in_test, in_seen = np.isin(hashes, sorted(test)), np.isin(hashes, sorted(seen))
    print(heading + "\n\n| rows | n | MAPE % | acc@10 % |\n|---|---:|---:|---:|")
    print(line("all", errors))
    print(line("configurations of the checkpoint's test split", errors[in_test]))
    print(line("configurations it trained, validated or calibrated on", errors[in_seen]))
    print(line("configurations never in the CPU data", errors[~(in_test | in_seen)]))
    for batch in sorted(set(batches.tolist())):
        print(line(f"batch {batch}", errors[batches == batch]))


def aligned_parts(samples: Sequence[Data], split: splits.Split) -> dict[str, list[Data]]:
    """`samples` grouped by the part of the checkpoint's split their configuration is in."""
    part_of = {
        str(s.config_hash): name for name in ("train", "val", "test") for s in getattr(split, name)
    }
    parts: dict[str, list[Data]] = {"train": [], "val": [], "test": []}
    for s in samples:
        name = part_of.get(str(s.config_hash))
        if name is not None:
            parts[name].append(s)
    return parts


def fraction_of(samples: Sequence[Data], fraction: float, seed: int) -> list[Data]:
    """Whole configurations, a `fraction` of them drawn with `seed`."""
    hashes = sorted({str(s.config_hash) for s in samples})
    random.Random(seed).shuffle(hashes)
    kept = set(hashes[: max(1, round(fraction * len(hashes)))])
    return [s for s in samples if str(s.config_hash) in kept]


def mape(predicted: npt.NDArray[np.float64], test: Sequence[Data]) -> float:
    true, _ = evaluate.labels(test)
    return float(100 * evaluate.relative_errors(predicted, true[:, 0]).mean())


def train_row(
    start: tuple[normalise.Normaliser, checkpoint.ModelConfig, torch.nn.Module],
    train_set: list[Data],
    parts: dict[str, list[Data]],
    config: train.TrainConfig,
) -> dict[str, float]:
    """Fit from `start` (normaliser, model config, model); test MAPE, epochs and seconds."""
    normaliser, _, model = start
    result = train.fit(
        model, train_set, parts["val"], config, metrics=(METRIC,), normaliser=normaliser
    )
    return {
        "mape": mape(result.predict(parts["test"])[:, 0], parts["test"]),
        "epochs": len(result.history),
        "seconds": result.seconds,
    }


def fine_tune_curve(
    predictor: api.Predictor,
    parts: dict[str, list[Data]],
    fractions: Sequence[float],
    seeds: Sequence[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Train from scratch and fine-tune at each fraction and seed; print the table."""
    ckpt, test = predictor.checkpoint, parts["test"]
    shipped = inference.predict(predictor.model, ckpt.normaliser, test)
    shipped_mape = mape(shipped[:, ckpt.metrics.index(METRIC)], test)
    prior_column = targets.METRICS.index(METRIC)
    analytic = mape(np.array([float(s.prior_log[0, prior_column].exp()) for s in test]), test)
    print(
        f"\nfine-tuning: {len(parts['train'])} training, {len(parts['val'])} validation, "
        f"{len(test)} test rows",
        file=sys.stderr,
    )
    options = train.Options(
        memory_prior=ckpt.normaliser.memory_prior,
        hidden_channels=ckpt.model_config.hidden_channels,
    )
    results = []
    for fraction in fractions:
        for seed in seeds:
            chosen = fraction_of(parts["train"], fraction, seed)
            config = train.TrainConfig(
                batch_size=args.batch_size, patience=args.patience, seed=seed
            )
            started = time.monotonic()
            scratch = train_row(
                train.fresh_start(chosen, (METRIC,), options, seed), chosen, parts, config
            )
            tuned = train_row(train.start_from(ckpt, chosen, (METRIC,)), chosen, parts, config)
            results.append(
                {
                    "fraction": fraction,
                    "seed": seed,
                    "configurations": len({str(s.config_hash) for s in chosen}),
                    "samples": len(chosen),
                    "scratch": scratch,
                    "fine_tuned": tuned,
                }
            )
            print(
                f"  fraction {fraction:g}, seed {seed}: {len(chosen)} samples; scratch "
                f"{scratch['mape']:.2f} %, fine-tuned {tuned['mape']:.2f} % "
                f"({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
    print(
        "\n| training configurations (samples) | from scratch | fine-tuned | "
        "scratch / fine-tuned |\n|---|---:|---:|---:|"
    )
    for fraction in fractions:
        rows = [r for r in results if r["fraction"] == fraction]
        scratch_mean = statistics.mean(r["scratch"]["mape"] for r in rows)
        tuned_mean = statistics.mean(r["fine_tuned"]["mape"] for r in rows)
        size = (
            f"{statistics.mean(r['configurations'] for r in rows):.0f} "
            f"({statistics.mean(r['samples'] for r in rows):.0f})"
        )
        print(
            f"| {size} | {scratch_mean:.2f} | {tuned_mean:.2f} | {scratch_mean / tuned_mean:.2f}x |"
        )
    print(
        f"\ntest MAPE % of {METRIC} on {len(test)} rows, mean over seeds "
        f"{', '.join(map(str, seeds))}; zero-shot {shipped_mape:.2f} %, analytic estimate "
        f"{analytic:.2f} %"
    )
    return {
        "zero_shot": shipped_mape,
        "analytic": analytic,
        "test_rows": len(test),
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, default=None, help="default: the shipped one")
    parser.add_argument(
        "--derived",
        type=Path,
        default=REPO / "data" / "cuda-nvidia-h100-80gb-hbm3-derived-fake-cuda-allocator",
    )
    parser.add_argument("--cpu", type=Path, default=REPO / "data" / "cpu-amd-epyc")
    parser.add_argument("--export", action="store_true", help="export graphs not yet cached")
    parser.add_argument("--no-fine-tune", action="store_true", help="zero-shot table only")
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1")
    parser.add_argument("--seeds", default="0,1,2", help="draws of the training fraction")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--patience", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="write the fine-tuning results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    predictor = api.Predictor.load(args.ckpt)
    ckpt = predictor.checkpoint
    if METRIC not in ckpt.metrics:
        raise SystemExit(f"the checkpoint does not predict {METRIC}")
    derived_rows = storage.read_records(args.derived)
    samples, info = dataset.build_samples(
        derived_rows,
        metrics=[METRIC],
        memory_label=ckpt.memory_label,
        memory_prior=ckpt.normaliser.memory_prior,
        graph_fn=None if args.export else dataset.cached_only(derived_rows),
    )
    split = checkpoint_split(ckpt, args.cpu)
    zero_shot(
        predictor,
        samples,
        split,
        f"{ckpt.label_device_name} ({ckpt.memory_label.value} memory) -> {info.device_name} "
        f"({info.label_source}): {len(samples)} of {len(derived_rows)} rows scored"
        + ("" if args.export else " (PerfGraphs already cached)"),
    )
    if args.no_fine_tune:
        return 0
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    curve = fine_tune_curve(predictor, aligned_parts(samples, split), fractions, seeds, args)
    if args.json is not None:
        args.json.write_text(json.dumps(curve, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
