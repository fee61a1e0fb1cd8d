"""`kubeseer operator run`: the DLJob operator from the command line.

Settings come from `KUBESEER_*` variables (docs/dljob.md lists them); the flags only say where
the API server is and what to watch, as with `kopf run`.
"""

from __future__ import annotations

import argparse
import logging
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `operator run`."""
    parser = subparsers.add_parser("operator", help="the DLJob operator")
    commands = parser.add_subparsers(dest="operator_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="watch DLJobs: predict, place on a GPU or MIG slice, create pods, escalate OOMs",
        description="Run the DLJob operator until interrupted. Configuration comes from "
        "KUBESEER_* environment variables (see docs/dljob.md).",
    )
    run.add_argument(
        "--kubeconfig",
        help="kubeconfig to use (default: in-cluster service account, else ~/.kube/config)",
    )
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        help="serve DLJobs of this namespace only (repeatable; default: all namespaces)",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf reports every handled watch event at INFO; at hundreds of pods a second that
        # is noise (decisions are Kubernetes events and status conditions), so warnings only.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # kopf and the predictor (torch) load only when the operator really runs.
    from kubeseer.operator import main
    from kubeseer.operator.config import ConfigError, OperatorConfig

    try:
        config = OperatorConfig.from_env()
        operator = main.build(config, kubeconfig=args.kubeconfig)
        main.run(operator, namespaces=args.namespaces)
    except ConfigError as e:
        print(f"kubeseer operator: {e}", file=sys.stderr)
        return 2
    except main.LeaseLostError as e:
        print(
            f"kubeseer operator: {e}; exiting so that a restart waits for the Lease again",
            file=sys.stderr,
        )
        return 1
    return 0
