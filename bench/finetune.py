"""How many of a new device's labels does a fine-tune need, against training from scratch?

The first measurements of a new device (a GPU the shipped checkpoint has never seen, or the
profiler's observations of real jobs) will be few. `kubeseer train --init` starts from the
shipped checkpoint's weights instead of from random ones. This compares, on the same new-device
labels and the same test rows:

- zero-shot: the shipped checkpoint as it is (what users get before any new labels);
- the analytic estimate alone (the memory prior, for the new device's kind);
- from scratch: the shipped recipe trained on the new labels only;
- fine-tuned: the same training started from the shipped checkpoint (`train.start_from`).

New-device labels: the derived fake-CUDA H100 allocator peaks (fp32 inference memory;
docs/dataset.md), whose PerfGraphs the CPU dataset already cached. The splits follow the
shipped checkpoint's own: its test configurations are the test rows here (never trained,
validated or calibrated on, by either model), its training configurations are what the new
device's training part is drawn from, at a growing fraction (whole configurations, seeded), and
its validation configurations drive early stopping for every row.

    .venv/bin/python bench/finetune.py [--fractions 0.125,0.25,0.5,1] [--seeds 0,1,2] [--json]
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

import numpy as np
import torch
from torch_geometric.data import Data

from kubeseer.measure import storage
from kubeseer.predictor import (
    api,
    checkpoint,
    dataset,
    evaluate,
    normalise,
    splits,
    targets,
    train,
)

REPO = Path(__file__).resolve().parents[1]
METRIC = "infer.memory_bytes"


def aligned_parts(
    samples: Sequence[Data], ckpt: checkpoint.Checkpoint, cpu: Path
) -> dict[str, list[Data]]:
    """`samples` grouped by the part of the checkpoint's own split their configuration is in."""
    rows = dataset.select_records(storage.read_records(cpu), ckpt.label_device)
    cpu_samples, _ = dataset.build_samples(
        rows, metrics=list(ckpt.metrics), memory_label=ckpt.memory_label
    )
    split = splits.make_split(
        cpu_samples,
        str(ckpt.train_config.get("split", "random")),
        int(ckpt.train_config.get("seed", 0)),
        ckpt.train_config.get("held_out_family"),
    )
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


def mape(predicted: np.ndarray, test: Sequence[Data]) -> float:
    true, _ = evaluate.labels(test)
    return float(100 * evaluate.relative_errors(predicted, true[:, 0]).mean())


def train_row(
    start: tuple[normalise.Normaliser, checkpoint.ModelConfig, torch.nn.Module],
    train_set: list[Data],
    val: list[Data],
    test: list[Data],
    config: train.TrainConfig,
) -> tuple[float, int, float]:
    """Fit from `start` (normaliser, model config, model); test MAPE, epochs and seconds."""
    normaliser, _, model = start
    result = train.fit(model, train_set, val, config, metrics=(METRIC,), normaliser=normaliser)
    return mape(result.predict(test)[:, 0], test), len(result.history), result.seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, default=None, help="default: the shipped one")
    parser.add_argument(
        "--derived",
        type=Path,
        default=REPO / "data" / "cuda-nvidia-h100-80gb-hbm3-derived-fake-cuda-allocator",
    )
    parser.add_argument("--cpu", type=Path, default=REPO / "data" / "cpu-amd-epyc")
    parser.add_argument("--fractions", default="0.125,0.25,0.5,1")
    parser.add_argument("--seeds", default="0,1,2", help="draws of the training fraction")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--patience", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    predictor = api.Predictor.load(args.ckpt)
    ckpt = predictor.checkpoint
    derived_rows = storage.read_records(args.derived)
    samples, info = dataset.build_samples(
        derived_rows,
        metrics=[METRIC],
        memory_label=ckpt.memory_label,
        memory_prior=ckpt.normaliser.memory_prior,
        graph_fn=dataset.cached_only(derived_rows),
    )
    parts = aligned_parts(samples, ckpt, args.cpu)
    test = parts["test"]
    shipped = train.predict(predictor.model, ckpt.normaliser, test)
    zero_shot = mape(shipped[:, ckpt.metrics.index(METRIC)], test)
    prior_column = targets.METRICS.index(METRIC)
    analytic = mape(np.array([float(s.prior_log[0, prior_column].exp()) for s in test]), test)
    print(
        f"{ckpt.label_device_name} ({ckpt.memory_label.value} memory) -> {info.device_name} "
        f"({info.label_source}): {len(parts['train'])} training, {len(parts['val'])} "
        f"validation, {len(test)} test rows; zero-shot {zero_shot:.2f} %, analytic estimate "
        f"{analytic:.2f} %\n",
        file=sys.stderr,
    )
    options = train.Options(
        memory_prior=ckpt.normaliser.memory_prior,
        step_prior=False,
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
                train.fresh_start(chosen, (METRIC,), options, seed),
                chosen,
                parts["val"],
                test,
                config,
            )
            tuned = train_row(
                train.start_from(ckpt, chosen, (METRIC,)), chosen, parts["val"], test, config
            )
            results.append(
                {
                    "fraction": fraction,
                    "seed": seed,
                    "configurations": len({str(s.config_hash) for s in chosen}),
                    "samples": len(chosen),
                    "scratch": {"mape": scratch[0], "epochs": scratch[1], "seconds": scratch[2]},
                    "fine_tuned": {"mape": tuned[0], "epochs": tuned[1], "seconds": tuned[2]},
                }
            )
            print(
                f"  fraction {fraction:g}, seed {seed}: {len(chosen)} samples; scratch "
                f"{scratch[0]:.2f} %, fine-tuned {tuned[0]:.2f} % "
                f"({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
    print(
        "| training configurations (samples) | from scratch | fine-tuned | scratch / fine-tuned |"
        "\n|---|---:|---:|---:|"
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
        f"\ntest MAPE % of {METRIC} on {len(test)} rows, mean over seeds {args.seeds}; "
        f"zero-shot {zero_shot:.2f} %, analytic estimate {analytic:.2f} %"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "zero_shot": zero_shot,
                    "analytic": analytic,
                    "test_rows": len(test),
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
