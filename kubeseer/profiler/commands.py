"""`kubeseer profiler`: the DaemonSet agent's entry point.

Every flag has a `KUBESEER_PROFILER_*` environment variable as its default, so the DaemonSet
(deploy/profiler/daemonset.yaml) configures the agent without arguments; `NODE_NAME` comes from
the downward API (`spec.nodeName`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

_PREFIX = "KUBESEER_PROFILER_"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(_PREFIX + name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"kubeseer profiler: {_PREFIX}{name}={raw!r} is not a number") from None


def register(subparsers: Any) -> None:
    """Add `kubeseer profiler`."""
    parser = subparsers.add_parser(
        "profiler",
        help="the GPU profiler agent: per-pod GPU memory and SM activity of DLJob pods",
        description="Samples the node's GPUs and MIG devices through NVML, attributes what "
        "each DLJob pod uses, exports it on /metrics and reports it in the DLJob's "
        "status.observed. docs/profiler.md.",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME", ""),
        help="this node's name (default $NODE_NAME, set from spec.nodeName)",
    )
    parser.add_argument(
        "--period", type=float, default=_env_float("PERIOD_S", 1.0), help="seconds per sample"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=_env_float("WARMUP_S", 30.0),
        help="seconds after a pod first appears on a GPU left out of mean memory and SM activity",
    )
    parser.add_argument(
        "--report-interval",
        type=float,
        default=_env_float("REPORT_INTERVAL_S", 15.0),
        help="seconds between status.observed updates of a running pod",
    )
    parser.add_argument(
        "--pods-refresh",
        type=float,
        default=_env_float("PODS_REFRESH_S", 10.0),
        help="seconds between listings of the node's pods",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=Path(os.environ.get(_PREFIX + "PROC_ROOT", "/proc")),
        help="the host's /proc (the DaemonSet runs with hostPID, so /proc)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env_float("METRICS_PORT", 9465)),
        help="port of /metrics (0: do not serve)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig (default: the in-cluster account)")
    parser.add_argument(
        "--nvml-standin",
        type=Path,
        metavar="SCENARIO.json",
        help="answer NVML calls from a scenario instead of the driver, for machines without a "
        "GPU (tests, the demo); reports say source nvml-standin",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from kubeseer import metrics
    from kubeseer.profiler import agent, kube, report, standin
    from kubeseer.profiler import nvml as nvml_facade

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    source = report.SOURCE_NVML
    if args.nvml_standin is not None:
        try:
            scenario = standin.Scenario.from_dict(json.loads(args.nvml_standin.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"kubeseer profiler: {args.nvml_standin}: {e}", file=sys.stderr)
            return 2
        standin.install(standin.StandIn(scenario))
        source = report.SOURCE_STANDIN
    try:
        config = agent.AgentConfig(
            node=args.node,
            period_s=args.period,
            warmup_s=args.warmup,
            report_interval_s=args.report_interval,
            pods_refresh_s=args.pods_refresh,
            proc_root=args.proc_root,
            source=source,
        )
        api = kube.ProfilerApi(kube.api_client(args.kubeconfig))
    except (ValueError, kube.ApiError) as e:
        print(f"kubeseer profiler: {e}", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    profiler_metrics = metrics.ProfilerMetrics(registry, nvml_errors=nvml_facade.ERROR_KINDS)
    sink: list[agent.Agent] = []
    try:
        nvml = nvml_facade.Nvml(on_error=lambda e: sink[0].nvml_error(e) if sink else None)
    except nvml_facade.NvmlCallError as e:
        print(f"kubeseer profiler: NVML is not usable on this node: {e}", file=sys.stderr)
        return 1
    runner = agent.Agent(config, nvml, api, profiler_metrics)
    sink.append(runner)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.info(
        "profiling %d device(s) on node %s every %g s (%s)",
        len(nvml.devices),
        config.node,
        config.period_s,
        source,
    )
    runner.run(stop)
    return 0
