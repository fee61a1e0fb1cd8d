"""How accurate is SeerNet-Multi, and does it beat every baseline on the same data and splits?

Trains and evaluates, on the measured dataset and on both splits (the paper's random 2:1:1 over
configurations, and leave-one-family-out), every model below with the same training loop
(`train.fit`), the same normalisation and the same evaluation (`evaluate.evaluate`):

- seernet: PerfSeer's SeerNet, one model per metric as in the paper (params summed; the
  per-metric models share the row's time budget, so every row gets the same compute);
- seernet-multi: SeerNet-Multi, one model with a head per metric, trained with PCGrad;
- seernet-multi-prior: the same, its memory heads learning the correction to the analytic
  estimate (`kubeseer.predictor.prior`) rather than memory from scratch, served never below
  the estimate (`train.predict`, as for the shipped checkpoint);
- seernet-multi-priors: the same with a step-time prior too, its step heads learning the
  correction to the operator-class cost model (`kubeseer.predictor.cost_model`);
- pmgns: DIPPM's GraphSAGE + static features (one multi-output model, i.e. PMGNS-Multi);
- eagle: BRP-NAS's GCN with PerfSeer features (Eagle-s);
- mlp-node: PerfSeer's padded-node-features MLP;
- global-mlp: an MLP on the global features (DNNAbacus/Augur style);
- gbdt: gradient-boosted trees on the global features (Liquid/Horus style);
- analytic: the analytic memory estimator (memory metrics only): tensor bytes for allocator
  labels, with the device constant calibrated on the training split for device labels;
- step-cost: the operator-class cost model alone (step metrics only), fitted on the training
  split.

Every trained model gets the same protocol: the paper's optimiser settings at 32 graphs per
batch, trained until validation MAPE has not improved for --patience epochs (at most --epochs),
so each model is compared at its own convergence, not at an equal wall-clock budget (PCGrad's
per-task backward passes make an epoch of SeerNet-Multi about 3x dearer; the table prints
seconds and epochs so the cost is visible). --minutes-per-model adds an optional cap.

Memory is learned from the allocator peak by default (--memory-label), as the shipped
checkpoint does; on CPU data the utilisation label measures the other processes of a shared
machine and is left out unless --metrics names it.

Prints one table (model, parameters, MAPE and accuracy within 10 % per metric, mean MAPE over
the metrics the model predicts, seconds and epochs) and, with --json, writes every evaluation
table. The data's device and label source head the output: CPU-measured labels say nothing
about GPU accuracy.

    .venv/bin/python bench/accuracy.py [DATA] [--device SLUG] [--splits random,family]
        [--holdout FAMILY|all] [--models seernet-multi,pmgns,...] [--json PATH]

Cost on a 2-core machine: the first run exports every configuration to ONNX and extracts its
graphs (about 8 s per configuration per worker; cached under the dataset's cache directory).
Training to convergence on the 1,870 samples of data/cpu-amd-epyc takes about 10-25 minutes
for SeerNet-Multi and SeerNet and 2-10 minutes for each other network per split, seconds for
the trees and the analytic estimator.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from kubeseer.measure import records as records_lib
from kubeseer.measure import storage
from kubeseer.prediction import Mode, Precision
from kubeseer.predictor import (
    analytic_memory,
    cost_model,
    dataset,
    evaluate,
    normalise,
    prior,
    report,
    schema,
    seernet,
    splits,
    targets,
    train,
)
from kubeseer.predictor.baselines import (
    eagle_gcn,
    global_regressor,
    mlp_node,
    pmgns,
)

REPO = Path(__file__).resolve().parents[1]
MODELS = (
    "seernet",
    "seernet-multi",
    "seernet-multi-prior",
    "seernet-multi-priors",
    "pmgns",
    "eagle",
    "mlp-node",
    "global-mlp",
    "gbdt",
    "analytic",
    "step-cost",
)
PredictFn = evaluate.PredictFn
GLOBAL_NAMES = (*schema.GLOBAL_FEATURES, *targets.EXTRA_GLOBAL_FEATURES)


@dataclass
class Outcome:
    """One model on one split."""

    split: str
    model: str
    params: int | None
    seconds: float
    epochs: int | None
    table: report.EvaluationTable


# ---- data ---------------------------------------------------------------------------------


def choose_rows(rows: Sequence[records_lib.Record], device: str | None) -> list[records_lib.Record]:
    """The records of one device and label source; by default the (single) CPU dataset."""
    groups = collections.Counter(f"{r.device.slug()}/{r.label_source.value}" for r in rows)
    if device is None:
        cpu = [g for g in groups if g.startswith("cpu")]
        if len(groups) > 1 and len(cpu) != 1:
            raise SystemExit(f"data holds {dict(groups)}; choose one with --device")
        device = cpu[0] if len(groups) > 1 else next(iter(groups))
    return dataset.select_records(rows, device)


def subsample(samples: list[Data], max_samples: int | None, seed: int) -> list[Data]:
    """Whole configurations, drawn with `seed`, until `max_samples` samples are reached."""
    if max_samples is None or len(samples) <= max_samples:
        return samples
    by_config: dict[str, list[Data]] = collections.defaultdict(list)
    for s in samples:
        by_config[str(s.config_hash)].append(s)
    hashes = sorted(by_config)
    random.Random(seed).shuffle(hashes)
    kept: list[Data] = []
    for h in hashes:
        if len(kept) >= max_samples:
            break
        kept += by_config[h]
    return kept


# ---- models -------------------------------------------------------------------------------


def build_network(name: str, sample: Data, num_metrics: int) -> torch.nn.Module:
    """The torch model `name` sized for `sample`'s features and `num_metrics` outputs."""
    dv, de, dg = sample.x.size(1), sample.edge_attr.size(1), sample.u.size(1)
    if name == "seernet":
        return seernet.SeerNet(dv, de, dg, out_channels=num_metrics)
    if name.startswith("seernet-multi"):
        return seernet.SeerNetMulti(dv, de, dg, num_tasks=num_metrics)
    if name == "pmgns":
        return pmgns.PMGNS(
            dv, dg, num_metrics, static_index=pmgns.dippm_static_columns(GLOBAL_NAMES)
        )
    if name == "eagle":
        return eagle_gcn.EagleGCN(dv, dg, num_metrics)
    if name == "mlp-node":
        return mlp_node.MLPNode(dv, num_metrics)
    if name == "global-mlp":
        return global_regressor.GlobalMLP(dg, num_metrics)
    raise ValueError(f"{name} is not a torch model")


