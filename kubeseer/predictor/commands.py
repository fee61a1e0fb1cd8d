"""`kubeseer graph`: what kubeseer sees in an ONNX model, before any prediction.

Heavy imports (onnx, onnx-tool, rich) happen inside the handlers so that `kubeseer --help`
stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeseer import cli_args, prediction, units
from kubeseer.predictor import targets

if TYPE_CHECKING:
    from kubeseer.predictor import checkpoint, perfgraph


CKPT_HELP = (
    "checkpoint file, or a shipped one by name: default (learned from GPU labels) or cpu (the "
    "earlier one learned from CPU measurements); default: default"
)


def register(subparsers: Any) -> None:
    """Add the predictor's subcommands to the top-level parser."""
    graph = subparsers.add_parser(
        "graph",
        help="extract the PerfGraph of an ONNX model and summarise it",
        description="Binds the batch size (and any --input dimensions), extracts the PerfGraph "
        "and prints its size, compute, memory traffic and heaviest operators. "
        "Feature definitions: docs/perfgraph.md.",
    )
    graph.add_argument("model", type=Path, help="ONNX file (external weight data is not read)")
    graph.add_argument("--batch", type=cli_args.positive_int, required=True, help="batch size")
    graph.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        type=cli_args.input_binding,
        metavar="NAME=VALUE",
        help="bind another symbolic input dimension, e.g. --input seq=128 (repeatable)",
    )
    graph.add_argument("--json", action="store_true", help="print one JSON object instead")
    graph.add_argument(
        "--top",
        type=cli_args.positive_int,
        default=10,
        help="operators to list by FLOPs (default: 10)",
    )
    graph.set_defaults(handler=_graph)
    _register_model_commands(subparsers)


