"""`kubeseer extender`: the scheduler extender from the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from kubeseer.extender import stanza


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `extender`."""
    parser = subparsers.add_parser(
        "extender",
        help="kube-scheduler extender: memory-aware filter and best-fit scoring of GPU/MIG nodes",
        description="Serve kube-scheduler's extender protocol (POST <prefix>/filter and "
        "<prefix>/prioritize) for kubeseer pods, plus /healthz and /metrics. Node and pod "
        "state comes from watches. See docs/extender.md and deploy/scheduler/.",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8888",
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:8888: a sidecar of kube-scheduler)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve /healthz and /metrics (never the protocol) here, for probes and "
        "Prometheus when --listen is loopback (e.g. 0.0.0.0:9466; default: off)",
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig to use (default: in-cluster service account, else ~/.kube/config)",
    )
    parser.add_argument(
        "--scheduler-name",
        default=stanza.SCHEDULER_NAME,
        help="decide only for pods of this scheduler profile; others pass through "
        f"(default {stanza.SCHEDULER_NAME})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from kubeseer.extender import service

    try:
        host, port = _address("--listen", args.listen)
        settings = service.Settings(
            host=host,
            port=port,
            metrics_address=_address("--metrics-listen", args.metrics_listen)
            if args.metrics_listen
            else None,
            scheduler_name=args.scheduler_name,
            kubeconfig=args.kubeconfig,
        )
        extender = service.Service(settings)
    except service.ConfigError as e:
        print(f"kubeseer extender: {e}", file=sys.stderr)
        return 2
    stopped = threading.Event()

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    extender.start()
    stopped.wait()
    extender.stop()
    return 0


def _address(flag: str, value: str) -> tuple[str, int]:
    from kubeseer.extender import service

    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise service.ConfigError(f"{flag} must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)
