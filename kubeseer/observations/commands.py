"""`kubeseer dataset pull`: added to the `dataset` command group the harness registers.

argparse has no public way to find a parser's subcommands, so `register` looks the group's
`_SubParsersAction` up among its actions; if the harness's group is absent it makes its own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kubeseer import units


def _subcommands(parser: argparse.ArgumentParser) -> Any:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)


def register(subparsers: Any) -> None:
    """Add `kubeseer dataset pull`."""
    group = subparsers.choices.get("dataset") or subparsers.add_parser(
        "dataset", help="the measured dataset"
    )
    pull = _subcommands(group).add_parser(
        "pull",
        help="export the cluster's observations as a measured dataset (for train --init)",
        description="Reads the observation store the operator writes (a directory or "
        "s3://bucket/prefix) and writes one measured dataset per GPU under OUT, with the jobs' "
        "PerfGraphs added to the graph cache that kubeseer train reads. docs/feedback.md.",
    )
    pull.add_argument(
        "--store",
        default=os.environ.get("KUBESEER_OBSERVATION_STORE"),
        help="the store: a directory or s3://bucket/prefix (default $KUBESEER_OBSERVATION_STORE)",
    )
    pull.add_argument("--out", type=Path, required=True, help="dataset root directory to write")
    pull.add_argument(
        "--models",
        type=Path,
        help="directory of ONNX files, matched by sha256, for jobs whose PerfGraph the store "
        "does not hold",
    )
    pull.add_argument(
        "--cache-dir",
        type=Path,
        help="graph cache root (default $KUBESEER_CACHE_DIR or ~/.cache/kubeseer, as train)",
    )
    pull.add_argument(
        "--s3-endpoint",
        default=os.environ.get("KUBESEER_S3_ENDPOINT"),
        help="S3-compatible endpoint URL (credentials from AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY)",
    )
    pull.add_argument(
        "--s3-region", default=os.environ.get("KUBESEER_S3_REGION", "us-east-1"), help="region"
    )
    pull.add_argument(
        "--include-standin",
        action="store_true",
        help="also export observations made by the NVML stand-in (not measurements)",
    )
    pull.add_argument(
        "--context-mib",
        type=int,
        help="the CUDA context of the cluster's job runtime, which each row's reserved-memory "
        "label leaves out (default: the documented torch 2 / CUDA 12 context, 500 MiB)",
    )
    pull.set_defaults(handler=_pull)


def _pull(args: argparse.Namespace) -> int:
    from kubeseer.observations import pull, store

    if not args.store:
        print("kubeseer dataset pull: name the store with --store", file=sys.stderr)
        return 2
    if args.context_mib is not None and args.context_mib < 0:
        print("kubeseer dataset pull: --context-mib cannot be negative", file=sys.stderr)
        return 2
    settings = store.S3Settings(
        endpoint_url=args.s3_endpoint,
        region=args.s3_region,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
    )
    try:
        source = store.open_store(args.store, settings)
        result = pull.pull(
            source,
            args.out,
            models=args.models,
            cache_dir=args.cache_dir,
            include_standin=args.include_standin,
            context_bytes=None if args.context_mib is None else args.context_mib * units.MIB,
        )
    except store.StoreError as e:
        print(f"kubeseer dataset pull: {e}", file=sys.stderr)
        return 1
    for line in pull.summarise(result):
        print(line)
    return 0 if result.rows else 1
