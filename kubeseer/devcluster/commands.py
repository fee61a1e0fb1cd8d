"""`kubeseer devcluster up|down|status`: a local control plane that outlives the command.

`up` starts the cluster detached (its processes keep running after the command returns) and
records it in `<run dir>/state.json`; `status` and `down` find it there. The run directory is
`~/.cache/kubeseer/run/default` unless `--dir` names another, so several clusters can coexist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubeseer import resources
from kubeseer.devcluster import binaries

DEFAULT_DIR = binaries.cache_root() / "run" / "default"
DEPLOY = resources.path("deploy")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `devcluster` and its three subcommands."""
    parser = subparsers.add_parser(
        "devcluster",
        help="a real local Kubernetes control plane with fake GPU nodes (etcd, apiserver, "
        "controller-manager, scheduler, KWOK)",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start a cluster in the background and print KUBECONFIG")
    _dir_option(up)
    up.add_argument(
        "--nodes",
        type=Path,
        default=DEPLOY / "devcluster" / "nodes.yaml",
        help="fake-node inventory (default: deploy/devcluster/nodes.yaml; "
        "deploy/devcluster/dra-nodes.yaml has GPUs published by NVIDIA's DRA driver)",
    )
    up.add_argument(
        "--crd",
        type=Path,
        action="append",
        help="CRD manifest to apply; repeatable (default: deploy/crds/*.yaml)",
    )
    up.add_argument(
        "--rbac",
        type=Path,
        action="append",
        help="RBAC manifest to apply; repeatable (default: deploy/rbac/*.yaml)",
    )
    up.add_argument(
        "--extender-url",
        help="kubeseer scheduler extender URL (http://127.0.0.1:PORT); none by default",
    )
    up.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for readiness (default 90)"
    )
    up.set_defaults(handler=_up)

    status = actions.add_parser("status", help="report each component's health")
    _dir_option(status)
    status.set_defaults(handler=_status)

    down = actions.add_parser("down", help="stop the cluster; logs stay in the run directory")
    _dir_option(down)
    down.set_defaults(handler=_down)


def _dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"run directory holding state, kubeconfigs and logs (default: {DEFAULT_DIR})",
    )


def _up(args: argparse.Namespace) -> int:
    from kubeseer.devcluster import cluster, errors, inventory

    crds = args.crd if args.crd is not None else sorted((DEPLOY / "crds").glob("*.yaml"))
    rbac = args.rbac if args.rbac is not None else sorted((DEPLOY / "rbac").glob("*.yaml"))
    local = cluster.LocalCluster(
        run_dir=args.dir,
        inventory_file=args.nodes,
        crd_files=crds,
        rbac_files=rbac,
        extender_url=args.extender_url,
        ready_timeout_s=args.timeout,
        detached=True,
    )
    try:
        state = local.start()
    except errors.DevClusterError as e:
        print(f"devcluster up failed: {e}", file=sys.stderr)
        return 1
    print(f"devcluster ready in {state.startup_s:.1f} s; API server {state.server}")
    print(f"run directory {state.run_dir} (logs in {state.run_dir}/logs)")
    print(f"operator kubeconfig: {state.operator_kubeconfig}")
    dra_nodes = [n.name for n in inventory.load(args.nodes).dra_nodes()]
    if dra_nodes:
        print(f"DRA: ResourceSlices of driver gpu.nvidia.com on {', '.join(dra_nodes)}")
    print(f"export KUBECONFIG={state.admin_kubeconfig}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from kubeseer.devcluster import cluster, errors

    try:
        state = cluster.read_state(args.dir)
    except errors.ClusterStateError as e:
        print(f"devcluster: {e}", file=sys.stderr)
        return 1
    report = cluster.health(state)
    width = max(len(name) for name in report)
    for name, healthy in report.items():
        pid = next(p.pid for p in state.processes if p.name == name)
        print(f"{name:<{width}}  pid {pid:<8} {'ok' if healthy else 'DOWN'}")
    print(f"export KUBECONFIG={state.admin_kubeconfig}")
    return 0 if all(report.values()) else 1


def _down(args: argparse.Namespace) -> int:
    from kubeseer.devcluster import cluster, errors

    try:
        state = cluster.stop_detached(args.dir)
    except errors.ClusterStateError as e:
        print(f"devcluster: {e}", file=sys.stderr)
        return 1
    print(f"devcluster stopped; logs kept in {state.run_dir}/logs")
    return 0
