"""`kubeseer demo`: the main job, end to end, on a fresh machine with the shipped checkpoint.

Four acts, each resting on the one before: (1) PerfGraphs of real ONNX files (the models that
ship inside the `onnx` package's backend test data, plus zoo models exported graph-only);
(2) SeerNet-Multi's predictions for them; (3) a real control plane (or the cluster `KUBECONFIG`
names) where the operator places the sample DLJobs from `examples/` on fake GPU and MIG nodes,
ending in the table a cluster admin would look at; (4) on the local control plane, a GPU
profiler per node watching those jobs, and each job's prediction against its observation as the
operator recorded it (`kubeseer.demo_observe`). Without a GPU the observed memory is derived
for each job's model (`kubeseer.demo_truth`), never measured, and the demo says so.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kubeseer import resources

if TYPE_CHECKING:
    from kubeseer import demo_chart, demo_observe
    from kubeseer.devcluster import inventory

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
    from kubeseer import demo_chart
    from kubeseer.operator import local, main
    from kubeseer.operator.config import OperatorConfig

    store = scratch / "observations"
    with ExitStack() as stack:
        admin, operator_kubeconfig, nodes = stack.enter_context(_cluster(console, chart=chart))
        if chart:
            release, procs = stack.enter_context(
                _chart_release(Path(admin), scratch, store, console)
            )
            metrics_url = f"http://127.0.0.1:{release.ports.operator_metrics}/metrics"
            operator_metrics: Callable[[], str] = functools.partial(_scrape, metrics_url)
            profiler_command: Callable[[], demo_observe.ProfilerCommand] = functools.partial(
                _chart_profiler, release
            )
        else:
            config = OperatorConfig(
                metrics_port=0,
                health_port=0,
                fetch_cache_dir=scratch / "models",
                observation_store=str(store),
            )
            with console.status("loading the predictor and starting the operator"):
                built = main.build(config, kubeconfig=operator_kubeconfig)
                stack.enter_context(local.OperatorThread(built))
            operator_metrics = functools.partial(_registry_text, built)
            procs = demo_chart.Processes(scratch / "logs")
            stack.callback(procs.stop)
            profiler_command = functools.partial(_plain_profiler, Path(admin), scratch)
        api = _api_client(admin)
        _apply_examples(api, console, hold=nodes is not None)
        jobs = _wait_for_jobs(api, timeout_s, console)
        _show_jobs(api, jobs, console)
        if not _settled(jobs):
            return 1
        if nodes is None:
            console.print(
                "the cluster in KUBECONFIG has nodes of its own: the demo runs no profiler there"
            )
            return 0
        return _observe(
            api, nodes, scratch, store, operator_metrics, profiler_command(), procs, console
        )
    return 0


def _observe(
    api: Any,
    nodes: Sequence[inventory.NodeSpec],
    scratch: Path,
    store: Path,
    operator_metrics: Callable[[], str],
    command: demo_observe.ProfilerCommand,
    procs: demo_chart.Processes,
    console: Any,
) -> int:
    """The fourth act: a profiler per GPU node beside the jobs, then each job's prediction
    against what was observed, as the operator recorded it."""
    from kubeseer import demo_observe, demo_truth

    console.print(
        f"[bold]No GPU here: the observed memory below is DERIVED, not measured.[/bold] Each "
        f"pod's process is given, through the NVML stand-in, the GPU memory that "
        f"kubeseer.measure derives for its job's own model (label source "
        f"{demo_truth.LABEL_SOURCE}: the example's ONNX graph rebuilt as the zoo's MLP, its "
        f"step traced on the meta device and replayed through the CUDA caching allocator's "
        f"rules, plus the CUDA context), never from the prediction. A real `kubeseer profiler` "
        f"per GPU node reads it and patches status.observed; the operator compares and "
        f"records. SM activity has no source without a GPU and is reported unavailable."
    )
    started = time.monotonic()
    with console.status("deriving each pod's memory and profiling the GPU nodes"):
        results = demo_observe.observe(
            api, DEMO_NAMESPACE, nodes, scratch, store, command, procs.start
        )
    _show_observations(results, operator_metrics(), time.monotonic() - started, console)
    return 0


def _show_observations(
    results: Sequence[demo_observe.JobObservation],
    metrics_text: str,
    elapsed_s: float,
    console: Any,
) -> None:
    from rich.table import Table

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**20:,.0f}"

    table = Table(title=f"Prediction against observation ({elapsed_s:.0f} s of profiling)")
    for column in (
        "job",
        "GPU",
        "predicted MiB (point / upper)",
        "observed peak MiB (derived)",
        "error",
        "within bound",
        "runs in MiB (derived)",
        "operator's record",
    ):
        table.add_column(column, justify="left" if column in ("job", "GPU") else "right")
    notes: list[str] = []
    for r in results:
        error = within = "-"
        if r.observed_bytes:
            error = f"{(r.predicted_bytes - r.observed_bytes) / r.observed_bytes:+.1%}"
            within = "yes" if r.observed_bytes <= r.upper_bytes else "NO"
            if r.observed_bytes > r.upper_bytes and (r.required_bytes or 0) <= r.upper_bytes:
                notes.append(
                    f"{r.dljob}: the observed peak exceeds the bound although the job runs in "
                    f"{mib(r.required_bytes)} MiB: on a slice with room to spare the caching "
                    f"allocator keeps more reserved than the job needs, and NVML counts it"
                )
        recorded = "-"
        gpu = r.resource.removeprefix("nvidia.com/")
        if r.record is not None:
            gpu = f"{r.record.gpu_product} {r.record.mig_profile or 'whole'}"
            peak = r.record.observed_peak_memory_bytes
            recorded = f"{r.record.outcome.value}, {mib(peak) if peak else 'no'} observed"
            if r.record.memory_at_least_bytes:
                recorded += f", needs > {mib(r.record.memory_at_least_bytes)}"
        observed = mib(r.observed_bytes)
        if r.not_derived:
            observed = f"not derived: {r.not_derived}"
        elif r.out_of_memory:
            observed = "out of memory on its device"
        table.add_row(
            r.dljob,
            gpu,
            f"{mib(r.predicted_bytes)} / {mib(r.upper_bytes)}",
            observed,
            error,
            within,
            mib(r.required_bytes),
            recorded,
        )
    table.caption = (
        "observed: the profiler's peak over the job's pods (status.observed, source "
        f"{results[0].observed_source if results else '-'}; SM activity "
        f"{results[0].sm_source if results else '-'}), of the derived memory NVML would show "
        "(CUDA context + the caching allocator's reserved peak). error: (predicted - observed) "
        "/ observed. runs in: the derived smallest device the job fits. operator's record: its "
        "observation store (one Parquet file per attempt)"
    )
    console.print(table)
    for note in notes:
        console.print(note)
    console.print(_feedback_table(metrics_text))


def _feedback_table(metrics_text: str) -> Any:
    """The operator's `kubeseer_feedback_*` series that counted something."""
    from prometheus_client import parser
    from rich.table import Table

    samples = {
        (s.name.removeprefix("kubeseer_feedback_"), tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(metrics_text)
        for s in family.samples
        if s.name.startswith("kubeseer_feedback_")
    }
    table = Table(title="The operator's feedback metrics (kubeseer_feedback_*, on its /metrics)")
    for column in ("metric", "labels", "value"):
        table.add_column(column)
    for (name, labels), value in sorted(samples.items()):
        text = ", ".join(f"{k}={v}" for k, v in labels if k != "family")
        if name == "prediction_absolute_error_ratio_count" and value:
            total = samples.get(("prediction_absolute_error_ratio_sum", labels), 0.0)
            table.add_row(
                "prediction_absolute_error_ratio",
                text,
                f"{value:g} attempts, mean {total / value:.1%}",
            )
        elif name in ("bound_exceeded_total", "observations_total") and value:
            table.add_row(name, text, f"{value:g}")
    return table


def _settled(jobs: Sequence[dict[str, Any]]) -> bool:
    """Every DLJob reached a phase the demo reports (Running, Succeeded or Failed)."""
    return all(j.get("status", {}).get("phase") in FINAL_PHASES for j in jobs)


@contextmanager
def _cluster(
    console: Any, *, chart: bool = False
) -> Iterator[tuple[str, str, Sequence[inventory.NodeSpec] | None]]:
    """(admin kubeconfig, operator kubeconfig, the fake nodes): `KUBECONFIG`'s cluster (whose
    nodes the demo does not know), or a local one (with `chart`, one without kubeseer's
    manifests: Helm installs them)."""
    existing = os.environ.get("KUBECONFIG")
    if existing:
        console.print(f"using the cluster in KUBECONFIG={existing}")
        yield existing, existing, None
        return
    from kubeseer.devcluster import binaries, cluster, inventory

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
        nodes = inventory.load(local.inventory_file).nodes
        yield str(local.admin_kubeconfig), str(local.operator_kubeconfig), nodes
    finally:
        local.stop()


@contextmanager
def _chart_release(
    admin: Path, scratch: Path, store: Path, console: Any
) -> Iterator[tuple[demo_chart.Release, demo_chart.Processes]]:
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
            release, bins, scratch, KUBESEER_OBSERVATION_STORE=str(store)
        ) as procs,
    ):
        console.print(
            f"operator, extender and kube-scheduler (profile {demo_chart.SCHEDULER_NAME}) run "
            f"with the chart's settings; logs in {scratch / 'logs'}"
        )
        yield release, procs