def _graph(args: argparse.Namespace) -> int:
    """Extract, then print a table or JSON; a bad model is one line on stderr and exit code 2."""
    from kubeseer.predictor import errors, extract

    bindings = dict(args.inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", errors.ExtractionWarning)
        try:
            graph = extract.from_onnx(args.model, batch_size=args.batch, inputs=bindings or None)
        except errors.GraphError as e:
            print(f"kubeseer graph: {args.model}: {e}", file=sys.stderr)
            return 2
    for warning in caught:
        print(f"kubeseer graph: warning: {warning.message}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary(graph, args.model, top=args.top), indent=2))
    else:
        _print_table(graph, args.model, top=args.top)
    return 0


def summary(graph: perfgraph.PerfGraph, model: Path, *, top: int) -> dict[str, Any]:
    """The JSON form of `kubeseer graph --json`."""
    from kubeseer.predictor import schema

    return {
        "model": str(model),
        "model_digest": graph.model_digest,
        "schema_version": graph.schema_version,
        "batch_size": graph.batch_size,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "flops": graph.flops,
        "params": graph.params,
        "mac": graph.mac,
        "arithmetic_intensity": graph.flops / graph.mac if graph.mac else 0.0,
        "node_feature_dim": len(schema.NODE_FEATURES),
        "edge_feature_dim": len(schema.EDGE_FEATURES),
        "global_feature_dim": len(schema.GLOBAL_FEATURES),
        "global_features": graph.global_dict(),
        "unknown_ops": list(graph.unknown_ops),
        "top_operators": _top_operators(graph, top),
    }


def _top_operators(graph: perfgraph.PerfGraph, top: int) -> list[dict[str, Any]]:
    from kubeseer.predictor import schema

    column = {name: i for i, name in enumerate(schema.NODE_FEATURES)}
    x = graph.node_features
    order = sorted(range(graph.num_nodes), key=lambda i: (-x[i, column["flops"]], i))[:top]
    return [
        {
            "name": graph.node_names[i],
            "op_type": graph.op_types[i],
            "flops": int(x[i, column["flops"]]),
            "flops_share": float(x[i, column["flops_share"]]),
            "mac_bytes": int(x[i, column["mac_bytes"]]),
            "arithmetic_intensity": float(x[i, column["arithmetic_intensity"]]),
        }
        for i in order
    ]


def _print_table(graph: perfgraph.PerfGraph, model: Path, *, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    overview = Table(
        title=f"PerfGraph of {model.name} at batch {graph.batch_size}", show_header=False
    )
    overview.add_column("quantity")
    overview.add_column("value", justify="right")
    ai = graph.flops / graph.mac if graph.mac else 0.0
    for name, value in (
        ("nodes", f"{graph.num_nodes:,}"),
        ("edges", f"{graph.num_edges:,}"),
        ("GFLOPs", f"{graph.flops / 1e9:,.3f}"),
        ("parameters", f"{graph.params:,}"),
        ("memory access (MB)", f"{graph.mac / 1e6:,.1f}"),
        ("arithmetic intensity (FLOP/byte)", f"{ai:,.2f}"),
        ("unknown operators", ", ".join(graph.unknown_ops) or "none"),
        ("sha256", graph.model_digest[:16] + "…"),
    ):
        overview.add_row(name, value)
    console.print(overview)
    ops = Table(title=f"top {top} operators by FLOPs")
    for header in ("node", "op", "GFLOPs", "share", "MAC (MB)", "FLOP/byte"):
        ops.add_column(header, justify="left" if header in ("node", "op") else "right")
    for op in _top_operators(graph, top):
        ops.add_row(
            op["name"],
            op["op_type"],
            f"{op['flops'] / 1e9:,.3f}",
            f"{100 * op['flops_share']:.1f}%",
            f"{op['mac_bytes'] / 1e6:,.2f}",
            f"{op['arithmetic_intensity']:.2f}",
        )
    console.print(ops)


def _register_model_commands(subparsers: Any) -> None:
    """`predict`, `train` and `eval`: the model side of the predictor."""
    predict = subparsers.add_parser(
        "predict",
        help="predict GPU memory, SM utilisation and step time of an ONNX model",
        description="Point estimates and calibrated upper bounds from the shipped (or a given) "
        "checkpoint. With --max-batch, the largest batch that fits each GPU and MIG profile.",
    )
    predict.add_argument("model", type=Path, help="ONNX file")
    size = predict.add_mutually_exclusive_group(required=True)
    size.add_argument("--batch", type=cli_args.positive_int, help="batch size")
    size.add_argument(
        "--max-batch", action="store_true", help="largest batch per GPU/MIG profile (needs --gpu)"
    )
    predict.add_argument(
        "--gpu",
        help="the GPU or MIG slice to predict for, e.g. a100-80gb, H100-80GB-SXM, "
        "H100-SXM5-80GB/3g.40gb, RTX-4090 (default: a whole H100 SXM; memory is the same on "
        "every GPU, step time is not)",
    )
    predict.add_argument("--mode", choices=("train", "infer"), default="train")
    predict.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    predict.add_argument(
        "--optimizer", choices=("adam", "sgd"), default="adam", help="training optimizer"
    )
    predict.add_argument(
        "--attention",
        choices=[kernel.value for kernel in prediction.Attention],
        default="auto",
        help="the kernel the job's attention runs: auto is PyTorch's choice on an SM80+ GPU "
        "(scaled_dot_product_attention fused, attention written by hand as written); flash or "
        "efficient fuse every attention, math none (scaled_dot_product_attention in fp32, as "
        "PyTorch 2.5+ runs it), written none and none in fp32: PyTorch 1.x (docs/predictor.md)",
    )
    predict.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        type=cli_args.input_binding,
        metavar="NAME=VALUE",
    )
    predict.add_argument("--ckpt", type=Path, help=CKPT_HELP)
    predict.add_argument("--json", action="store_true", help="print JSON")
    predict.set_defaults(handler=_predict)

    train = subparsers.add_parser(
        "train",
        help="train SeerNet-Multi on a measured dataset and write a checkpoint",
        description="Paper settings: Adam 1e-3, batch 128, LR halved after 5 stalled epochs "
        "down to 1e-6, MSE on log-standardised targets, early stopping on validation MAPE.",
    )
    train.add_argument("--data", type=Path, required=True, help="dataset directory (Parquet)")
    train.add_argument("--out", type=Path, required=True, help="checkpoint file to write")
    train.add_argument("--metrics", nargs="+", help="metrics to learn (default: all labelled)")
    _split_arguments(train)
    train.add_argument("--epochs", type=cli_args.positive_int, default=500, help="maximum epochs")
    train.add_argument(
        "--patience", type=cli_args.positive_int, default=30, help="early-stop patience"
    )
    train.add_argument("--time-limit", type=float, help="stop after this many seconds")
    train.add_argument("--batch-size", type=cli_args.positive_int, default=128)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument(
        "--device",
        help="device slug[/label source], or several separated by commas, when DIR holds "
        "several; default: its only one, or with a device-aware --init checkpoint every one "
        "(each sample reads its own GPU or MIG slice: a cluster's observations of several)",
    )
    train.add_argument("--optimizer", help="learn only this training-mode optimizer's labels")
    train.add_argument(
        "--memory-label",
        choices=[m.value for m in targets.MemoryLabel],
        help="learn memory from the device's own label (NVML used, CPU RSS growth; the default) "
        "or from the allocator peak of live tensors (the same on every device; derived rows "
        "have only it)",
    )
    train.add_argument(
        "--init",
        type=Path,
        metavar="CKPT",
        help="fine-tune: start from CKPT's weights and normalisation, keeping its architecture, "
        "feature ablations, priors and memory label (the flags that set those are ignored); "
        "DATA may label fewer metrics than CKPT predicts (--metrics picks among them)",
    )
    train.add_argument(
        "--replay",
        type=Path,
        metavar="DIR",
        help="with --init: also train on these rows of what CKPT learned from (a dataset "
        "directory), so that a fine-tune on a few families' observations keeps the others; "
        "they join every part of the split (docs/feedback.md)",
    )
    train.add_argument(
        "--replay-device",
        help="device[/label source] of --replay, chosen as --device chooses DATA's",
    )
    train.add_argument(
        "--tune",
        choices=("auto", "heads", "network"),
        default="auto",
        help="with --init: 'heads' trains only the heads of the metrics DATA labels and keeps "
        "CKPT's block and every other head, so the result predicts all CKPT's metrics; "
        "'network' trains the whole network and keeps only the metrics DATA labels; 'auto' "
        "(default) is 'heads' where DATA labels fewer metrics than CKPT predicts (a cluster's "
        "observations label memory only; docs/feedback.md), else 'network'",
    )
    train.add_argument(
        "--memory-prior",
        action="store_true",
        help="learn memory as a correction to the analytic estimate (weights, gradients, "
        "optimiser state, live activations) instead of from scratch",
    )
    train.add_argument(
        "--step-prior",
        action="store_true",
        help="learn step time as a correction to an operator-class cost model (FLOPs, bytes "
        "moved and operators per class) fitted on the training split",
    )
    train.add_argument(
        "--no-device-heads",
        action="store_true",
        help="device-aware data: the step-time heads do not read the GPU's specs, which then "
        "reach step time only through the step prior's device law (needs --step-prior). By "
        "default they read them, holding a GPU beyond the step-labelled ones at their edge, "
        "which carries as well to an unseen GPU and better to the seen ones",
    )
    train.add_argument("--model", choices=("seernet_multi", "seernet"), default="seernet_multi")
    train.add_argument("--hidden", type=cli_args.positive_int, default=256, help="MLP width")
    train.add_argument("--no-pcgrad", action="store_true", help="ablation: plain summed loss")
    train.add_argument("--no-synmm", action="store_true", help="ablation: mean pooling")
    train.add_argument("--no-gnpb", action="store_true", help="ablation: no global node")
    train.add_argument(
        "--drop-features", nargs="+", default=[], metavar="GROUP", help="ablation: e.g. node.c"
    )
    train.add_argument("--coverage", type=float, default=0.95, help="upper-bound coverage")
    train.add_argument(
        "--workers", type=cli_args.positive_int, default=1, help="graph export processes"
    )
    train.add_argument("--threads", type=cli_args.positive_int, help="torch threads")
    train.add_argument("--notes", default="", help="free text stored in the checkpoint")
    train.set_defaults(handler=_train)

    evaluate = subparsers.add_parser(
        "eval",
        help="score a checkpoint on a dataset: MAPE, accuracy within 5/10 %%, coverage",
        description="Re-derives the checkpoint's test split (or the one given) and reports per "
        "metric and per family. Exit code 1 when an upper bound covers less than its coverage "
        "minus 2 points.",
    )
    evaluate.add_argument("--ckpt", type=Path, required=True, help=CKPT_HELP)
    evaluate.add_argument("--data", type=Path, required=True)
    _split_arguments(evaluate, default=None)
    evaluate.add_argument(
        "--device",
        help="score on another device[/label source] of DIR (default: the checkpoint's own); "
        "e.g. a CPU-trained allocator-peak checkpoint against derived CUDA allocator peaks",
    )
    evaluate.add_argument("--all", action="store_true", help="score every sample, not the test")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.add_argument("--workers", type=cli_args.positive_int, default=1)
    evaluate.set_defaults(handler=_eval)


def _split_arguments(parser: argparse.ArgumentParser, default: str | None = "random") -> None:
    parser.add_argument("--split", choices=("random", "family"), default=default)
    parser.add_argument("--holdout", help="family held out by --split family")
    parser.add_argument("--seed", type=int, default=None if default is None else 0)


def _predict(args: argparse.Namespace) -> int:
    """One prediction, or the largest batch per GPU/MIG profile."""
    from kubeseer.predictor import api, checkpoint, errors

    try:
        predictor = api.Predictor.load(args.ckpt)
    except checkpoint.CheckpointError as e:
        print(f"kubeseer predict: {e}", file=sys.stderr)
        return 2
    inputs = dict(args.inputs) or None
    try:
        if args.max_batch:
            return _print_max_batch(predictor, args, inputs)
        made = predictor.predict(
            args.model,
            args.batch,
            args.mode,
            args.precision,
            inputs=inputs,
            gpu=args.gpu,
            optimizer=args.optimizer,
            attention=args.attention,
        )
    except errors.PredictionError as e:
        print(f"kubeseer predict: {args.model}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {**_prediction_dict(made), "sources": list(predictor.checkpoint.sources)}, indent=2
            )
        )
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{args.model.name}: {made.mode.value}, batch {made.batch_size}, "
        f"{made.precision.value} (upper bound at {100 * made.coverage:.0f} % coverage)"
    )
    for header in ("metric", "point", "upper"):
        table.add_column(header, justify="left" if header == "metric" else "right")
    mib = units.MIB
    table.add_row(
        "memory (MiB)",
        f"{made.memory_bytes.point / mib:,.1f}",
        f"{made.memory_bytes.upper / mib:,.1f}",
    )
    table.add_row(
        "SM utilisation (%)",
        f"{made.sm_util_percent.point:.1f}",
        f"{made.sm_util_percent.upper:.1f}",
    )
    table.add_row(
        "step time (ms)",
        f"{made.step_time_s.point * 1e3:,.2f}",
        f"{made.step_time_s.upper * 1e3:,.2f}",
    )
    console = Console()
    console.print(table)
    sources = predictor.checkpoint.sources or (f"labels from {made.label_device}",)
    for line in sources:
        console.print(line)
    console.print(made.predictor_version)
    for note in made.warnings:
        console.print(f"[yellow]warning:[/yellow] {note}")
    for limit in made.launch_limits:
        console.print(f"[red]launch limit:[/red] {limit}")
    return 0