def fit_network(
    name: str, split: splits.Split, metrics: tuple[str, ...], config: train.TrainConfig
) -> tuple[PredictFn, int, int]:
    """Train `name` (one model per metric for SeerNet); returns predictor, parameters, epochs.

    Every network is initialised from `config.seed`, as `kubeseer train` does, so a row does not
    depend on which rows ran before it and the SeerNet-Multi rows reproduce the checkpoints
    `kubeseer train` writes with the same recipe and seed.
    """
    if name == "seernet":
        results = []
        if config.time_limit_s is not None:
            config = replace(config, time_limit_s=config.time_limit_s / len(metrics))
        for metric in metrics:
            torch.manual_seed(config.seed)
            model = build_network(name, split.train[0], 1)
            train_k = dataset.select_metrics(split.train, metrics, (metric,))
            val_k = dataset.select_metrics(split.val, metrics, (metric,))
            results.append(train.fit(model, train_k, val_k, config, metrics=(metric,)))

        def predict_all(samples: Sequence[Data]) -> np.ndarray:
            return np.concatenate([r.predict(samples) for r in results], axis=1)

        params = sum(seernet.parameter_count(r.model) for r in results)
        return predict_all, params, max(len(r.history) for r in results)
    torch.manual_seed(config.seed)
    model = build_network(name, split.train[0], len(metrics))
    # Only SeerNet-Multi uses PCGrad: the baselines are the paper's plain multi-head variants
    # (PerfSeer Fig. 6 compares SeerNet-Multi with PMGNS-Multi trained without it).
    multi = name.startswith("seernet-multi")
    result = train.fit(
        model,
        split.train,
        split.val,
        replace(config, pcgrad=multi),
        metrics=metrics,
        normaliser=normalise.Normaliser.fit(
            split.train,
            metrics,
            prior=name.endswith(("-prior", "-priors")),
            step_prior=name.endswith("-priors"),
        ),
    )
    return result.predict, seernet.parameter_count(result.model), len(result.history)


