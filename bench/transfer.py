"""Does memory learned from CPU allocator peaks transfer to CUDA allocator peaks?

The shipped checkpoint learns memory as the allocator peak of live tensors on a CPU
(docs/predictor.md, "Which memory"). The derived fake-CUDA rows hold the same quantity for an
H100, for fp32 inference at batch sizes 1-512. This scores the checkpoint's inference memory
on those rows, split by whether the configuration was in the checkpoint's own test split (never
trained, validated or calibrated on), in its other parts, or never in the CPU data at all, and
by batch size (the CPU data stops at 32).

    .venv/bin/python bench/transfer.py [--ckpt CKPT] [--derived DIR] [--cpu DIR] [--export]

Without --export only configurations whose PerfGraphs are already cached are scored (exporting
the rest takes about 8 s per configuration).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kubeseer.measure import storage
from kubeseer.predictor import api, dataset, splits, train

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
    args = parser.parse_args(argv)

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
    predicted = train.predict(predictor.model, ckpt.normaliser, samples)
    predicted = predicted[:, ckpt.metrics.index(METRIC)]
    true = np.array([float(s.y[0, 0]) for s in samples])
    errors = np.abs(predicted - true) / true

    cpu_rows = dataset.select_records(storage.read_records(args.cpu), ckpt.label_device)
    cpu_samples, _ = dataset.build_samples(
        cpu_rows, metrics=list(ckpt.metrics), memory_label=ckpt.memory_label
    )
    split = splits.make_split(
        cpu_samples,
        str(ckpt.train_config.get("split", "random")),
        int(ckpt.train_config.get("seed", 0)),
        ckpt.train_config.get("held_out_family"),
    )
    test = {str(s.config_hash) for s in split.test}
    seen = {str(s.config_hash) for s in (*split.train, *split.val, *split.calibration)}
    hashes = np.array([str(s.config_hash) for s in samples])
    batches = np.array([int(s.job_batch_size) for s in samples])
    in_test, in_seen = np.isin(hashes, sorted(test)), np.isin(hashes, sorted(seen))

    print(
        f"{ckpt.label_device_name} ({ckpt.memory_label.value} memory) -> {info.device_name} "
        f"({info.label_source}): {len(samples)} of {len(derived_rows)} rows scored"
        + ("" if args.export else " (PerfGraphs already cached)")
        + "\n"
    )
    print("| rows | n | MAPE % | acc@10 % |\n|---|---:|---:|---:|")
    print(line("all", errors))
    print(line("configurations of the checkpoint's test split", errors[in_test]))
    print(line("configurations it trained, validated or calibrated on", errors[in_seen]))
    print(line("configurations never in the CPU data", errors[~(in_test | in_seen)]))
    for batch in sorted(set(batches.tolist())):
        print(line(f"batch {batch}", errors[batches == batch]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