def _prediction_dict(made: Any) -> dict[str, Any]:
    def estimate(e: Any) -> dict[str, float]:
        return {"point": e.point, "upper": e.upper}

    return {
        "mode": made.mode.value,
        "batch_size": made.batch_size,
        "precision": made.precision.value,
        "memory_bytes": estimate(made.memory_bytes),
        "sm_util_percent": estimate(made.sm_util_percent),
        "step_time_s": estimate(made.step_time_s),
        "coverage": made.coverage,
        "model_digest": made.model_digest,
        "predictor_version": made.predictor_version,
        "label_device": made.label_device,
        "warnings": list(made.warnings),
        "launch_limits": list(made.launch_limits),
        "step_work": None
        if made.work is None
        else {
            "flops": made.work.flops,
            "bytes_moved": made.work.bytes_moved,
            "kernels": made.work.kernels,
        },
    }


def _print_max_batch(predictor: Any, args: argparse.Namespace, inputs: Any) -> int:
    """The largest batch whose memory upper bound fits each profile of `--gpu` and that
    launches, and the launch limit the next batch crosses where one stopped the answers."""
    from kubeseer.predictor import api

    if not args.gpu:
        print("kubeseer predict: --max-batch needs --gpu", file=sys.stderr)
        return 2
    try:
        gpu_key, limits = _memory_limits(args.gpu)
    except ValueError as e:
        print(f"kubeseer predict: {e}", file=sys.stderr)
        return 2
    job = {"inputs": inputs, "optimizer": args.optimizer, "attention": args.attention}
    answers = predictor.max_batch(args.model, limits, args.mode, args.precision, **job)
    # the batch above the largest answer says whether a launch limit, not memory, stopped it
    beyond = max(answers.values()) + 1
    launch: tuple[str, ...] = ()
    if beyond <= api.MAX_BATCH_CEILING:
        made = predictor.predict(args.model, beyond, args.mode, args.precision, **job)
        launch = made.launch_limits
    if args.json:
        answer = {"gpu": gpu_key, "mode": args.mode, "max_batch": answers}
        print(json.dumps({**answer, "launch_limits": list(launch)}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.model.name}: largest {args.mode} batch on {gpu_key}")
    for header in ("profile", "usable memory (MiB)", "max batch"):
        table.add_column(header, justify="left" if header == "profile" else "right")
    for label, usable in limits.items():
        batch = answers[label]
        shown = f">= {batch:,}" if batch >= api.MAX_BATCH_CEILING else f"{batch:,}"
        table.add_row(label, f"{usable >> 20:,}", shown)
    console = Console()
    console.print(table)
    console.print(
        f"memory upper bound at {100 * predictor.checkpoint.calibration.coverage:.0f} % "
        f"coverage; labels from {predictor.checkpoint.label_device_name}"
    )
    for line in predictor.checkpoint.sources:
        console.print(line)
    for limit in launch:
        console.print(f"[red]launch limit:[/red] {limit}")
    return 0


def _memory_limits(name: str) -> tuple[str, dict[str, int]]:
    """The GPU `name` means and the memory each of its profiles offers a job, by profile label.

    A placement catalogue GPU answers for the whole GPU and every MIG profile; any other GPU
    of the hardware table (an RTX card, a V100, an L4) for the whole card, with the memory a
    CUDA process sees on it, the capacity the public out-of-memory boundaries are scored
    against.

    Raises:
        ValueError: neither knows `name`.
    """
    from kubeseer.hardware import gpus
    from kubeseer.placement import catalogue

    try:
        gpu = catalogue.resolve_product(name)
    except catalogue.CatalogueError as unplaced:
        try:
            spec = gpus.lookup(name)
        except gpus.UnknownGpuError:
            raise ValueError(str(unplaced)) from None
        return spec.key, {"whole GPU": spec.memory_bytes}
    return gpu.key, {p.label: p.usable_memory_bytes for p in (gpu.whole, *gpu.profiles)}


def _rows(args: argparse.Namespace, device: str | None, *, pool: bool) -> list[Any]:
    """DATA's records of `device`, or (`pool`, for a device-aware model) of all its devices."""
    from kubeseer.measure import storage
    from kubeseer.predictor import dataset

    return dataset.select_records(storage.read_records(args.data), device, pool=pool)


def _samples(args: argparse.Namespace, **kwargs: Any) -> tuple[list[Any], Any]:
    from kubeseer.predictor import dataset

    rows = _rows(args, kwargs.pop("device", None), pool=kwargs.get("device_aware", False))
    return dataset.build_samples(rows, progress=True, workers=args.workers, **kwargs)


def _memory_label(asked: str | None, base: checkpoint.Checkpoint | None) -> targets.MemoryLabel:
    """The memory label to learn: a fine-tune's is its base's, which an explicit other one
    contradicts (the memory heads' scale means that label)."""
    if base is None:
        return targets.MemoryLabel(asked or targets.MemoryLabel.DEVICE.value)
    if asked is not None and asked != base.memory_label.value:
        raise ValueError(
            f"the base checkpoint learned {base.memory_label.value} memory, not {asked}"
        )
    return base.memory_label


def _heads_only(tune: str, base: checkpoint.Checkpoint | None, metrics: Sequence[str]) -> bool:
    """Whether a fine-tune trains only heads: asked for, or by default where the data labels
    fewer metrics than the base predicts. Fine-tuned whole on those, the network keeps only
    the labelled metrics, and a checkpoint without a step-time metric cannot serve."""
    if base is None or tune == "network":
        return False
    return tune == "heads" or set(metrics) < set(base.metrics)


def _train(args: argparse.Namespace) -> int:
    """Build samples, train with a live progress bar, save the checkpoint, print the table."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kubeseer.measure import storage
    from kubeseer.predictor import api, checkpoint, dataset, splits, train

    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console()
    for asked, given in (("--tune", args.tune != "auto"), ("--replay", args.replay is not None)):
        if given and not args.init:
            print(
                f"kubeseer train: {asked} fine-tunes a checkpoint: name it with --init",
                file=sys.stderr,
            )
            return 2
    try:
        base = checkpoint.load(api.checkpoint_path(args.init)) if args.init else None
        memory_label = _memory_label(args.memory_label, base)
        memory_prior = base.normaliser.memory_prior if base else args.memory_prior
        device_aware = base.device_aware if base else False
        rows = _rows(args, args.device, pool=device_aware)
        samples, info = dataset.build_samples(
            rows,
            metrics=args.metrics,
            optimizer=args.optimizer,
            memory_label=memory_label,
            memory_prior=memory_prior,
            device_aware=device_aware,
            learnable=base.metrics if base else None,
            progress=True,
            workers=args.workers,
        )
        bounds = dataset.build_bounds(rows, info, memory_prior=memory_prior, workers=args.workers)
        if args.replay is not None:
            replayed, replayed_info = dataset.build_samples(
                dataset.select_records(
                    storage.read_records(args.replay), args.replay_device, pool=device_aware
                ),
                metrics=info.metrics,
                memory_label=memory_label,
                memory_prior=memory_prior,
                device_aware=device_aware,
                progress=True,
                workers=args.workers,
            )
            samples, info = [*samples, *replayed], dataset.joined(info, replayed_info)
    except (checkpoint.CheckpointError, dataset.DatasetError, FileNotFoundError, ValueError) as e:
        print(f"kubeseer train: {e}", file=sys.stderr)
        return 2
    console.print(
        f"{info.samples} samples from {info.records} records of {info.device_name} "
        f"({info.label_source}); {info.censored} out of memory, {len(bounds)} of them learned "
        f"as lower bounds; {len(info.failed)} configurations without a graph; metrics: "
        f"{', '.join(info.metrics)}"
        + (
            f"; left out, no head of the base checkpoint learns them: {', '.join(info.left_out)}"
            if info.left_out
            else ""
        )
    )
    config = train.TrainConfig(
        lr=args.lr,
        batch_size=args.batch_size,
        max_epochs=args.epochs,
        patience=args.patience,
        pcgrad=not args.no_pcgrad,
        seed=args.seed,
        time_limit_s=args.time_limit,
    )
    options = train.Options(
        split=splits.SplitKind(args.split),
        held_out_family=args.holdout,
        kind=args.model,
        hidden_channels=args.hidden,
        synmm=not args.no_synmm,
        gnpb=not args.no_gnpb,
        drop_features=tuple(args.drop_features),
        memory_prior=args.memory_prior,
        step_prior=args.step_prior,
        device_heads=not args.no_device_heads,
        coverage=args.coverage,
        notes=args.notes,
        heads_only=_heads_only(args.tune, base, info.metrics),
    )
    columns = (
        TextColumn("epoch {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("loss {task.fields[loss]:.4f}  val MAPE {task.fields[mape]:.2f} %"),
        TextColumn("lr {task.fields[lr]:.1e}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("train", total=config.max_epochs, loss=0.0, mape=0.0, lr=config.lr)

        def show(log: train.EpochLog) -> None:
            bar.update(task, completed=log.epoch, loss=log.train_loss, mape=log.val_mape, lr=log.lr)

        try:
            made = train.train_checkpoint(
                samples, info, config, options, base=base, on_epoch=show, censored=bounds
            )
        except (splits.SplitError, ValueError) as e:
            print(f"kubeseer train: {e}", file=sys.stderr)
            return 2
    path = checkpoint.save(made, args.out)
    console.print(made.evaluations[0].to_markdown())
    if made.notes and made.notes != args.notes:
        console.print(made.notes)
    console.print(
        f"stopped after {made.train_config['epochs_run']} epochs (best "
        f"{made.train_config['best_epoch']}); checkpoint: {path}"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    """Score a checkpoint on its (or the given) test split; exit 1 on under-coverage."""
    from kubeseer.predictor import api, checkpoint, dataset, evaluate, inference, report, splits

    try:
        ckpt = checkpoint.load(api.checkpoint_path(args.ckpt))
        samples, info = _samples(
            args,
            device=args.device or f"{ckpt.label_device}/{ckpt.label_source}",
            memory_label=ckpt.memory_label,
            memory_prior=ckpt.normaliser.memory_prior,
            device_aware=ckpt.device_aware,
        )
    except (checkpoint.CheckpointError, dataset.DatasetError, FileNotFoundError) as e:
        print(f"kubeseer eval: {e}", file=sys.stderr)
        return 2
    common = tuple(m for m in ckpt.metrics if m in info.metrics)
    if not common:
        print(
            f"kubeseer eval: the data labels {', '.join(info.metrics)}, the checkpoint "
            f"predicts {', '.join(ckpt.metrics)}: nothing to score",
            file=sys.stderr,
        )
        return 2
    samples = dataset.select_metrics(samples, info.metrics, common)
    columns = [ckpt.metrics.index(m) for m in common]
    stored = ckpt.train_config
    kind = args.split or stored.get("split", "random")
    seed = args.seed if args.seed is not None else int(stored.get("seed", 0))
    holdout = args.holdout or stored.get("held_out_family")
    if args.all:
        test, what = samples, "all samples"
    else:
        try:
            split = splits.make_split(samples, kind, seed, holdout, info.training_only)
        except splits.SplitError as e:
            print(f"kubeseer eval: {e}", file=sys.stderr)
            return 2
        test, what = split.test, split.describe()
    predictor = api.Predictor(ckpt)
    bounds = ckpt.calibration

    def points(s: Any) -> Any:
        return inference.predict(predictor.model, ckpt.normaliser, s)

    table = evaluate.evaluate(
        lambda s: points(s)[:, columns],
        test,
        common,
        upper=lambda s: bounds.upper(points(s))[:, columns],
        label=f"{args.ckpt.name} on {what}; labels: {info.device_name} ({info.label_source})",
    )
    short = [
        r
        for r in table.rows
        if r.family == report.ALL_FAMILIES
        and r.coverage is not None
        and r.coverage < bounds.coverage - 0.02
    ]
    if args.json:
        print(table.to_json())
    else:
        print(table.to_markdown())
        if info.digest != ckpt.data_digest:
            print("note: this data differs from the checkpoint's training data (digest)")
    for r in short:
        covered = 100 * (r.coverage or 0.0)
        print(
            f"kubeseer eval: {r.metric} upper bounds cover {covered:.1f} % < "
            f"{100 * bounds.coverage:.0f} % - 2 points",
            file=sys.stderr,
        )
    return 1 if short else 0