def analytic_device(info: dataset.DatasetInfo) -> analytic_memory.DeviceProfile:
    """The device profile whose constants fit the data's device best (then calibrated)."""
    if info.device.startswith("cpu"):
        return analytic_memory.DEVICE_PROFILES["cpu"]
    name = info.device_name.lower()
    for profile, needles in (
        ("h200", ("h200",)),
        ("h100-80gb", ("h100",)),
        ("a100-80gb", ("a100", "80")),
        ("a100-40gb", ("a100",)),
        ("l4", ("l4",)),
        ("t4", ("t4",)),
    ):
        if all(n in name for n in needles):
            return analytic_memory.DEVICE_PROFILES[profile]
    return analytic_memory.DEFAULT_DEVICE


def fit_analytic(
    split: splits.Split,
    metrics: tuple[str, ...],
    graphs: dict[tuple[str, int], analytic_memory.MemoryGraph],
    info: dataset.DatasetInfo,
) -> PredictFn:
    """The analytic estimator for the memory metrics.

    An allocator peak has no runtime constants: the estimate is its tensor bytes, with the
    input batch where the labels count it (`targets.memory_counts_batch`). A device label
    includes the runtime, whose constant is calibrated on the training split.
    """
    columns = {
        k: Mode(targets.split_metric(m)[0])
        for k, m in enumerate(metrics)
        if targets.split_metric(m)[1] == "memory_bytes"
    }
    if not columns:
        raise ValueError("the data has no memory metric for the analytic estimator")
    device = analytic_device(info)

    def breakdown(s: Data, mode: Mode) -> analytic_memory.MemoryBreakdown:
        graph = graphs[(str(s.config_hash), int(s.job_batch_size))]
        return prior.breakdown(graph, mode, Precision(str(s.precision)), str(s.optimizer), device)

    if info.memory_label is targets.MemoryLabel.ALLOCATOR:
        with_batch = targets.memory_counts_batch(
            info.memory_label, info.device_kind, info.label_source
        )

        def estimate(terms: analytic_memory.MemoryBreakdown) -> float:
            return prior.tensor_bytes(terms, with_batch=with_batch)
    else:
        known, observed = [], []
        for s in split.train:
            for k, mode in columns.items():
                if bool(s.y_mask[0, k]):
                    known.append(breakdown(s, mode))
                    observed.append(float(s.y[0, k]))
        context = analytic_memory.calibrate(known, observed, device).context_bytes

        def estimate(terms: analytic_memory.MemoryBreakdown) -> float:
            return terms.total - terms.cuda_context + context

    def predict(samples: Sequence[Data]) -> np.ndarray:
        out = np.full((len(samples), len(metrics)), np.nan)
        for i, s in enumerate(samples):
            for k, mode in columns.items():
                out[i, k] = estimate(breakdown(s, mode))
        return out

    return predict


def fit_step_cost(split: splits.Split, metrics: tuple[str, ...]) -> PredictFn:
    """The operator-class cost model for the step metrics, fitted on the training split."""
    costs = cost_model.fit_samples(split.train, metrics)
    columns = {
        k: mode
        for k, (mode, quantity) in enumerate(map(targets.split_metric, metrics))
        if quantity == "step_time_s" and mode in costs.seconds_per_unit
    }
    if not columns:
        raise ValueError("the data has no step metric with enough labels for the cost model")

    def predict(samples: Sequence[Data]) -> np.ndarray:
        work = torch.cat([s.cost_terms for s in samples])
        out = np.full((len(samples), len(metrics)), np.nan)
        for k, mode in columns.items():
            estimate = costs.log_estimate(mode, work)
            if estimate is not None:
                out[:, k] = estimate.exp().numpy()
        return out

    return predict


def only_scored(table: report.EvaluationTable) -> report.EvaluationTable:
    """Drop the rows of metrics a model does not predict (NaN predictions)."""
    return report.EvaluationTable(
        table.label, tuple(r for r in table.rows if not math.isnan(r.mape))
    )


# ---- report -------------------------------------------------------------------------------

SHORT = {
    "memory_bytes": "mem",
    "sm_util_percent": "util",
    "step_time_s": "time",
}


def short(metric: str) -> str:
    mode, quantity = targets.split_metric(metric)
    return f"{mode} {SHORT[quantity]}"


