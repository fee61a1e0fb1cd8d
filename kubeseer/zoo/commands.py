"""`kubeseer zoo sample` and `kubeseer zoo list`.

Heavy imports (torch, onnx, rich) happen inside the handlers so that `kubeseer --help` stays
instant.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kubeseer import cli_args

SPECS_FILE = "specs.jsonl"


def register(subparsers: Any) -> None:
    """Add the `zoo` command group to the top-level parser."""
    from kubeseer.zoo import spec

    zoo_parser = subparsers.add_parser(
        "zoo", help="model zoo: sample configurations, export them to ONNX, list references"
    )
    commands = zoo_parser.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)

    sample = commands.add_parser(
        "sample",
        help="draw distinct configurations of one family and export each to ONNX",
        description=f"Writes DIR/{SPECS_FILE} (one spec JSON per line, in draw order) and "
        "DIR/<config_hash>.onnx for each spec.",
    )
    sample.add_argument("--family", required=True, choices=spec.FAMILIES)
    sample.add_argument("--n", type=cli_args.positive_int, required=True, help="number of specs")
    sample.add_argument("--seed", type=int, required=True, help="sampler seed")
    sample.add_argument("--out", type=Path, required=True, help="output directory")
    sample.add_argument(
        "--size", choices=spec.SIZE_CLASSES, default="small", help="size class (default: small)"
    )
    sample.add_argument(
        "--no-weights",
        action="store_true",
        help="keep weight shapes and dtypes but write no weight bytes (enough for PerfGraphs)",
    )
    sample.set_defaults(handler=_sample)

    listing = commands.add_parser("list", help="families and standard specs with parameter counts")
    listing.set_defaults(handler=_list)


def _sample(args: argparse.Namespace) -> int:
    """Draw the specs first (cheap, validates everything), then export them one by one."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from kubeseer.zoo import export, sampling

    specs = sampling.sample_specs(args.family, args.n, args.seed, size=args.size)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / SPECS_FILE).write_text("".join(s.to_json() + "\n" for s in specs), encoding="utf-8")
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as progress:
        task = progress.add_task(f"exporting {args.family} ({args.size})", total=len(specs))
        for model_spec in specs:
            export.export_onnx(
                model_spec,
                out / f"{model_spec.config_hash()}.onnx",
                with_weights=not args.no_weights,
            )
            progress.advance(task)
    print(f"wrote {len(specs)} specs to {out / SPECS_FILE} and their ONNX files to {out}")
    return 0


def _list(args: argparse.Namespace) -> int:
    """Print the families and every standard spec with its parameter count."""
    from rich.console import Console
    from rich.table import Table

    from kubeseer.zoo import models, registry, spec

    families = Table(title="families")
    for column in ("family", "task", "standard specs"):
        families.add_column(column)
    for name in spec.FAMILIES:
        family = registry.family(name)
        families.add_row(name, family.task.value, ", ".join(family.standard))
    standards = Table(title="standard specs")
    for column in ("name", "family", "parameters", "input"):
        standards.add_column(column, justify="right" if column == "parameters" else "left")
    for name in registry.STANDARD_SPECS:
        model_spec = registry.standard_spec(name)
        inputs = " ".join(f"{k}={v}" for k, v in sorted(model_spec.input.items()))
        standards.add_row(
            name, model_spec.family, f"{models.parameter_count(model_spec):,}", inputs
        )
    console = Console()
    console.print(families)
    console.print(standards)
    return 0
