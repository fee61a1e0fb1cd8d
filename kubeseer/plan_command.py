"""`kubeseer plan`: what a job needs and which devices hold it, cheapest first, before it runs.

The same plan the operator writes to a DLJob's `status.plan`, made from the catalogue instead of
a cluster: every GPU product (or those `--gpu` names) with each MIG profile and the whole GPU,
whether it holds the calibrated upper bound, the predicted slowdown and what it rests on, and
the cost rank. `--json` prints the plan as `status.plan` stores it, with the prediction; `--yaml`
prints the DLJob to submit and the ResourceClaimTemplate a DRA cluster would be asked for.

The predictor (torch) is imported inside the handler, so `kubeseer --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubeseer import cli_args
from kubeseer.placement import catalogue, claims, plan, policy, slowdown

if TYPE_CHECKING:
    from kubeseer import prediction as prediction_mod

IMAGE_PLACEHOLDER = "registry.example/replace-me:latest"
"""The container image of the printed DLJob: a name nobody serves, to be replaced."""

_NO_WRAP = 1 << 16
"""YAML line width: CEL expressions stay on one line each."""


def register(subparsers: Any) -> None:
    """Add `kubeseer plan` to the top-level parser."""
    parser = subparsers.add_parser(
        "plan",
        help="the devices that hold a job, cheapest first, before it runs (no cluster needed)",
        description="Predicts the job with the shipped (or a given) checkpoint and ranks every "
        "GPU and MIG profile of the catalogue: does it hold the calibrated upper bound, how much "
        "slower would the job run, what does a step cost in GPU time. docs/placement.md explains "
        "the columns.",
    )
    parser.add_argument("model", type=Path, help="ONNX file")
    parser.add_argument("--batch", type=cli_args.positive_int, required=True, help="batch size")
    parser.add_argument("--mode", choices=("train", "infer"), required=True)
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        type=cli_args.input_binding,
        metavar="NAME=VALUE",
    )
    parser.add_argument(
        "--gpu",
        dest="gpus",
        action="append",
        default=[],
        metavar="PRODUCT",
        help="GPU product to consider (catalogue key or product label; repeatable; default all)",
    )
    parser.add_argument(
        "--max-slowdown", type=float, default=2.0, help="spec.placement.maxSlowdown"
    )
    parser.add_argument("--coverage", type=float, default=0.95, help="spec.placement.coverage")
    parser.add_argument("--replicas", type=cli_args.positive_int, default=1, help="spec.replicas")
    parser.add_argument(
        "--no-whole-gpu", action="store_true", help="spec.placement.allowWholeGPU: false"
    )
    parser.add_argument(
        "--ckpt",
        type=Path,
        help="checkpoint file, or a shipped one by name: default (GPU labels) or cpu",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the plan as status.plan")
    output.add_argument(
        "--yaml",
        action="store_true",
        help="print the DLJob to submit and the ResourceClaimTemplate it would use under DRA",
    )
    parser.add_argument("--name", help="DLJob name for --yaml (default: the model file's stem)")
    parser.add_argument("--url", help="model URL for --yaml (default: a ConfigMap reference)")
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    """Predict, plan, print; a bad model, checkpoint or option is one line and exit code 2."""
    from kubeseer.predictor import api, checkpoint, errors

    try:
        request = policy.Request(
            coverage=args.coverage,
            max_slowdown=args.max_slowdown,
            gpu_products=tuple(args.gpus),
            allow_whole_gpu=not args.no_whole_gpu,
            replicas=args.replicas,
        )
    except (policy.RequestError, catalogue.CatalogueError) as e:
        print(f"kubeseer plan: {e}", file=sys.stderr)
        return 2
    try:
        predictor = api.Predictor.load(args.ckpt)
        made = predictor.predict(
            args.model,
            args.batch,
            args.mode,
            args.precision,
            inputs=dict(args.inputs) or None,
        )
    except (checkpoint.CheckpointError, errors.PredictionError) as e:
        print(f"kubeseer plan: {args.model}: {e}", file=sys.stderr)
        return 2
    if made.coverage + 1e-9 < request.coverage:
        print(
            f"kubeseer plan: the checkpoint's upper bound covers {made.coverage:.0%}, "
            f"not {request.coverage:.0%}; use --coverage {made.coverage:g} or less",
            file=sys.stderr,
        )
        return 2
    laid_out = build(made, request)
    if args.json:
        print(json.dumps(plan_json(made, laid_out), indent=2))
    elif args.yaml:
        return _print_yaml(args, made, laid_out, request)
    else:
        _print_table(args.model, made, laid_out)
    return 0


def build(made: prediction_mod.Prediction, request: policy.Request) -> plan.Plan:
    """The catalogue's plan for a prediction: what `kubeseer plan` prints."""
    return plan.build(
        made,
        plan.from_catalogue(request.allowed_models()),
        max_slowdown=request.max_slowdown,
        allow_whole_gpu=request.allow_whole_gpu,
        replicas=request.replicas,
    )