def human(count: int | None) -> str:
    if count is None:
        return "-"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f}M"
    if count >= 1_000:
        return f"{count / 1e3:.1f}k"
    return str(count)


def markdown(outcomes: Sequence[Outcome], metrics: tuple[str, ...]) -> str:
    """One table: a row per (split, model); each metric cell is "MAPE % (acc@10 %)"."""
    header = (
        "| split | model | params | "
        + " | ".join(short(m) for m in metrics)
        + " | mean MAPE | seconds | epochs |"
    )
    rule = "|---|---|---:|" + "---:|" * (len(metrics) + 3)
    lines = [header, rule]
    for o in outcomes:
        cells = []
        for m in metrics:
            try:
                row = o.table.row(m)
            except KeyError:
                cells.append("-")
                continue
            cells.append(f"{row.mape:.2f} ({100 * row.acc10:.0f})")
        params = human(o.params) + (" leaves" if o.model == "gbdt" else "")
        lines.append(
            f"| {o.split} | {o.model} | {params} | "
            + " | ".join(cells)
            + f" | {o.table.mean_mape():.2f} | {o.seconds:.0f} | "
            + ("-" if o.epochs is None else str(o.epochs))
            + " |"
        )
    return "\n".join(lines)


# ---- main ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", type=Path, default=REPO / "data")
    parser.add_argument("--device", help="device slug[/label source] when DATA holds several")
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated subset of {','.join(MODELS)}",
    )
    parser.add_argument("--splits", default="random,family", help="random, family or both")
    parser.add_argument(
        "--holdout",
        default=None,
        help="families to hold out, comma-separated, one split each ('all': every family; "
        "default: one drawn with --seed)",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        help="metrics to score (default: every labelled one, less CPU utilisation, which on a "
        "shared machine measures the other processes, docs/dataset.md)",
    )
    parser.add_argument(
        "--memory-label",
        choices=[m.value for m in targets.MemoryLabel],
        default=targets.MemoryLabel.ALLOCATOR.value,
        help="record column memory is learned from (default: the allocator peak, as the "
        "shipped checkpoint)",
    )
    parser.add_argument("--epochs", type=int, default=500, help="at most this many epochs")
    parser.add_argument("--patience", type=int, default=30, help="early-stopping patience")
    parser.add_argument("--batch-size", type=int, default=32, help="graphs per training batch")
    parser.add_argument(
        "--minutes-per-model",
        type=float,
        default=None,
        help="optional training time cap of each table row (default: train to early stopping)",
    )
    parser.add_argument("--max-samples", type=int, default=None, help="subsample whole configs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared 2-core machine more threads only spin)",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes exporting graphs")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write results as JSON")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {MODELS}")
    args.splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not set(args.splits) <= {"random", "family"} or not args.splits:
        parser.error("--splits takes random, family or random,family")
    return args


def default_metrics(info: dataset.DatasetInfo) -> list[str]:
    """Every labelled metric, less utilisation on CPUs (contention noise, not the model)."""
    return [
        m
        for m in info.metrics
        if info.device_kind != "cpu" or targets.split_metric(m)[1] != "sm_util_percent"
    ]


def make_splits(samples: list[Data], args: argparse.Namespace) -> list[splits.Split]:
    out = []
    if "random" in args.splits:
        out.append(splits.make_split(samples, "random", args.seed))
    if "family" in args.splits:
        families = sorted({str(s.family) for s in samples})
        if args.holdout == "all":
            held = families
        elif args.holdout is not None:
            held = [f.strip() for f in args.holdout.split(",") if f.strip()]
        else:
            held = [random.Random(args.seed).choice(families)]
        out += [splits.make_split(samples, "family", args.seed, f) for f in held]
    return out


def split_name(split: splits.Split) -> str:
    return split.kind.value + (f" ({split.held_out_family})" if split.held_out_family else "")


