"""`kubeseer demo`: the main job, end to end, on a fresh machine with the shipped checkpoint.

Three acts, each resting on the one before: (1) PerfGraphs of real ONNX files (the models that
ship inside the `onnx` package's backend test data, plus zoo models exported graph-only);
(2) SeerNet-Multi's predictions for them; (3) a real control plane (or the cluster `KUBECONFIG`
names) where the operator places the sample DLJobs from `examples/` on fake GPU and MIG nodes,
ending in the table a cluster admin would look at.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubeseer import resources

EXAMPLES = resources.path("examples")
DEPLOY = resources.path("deploy")
DEMO_NAMESPACE = "kubeseer-demo"
ONNX_LIGHT_MODELS = ("light_resnet50", "light_densenet121", "light_inception_v1", "light_vgg19")
ZOO_MODELS: Mapping[str, Mapping[str, int]] = {"mobilenet_v2": {}, "bert-base": {"seq": 128}}
"""Zoo models shown, with the symbolic dimensions besides the batch that each one needs."""
ZOO_BATCH = 8
FINAL_PHASES = frozenset({"Running", "Succeeded", "Failed"})


@dataclass(frozen=True)
class DemoModel:
    """A real ONNX file and the batch (and other symbolic dimensions) to look at it with."""

    name: str
    path: Path
    batch_size: int
    inputs: Mapping[str, int] = field(default_factory=dict)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `kubeseer demo`."""
    parser = subparsers.add_parser(
        "demo", help="PerfGraphs, predictions and DLJob placement on a local control plane"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds to wait for every sample DLJob to settle (default 180)",
    )
    parser.add_argument(
        "--skip-cluster",
        action="store_true",
        help="stop after the graphs and predictions (no control plane, no operator)",
    )
    parser.add_argument(
        "--chart",
        action="store_true",
        help="install kubeseer with its Helm chart and run the operator, extender and "
        "kube-scheduler with the chart's settings and service accounts (`make demo-chart`)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    # Wide enough for the DLJob table's resource names even when stdout is not a terminal.
    console = Console(width=max(shutil.get_terminal_size().columns, 160))
    with tempfile.TemporaryDirectory(prefix="kubeseer-demo-") as scratch:
        models = _demo_models(Path(scratch), console)
        _show_graphs(models, console)
        _show_predictions(models, console)
        if args.skip_cluster:
            return 0
        return _run_cluster(args.timeout, Path(scratch), console, chart=args.chart)


def _demo_models(scratch: Path, console: Any) -> list[DemoModel]:
    """Real ONNX files: onnx's backend-test models (exported at batch 1) and zoo models exported
    without weights (any batch)."""
    import onnx

    from kubeseer import zoo
    from kubeseer.zoo import export

    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    models = [
        DemoModel(name.removeprefix("light_"), light / f"{name}.onnx", batch_size=1)
        for name in ONNX_LIGHT_MODELS
    ]
    for name, inputs in ZOO_MODELS.items():
        with console.status(f"exporting zoo model {name} (graph only)"):
            path = export.export_onnx(
                zoo.standard_spec(name), scratch / f"{name}.onnx", with_weights=False
            )
        models.append(DemoModel(f"zoo/{name}", path, ZOO_BATCH, inputs))
    return models


def _show_graphs(models: Sequence[DemoModel], console: Any) -> None:
    from rich.table import Table

    from kubeseer.predictor import extract

    table = Table(title="PerfGraphs (extraction time in brackets)")
    for column in (
        "model",
        "batch",
        "nodes",
        "edges",
        "GFLOPs",
        "params (M)",
        "MAC (MiB)",
        "FLOPs/byte",
    ):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model in models:
        started = time.perf_counter()
        graph = extract.from_onnx(model.path, batch_size=model.batch_size, inputs=model.inputs)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        table.add_row(
            f"{model.name} ({elapsed_ms:.0f} ms)",
            str(model.batch_size),
            str(graph.num_nodes),
            str(graph.num_edges),
            f"{graph.flops / 1e9:.1f}",
            f"{graph.params / 1e6:.1f}",
            f"{graph.mac / 2**20:.0f}",
            f"{graph.flops / max(graph.mac, 1):.1f}",
        )
    console.print(table)


def _show_predictions(models: Sequence[DemoModel], console: Any) -> None:
    from rich.table import Table

    from kubeseer.prediction import Mode, Precision
    from kubeseer.predictor import api

    predictor = api.Predictor.load(None)
    table = Table(title=f"SeerNet-Multi predictions ({predictor.version})")
    for column in ("model", "batch", "mode", "memory MiB (point / upper)", "SM util %", "step ms"):
        table.add_column(column, justify="left" if column in ("model", "mode") else "right")
    label_device = ""
    for model in models:
        for mode in (Mode.INFER, Mode.TRAIN):
            p = predictor.predict(
                model.path, model.batch_size, mode, Precision.FP32, inputs=model.inputs
            )
            label_device = p.label_device
            table.add_row(
                model.name,
                str(model.batch_size),
                mode.value,
                f"{p.memory_bytes.point / 2**20:,.0f} / {p.memory_bytes.upper / 2**20:,.0f}",
                f"{p.sm_util_percent.point:.0f}",
                f"{p.step_time_s.point * 1e3:.1f}",
            )
    table.caption = f"labels measured on: {label_device}"
    console.print(table)


def _run_cluster(timeout_s: float, scratch: Path, console: Any, *, chart: bool = False) -> int:
    from kubeseer.operator import local, main
    from kubeseer.operator.config import OperatorConfig

    with ExitStack() as stack:
        admin, operator_kubeconfig = stack.enter_context(_cluster(console, chart=chart))
        if chart:
            stack.enter_context(_chart_release(Path(admin), scratch, console))
        else:
            config = OperatorConfig(
                metrics_port=0, health_port=0, fetch_cache_dir=scratch / "models"
            )
            with console.status("loading the predictor and starting the operator"):
                stack.enter_context(
                    local.OperatorThread(main.build(config, kubeconfig=operator_kubeconfig))
                )
        api = _api_client(admin)
        _apply_examples(api, console)
        jobs = _wait_for_jobs(api, timeout_s, console)
        _show_jobs(api, jobs, console)
    return 0 if _settled(jobs) else 1


def _settled(jobs: Sequence[dict[str, Any]]) -> bool:
    """Every DLJob reached a phase the demo reports (Running, Succeeded or Failed)."""
    return all(j.get("status", {}).get("phase") in FINAL_PHASES for j in jobs)


@contextmanager
def _cluster(console: Any, *, chart: bool = False) -> Iterator[tuple[str, str]]:
    """(admin kubeconfig, operator kubeconfig): `KUBECONFIG`'s cluster, or a local one (with
    `chart`, one without kubeseer's manifests: Helm installs them)."""
    existing = os.environ.get("KUBECONFIG")
    if existing:
        console.print(f"using the cluster in KUBECONFIG={existing}")
        yield existing, existing
        return
    from kubeseer.devcluster import binaries, cluster

    local = cluster.LocalCluster(
        crd_files=() if chart else sorted((DEPLOY / "crds").glob("*.yaml")),
        rbac_files=() if chart else sorted((DEPLOY / "rbac").glob("*.yaml")),
        bins=binaries.build(),
    )
    with console.status("starting the local control plane"):
        state = local.start()
    console.print(
        f"local control plane up in {state.startup_s:.1f} s "
        f"(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK); "
        f"logs in {state.run_dir}"
    )
    try:
        yield str(local.admin_kubeconfig), str(local.operator_kubeconfig)
    finally:
        local.stop()


@contextmanager
def _chart_release(admin: Path, scratch: Path, console: Any) -> Iterator[None]:
    """`helm install` the chart, then its operator, extender and kube-scheduler as processes
    with the chart's settings and service-account tokens (`kubeseer.demo_chart`)."""
    from rich.table import Table

    from kubeseer import demo_chart
    from kubeseer.devcluster import binaries

    bins = binaries.locate()
    with console.status("helm install kubeseer charts/kubeseer"):
        release = demo_chart.install_release(bins.path("helm"), admin, scratch)
    table = Table(title=f"helm release {release.release} in {release.namespace}")
    for column in ("kind", "objects"):
        table.add_column(column)
    kinds: dict[str, int] = {}
    for o in release.objects:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    for kind, count in sorted(kinds.items()):
        table.add_row(kind, str(count))
    console.print(table)
    with (
        console.status(
            "starting the chart's operator, extender and kube-scheduler with its service accounts"
        ),
        demo_chart.components(
            release, bins, scratch, KUBESEER_OBSERVATION_STORE=str(scratch / "observations")
        ),
    ):
        console.print(
            f"operator, extender and kube-scheduler (profile {demo_chart.SCHEDULER_NAME}) run "
            f"with the chart's settings; logs in {scratch / 'logs'}"
        )
        yield


def _api_client(kubeconfig: str) -> Any:
    from kubeseer.operator import kube

    return kube.api_client(kubeconfig, pool_size=4)


def _apply_examples(api: Any, console: Any) -> None:
    """Create the demo namespace and every ConfigMap and DLJob of `examples/*.yaml`."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=DEMO_NAMESPACE)))
    except ApiException as e:
        if e.status != 409:
            raise
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc:
                continue
            try:
                if doc["kind"] == "ConfigMap":
                    core.create_namespaced_config_map(DEMO_NAMESPACE, doc)
                else:
                    group, version = doc["apiVersion"].split("/")
                    custom.create_namespaced_custom_object(
                        group, version, DEMO_NAMESPACE, "dljobs", doc
                    )
            except ApiException as e:
                if e.status != 409:
                    raise
        console.print(f"applied {path.relative_to(resources.root())}")


def _list_jobs(api: Any) -> list[dict[str, Any]]:
    from kubernetes import client

    body = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kubeseer.io", "v1alpha1", DEMO_NAMESPACE, "dljobs"
    )
    return [dict(item) for item in cast(dict[str, Any], body)["items"]]


def _wait_for_jobs(api: Any, timeout_s: float, console: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    with console.status("waiting for the operator to predict, place and run every DLJob"):
        while True:
            jobs = _list_jobs(api)
            if (jobs and _settled(jobs)) or time.monotonic() > deadline:
                return jobs
            time.sleep(1.0)


def _show_jobs(api: Any, jobs: Sequence[dict[str, Any]], console: Any) -> None:
    from kubernetes import client
    from rich.table import Table

    core = client.CoreV1Api(api)
    table = Table(title="DLJobs placed by kubeseer")
    for column in (
        "job",
        "model",
        "mode",
        "batch",
        "memory MiB (point/upper)",
        "resource",
        "node",
        "phase",
    ):
        table.add_column(column)
    for job in sorted(jobs, key=lambda j: str(j["metadata"]["name"])):
        name = job["metadata"]["name"]
        spec, status = job["spec"], job.get("status", {})
        pods = core.list_namespaced_pod(
            DEMO_NAMESPACE, label_selector=f"kubeseer.io/dljob={name}"
        ).items
        nodes = sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name})
        table.add_row(
            name,
            str(status.get("model", "-")),
            spec["mode"],
            str(spec["batchSize"]),
            status.get("prediction", {}).get("memoryMiB", "-"),
            status.get("placement", {}).get("resource", "-"),
            ", ".join(nodes) or "-",
            _phase_text(status),
        )
    console.print(table)


def _phase_text(status: dict[str, Any]) -> str:
    phase = str(status.get("phase", "-"))
    if phase != "Failed":
        return phase
    reasons = [
        c.get("message", "") for c in status.get("conditions", []) if c.get("status") == "False"
    ]
    return f"Failed: {reasons[0]}" if reasons else phase