def plan_json(made: prediction_mod.Prediction, laid_out: plan.Plan) -> dict[str, Any]:
    """`--json`: the prediction and the plan as `status.plan` stores it."""
    return {
        "prediction": {
            "mode": made.mode.value,
            "batchSize": made.batch_size,
            "precision": made.precision.value,
            "memoryPointBytes": round(made.memory_bytes.point),
            "memoryUpperBytes": round(made.memory_bytes.upper),
            "coverage": made.coverage,
            "smUtilPercent": made.sm_util_percent.point,
            "stepTimeSeconds": made.step_time_s.point,
            "labelDevice": made.label_device,
            "unlearned": list(made.unlearned),
            "modelDigest": made.model_digest,
            "warnings": list(made.warnings),
            "launchLimits": list(made.launch_limits),
        },
        "plan": plan.to_status(laid_out),
    }


def build_dljob(
    args: argparse.Namespace, made: prediction_mod.Prediction, request: policy.Request
) -> dict[str, Any]:
    """The DLJob that asks for this job: the model pinned by its digest, the options given."""
    name = args.name or _dns_name(args.model.stem)
    model: dict[str, Any] = (
        {"url": args.url}
        if args.url
        else {"configMapRef": {"name": f"{name}-model", "key": args.model.name}}
    )
    model["sha256"] = made.model_digest
    spec: dict[str, Any] = {
        "model": model,
        "mode": made.mode.value,
        "batchSize": made.batch_size,
        "precision": made.precision.value,
    }
    if args.inputs:
        spec["inputs"] = dict(args.inputs)
    if request.replicas != 1:
        spec["replicas"] = request.replicas
    placement: dict[str, Any] = {
        "policy": "auto",
        "coverage": request.coverage,
        "maxSlowdown": request.max_slowdown,
        "allowWholeGPU": request.allow_whole_gpu,
    }
    if request.gpu_products:
        placement["gpuProducts"] = list(request.gpu_products)
    spec["placement"] = placement
    spec["template"] = {"spec": {"containers": [{"name": "main", "image": IMAGE_PLACEHOLDER}]}}
    return {
        "apiVersion": "kubeseer.io/v1alpha1",
        "kind": "DLJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def _print_yaml(
    args: argparse.Namespace,
    made: prediction_mod.Prediction,
    laid_out: plan.Plan,
    request: policy.Request,
) -> int:
    import yaml

    dljob = build_dljob(args, made, request)
    name = str(dljob["metadata"]["name"])
    if not laid_out.ladder:
        print(f"kubeseer plan: no device holds {_gib(laid_out.need_bytes)}", file=sys.stderr)
        return 2
    template = claims.build_claim_template(laid_out, f"{name}-0", "default")
    print("# Replace the image. The model's sha256 is pinned; it comes from --url, or for a")
    print(
        f"# model under 1 MiB: kubectl create configmap {name}-model "
        f"--from-file={args.model.name}={args.model}"
    )
    print(yaml.safe_dump(dljob, sort_keys=False, width=_NO_WRAP), end="")
    print("---")
    print("# The claim of attempt 0 on a cluster that allocates GPUs with DRA: the plan's ladder.")
    print(yaml.safe_dump(dict(template), sort_keys=False, width=_NO_WRAP), end="")
    return 0


def _print_table(model: Path, made: prediction_mod.Prediction, laid_out: plan.Plan) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        title=f"{model.name}: {made.mode.value}, batch {made.batch_size}, "
        f"{made.precision.value}; needs {_gib(laid_out.need_bytes)} ({laid_out.need_basis})",
    )
    headers = ("rank", "GPU", "profile", "GiB", "spare", "slower", "basis", "cost", "verdict")
    rows = [
        (
            str(row.rank) if row.rank is not None else "-",
            row.candidate.gpu.key,
            row.candidate.profile.name or "whole",
            f"{row.candidate.usable_memory_bytes / catalogue.GIB:.2f}",
            f"{row.margin_bytes / catalogue.GIB:+.2f}",
            "-" if row.slowdown.factor is None else f"{row.slowdown.factor:.2f}x",
            _EVIDENCE[row.slowdown.evidence],
            f"{row.cost:.3g}",
            row.verdict.value,
        )
        for row in laid_out.rows
    ]
    # Names are what a user copies into a DLJob or reads as a verdict: on a narrow terminal
    # the title wraps, a name is never cut.
    words = ("GPU", "profile", "basis", "verdict")
    for i, header in enumerate(headers):
        widest = max((len(r[i]) for r in rows), default=0)
        table.add_column(
            header,
            justify="left" if header in words else "right",
            min_width=max(widest, len(header)),
            no_wrap=True,
        )
    for cells in rows:
        table.add_row(*cells)
    console = Console()
    console.print(table)
    console.print(
        "cost = share of the GPU held x predicted step time x slowdown (GPU-seconds per step, "
        f"slowdown 1 without evidence); labels from {made.label_device}; "
        f"{len(laid_out.ladder)} of {len(laid_out.rows)} fit"
    )
    for note in made.warnings:
        console.print(f"[yellow]warning:[/yellow] {note}")
    for limit in made.launch_limits:
        console.print(f"[red]launch limit:[/red] {limit}")


_EVIDENCE = {
    slowdown.Evidence.LEARNED: "learned",
    slowdown.Evidence.DERIVED: "derived",
    slowdown.Evidence.NONE: "none",
}
"""The slowdown's evidence, short enough for a table column."""


def _dns_name(text: str) -> str:
    """A DLJob name from a file stem: lower case, dashes, at most 63 characters."""
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")
    return (cleaned or "job")[:63].rstrip("-")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / catalogue.GIB:.2f} GiB"