def run_model(
    model: str,
    split: splits.Split,
    metrics: tuple[str, ...],
    config: train.TrainConfig,
    memory_graphs: dict[tuple[str, int], analytic_memory.MemoryGraph],
    info: dataset.DatasetInfo,
) -> Outcome:
    """Fit `model` on the split's training part and score it on its test part."""
    started = time.monotonic()
    params: int | None = None
    epochs: int | None = None
    predict: PredictFn
    if model == "gbdt":
        gbdt = global_regressor.GradientBoostedRegressor(seed=config.seed)
        predict = gbdt.fit(split.train, split.val).predict
        params = gbdt.size
    elif model == "analytic":
        predict = fit_analytic(split, metrics, memory_graphs, info)
    elif model == "step-cost":
        predict = fit_step_cost(split, metrics)
    else:
        predict, params, epochs = fit_network(model, split, metrics, config)
    name = split_name(split)
    table = evaluate.evaluate(predict, split.test, metrics, label=f"{model}, {name}")
    return Outcome(name, model, params, time.monotonic() - started, epochs, only_scored(table))


def report_json(
    args: argparse.Namespace,
    info: dataset.DatasetInfo,
    failures: Sequence[str],
    outcomes: Sequence[Outcome],
) -> str:
    """Everything the table shows and more: data provenance, settings, every evaluation."""
    return json.dumps(
        {
            "data": {**asdict(info), "path": str(args.data), "graph_failures": list(failures)},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "results": [
                {
                    "split": o.split,
                    "model": o.model,
                    "params": o.params,
                    "seconds": o.seconds,
                    "epochs": o.epochs,
                    "mean_mape": o.table.mean_mape(),
                    "table": o.table.to_dict(),
                }
                for o in outcomes
            ],
        },
        indent=2,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cache_dir = args.cache_dir or dataset.default_cache_dir()
    rows = choose_rows(storage.read_records(args.data), args.device)
    print(f"preparing graphs of {len(rows)} records ...", file=sys.stderr)
    samples, info = dataset.build_samples(
        rows,
        cache_dir=cache_dir,
        workers=args.workers,
        progress=True,
        memory_label=targets.MemoryLabel(args.memory_label),
        memory_prior=True,
    )
    failures = info.failed
    metrics = tuple(args.metrics or default_metrics(info))
    samples = dataset.select_metrics(samples, info.metrics, metrics)
    samples = subsample(samples, args.max_samples, args.seed)
    print(
        f"data: {args.data} | device: {info.device_name} ({info.device}) | labels: "
        f"{info.label_source} | training optimizers: {', '.join(info.optimizers)}\n"
        f"{info.records} records ({info.censored} censored), {len(samples)} samples of "
        f"{len({str(s.config_hash) for s in samples})} configurations, "
        f"{len({str(s.family) for s in samples})} families; {len(failures)} graphs failed\n"
        f"metrics: {', '.join(metrics)}",
        flush=True,
    )
    cache = dataset.GraphCache(cache_dir)
    memory_graphs = {}
    for s in samples:
        key = (str(s.config_hash), int(s.job_batch_size))
        if key not in memory_graphs and (graph := cache.get_memory(*key)) is not None:
            memory_graphs[key] = graph
    config = train.TrainConfig(
        batch_size=args.batch_size,
        max_epochs=args.epochs,
        patience=args.patience,
        seed=args.seed,
        time_limit_s=None if args.minutes_per_model is None else 60 * args.minutes_per_model,
    )
    outcomes: list[Outcome] = []
    for split in make_splits(samples, args):
        print(f"split {split.describe()}", file=sys.stderr)
        for model in args.models:
            outcome = run_model(model, split, metrics, config, memory_graphs, info)
            outcomes.append(outcome)
            per_metric = ", ".join(
                f"{short(r.metric)} {r.mape:.2f}"
                for r in outcome.table.rows
                if r.family == report.ALL_FAMILIES
            )
            print(
                f"  {model}: mean MAPE {outcome.table.mean_mape():.2f} % ({per_metric}; "
                f"{outcome.seconds:.0f} s"
                + ("" if outcome.epochs is None else f", {outcome.epochs} epochs")
                + ")",
                file=sys.stderr,
            )
            if args.json is not None:  # after every row, so a long run cut short keeps its rows
                args.json.write_text(report_json(args, info, failures, outcomes))
    print()
    print(markdown(outcomes, metrics))
    print(
        "\ncells: MAPE % (accuracy within 10 %, %) on the test split; mean MAPE over the "
        "metrics a model predicts (the analytic estimator: memory only); gbdt params are "
        "fitted leaves at most."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