def _chart_profiler(release: demo_chart.Release) -> demo_observe.ProfilerCommand:
    """The profiler as the chart's DaemonSet runs it on a node, with its service account."""
    from kubeseer import demo_chart

    spec = demo_chart.container(release.objects, "DaemonSet", release.name("profiler"), "profiler")

    def command(node: str, extra: list[str]) -> tuple[list[str], Mapping[str, str] | None]:
        argv = [sys.executable, "-m", "kubeseer.cli", *spec["args"], "--node", node,
                "--kubeconfig", str(release.kubeconfigs["profiler"]),
                "--metrics-port", str(demo_chart.free_port()), *extra]  # fmt: skip
        return argv, demo_chart.environment(spec, release.namespace, node)

    return command


def _plain_profiler(admin: Path, scratch: Path) -> demo_observe.ProfilerCommand:
    """`kubeseer profiler` with a token of deploy/rbac's profiler service account."""
    from kubeseer import demo_chart

    kubeconfig = demo_chart.token_kubeconfig(
        admin, "kubeseer-system", "kubeseer-profiler", scratch / "profiler.kubeconfig"
    )

    def command(node: str, extra: list[str]) -> tuple[list[str], Mapping[str, str] | None]:
        argv = [sys.executable, "-m", "kubeseer.cli", "profiler", "--node", node,
                "--kubeconfig", str(kubeconfig),
                "--metrics-port", str(demo_chart.free_port()), *extra]  # fmt: skip
        return argv, None

    return command


def _registry_text(operator: Any) -> str:
    from prometheus_client import exposition

    return exposition.generate_latest(operator.metrics_registry).decode()


def _scrape(url: str) -> str:
    from kubeseer import demo_observe

    return demo_observe.scrape(url)


def _api_client(kubeconfig: str) -> Any:
    from kubeseer.operator import kube

    return kube.api_client(kubeconfig, pool_size=4)


def _apply_examples(api: Any, console: Any, *, hold: bool = False) -> None:
    """Create the demo namespace and every ConfigMap and DLJob of `examples/*.yaml`; with
    `hold`, the DLJobs' pods stay Running (KWOK does not complete them) until the demo ends
    them, so that the profilers see them run."""
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kubeseer import demo_observe

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
                    if hold:
                        template = doc["spec"].setdefault("template", {})
                        metadata = template.setdefault("metadata", {})
                        metadata.setdefault("annotations", {}).update(demo_observe.KWOK_HOLD)
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
