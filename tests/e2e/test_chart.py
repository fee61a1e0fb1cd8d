"""The Helm chart on the real local control plane, with a real Prometheus.

1. Every object the chart renders, with its defaults and with every optional feature on, is
   accepted by the real kube-apiserver in a server-side dry run (the DLJob CRD and the
   Prometheus Operator's ServiceMonitor and PrometheusRule CRDs installed).
2. The chart's RBAC, ServiceAccounts and scheduler configuration are applied, and the operator,
   the extender, kube-scheduler with the chart's own configuration, and the profiler run as
   their own processes with kubeconfigs made from their service accounts' tokens. A DLJob is
   predicted, placed by the chart's scheduler profile through the extender, run by KWOK,
   profiled through the NVML stand-in (peaking above its bound), and ends. Nothing any of them
   did was forbidden; a verb outside their roles is. A real Prometheus, loading the chart's
   rule file, scrapes all three; every dashboard query and every alert's signal returns series,
   and the over-the-bound alert is raised. The panels are drawn to PNG (docs/ with
   KUBESEER_PANELS_OUT=docs).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import panels
import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from operator_support import mlp
from test_profiler import cgroup_of, free_port, metrics_text, scenario_for, small_model

from kubeseer import demo_chart
from kubeseer.devcluster import process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "chart"))
import chart_support

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "kubeseer.io", "v1alpha1", "dljobs"
RELEASE = NAMESPACE = "ks-e2e"
SCHEDULER = "kubeseer-chart-e2e"
POD_PID, SYSTEM_PID = 4242, 77
MONITORING_CRDS = (
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
)


# -- the server-side dry run ---------------------------------------------------------------------


def establish_monitoring_crds(admin_api: client.ApiClient) -> None:
    """The Prometheus Operator's CRDs (from its Go module, hack/build-prometheus.sh)."""
    ext = client.ApiextensionsV1Api(admin_api)
    for name in MONITORING_CRDS:
        body = yaml.safe_load(chart_support.monitoring_crd(name).read_text())
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + 30
    for name in MONITORING_CRDS:
        crd = name.split("_", 1)[1].removesuffix(".yaml") + ".monitoring.coreos.com"
        while not any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(crd).status.conditions or []
        ):
            assert time.monotonic() < deadline, f"{crd} not established"
            time.sleep(0.2)


def apply(api: dynamic.DynamicClient, body: dict[str, Any], *, dry_run: bool) -> None:
    for _ in range(20):
        try:
            resource = api.resources.get(api_version=body["apiVersion"], kind=body["kind"])
            break
        except ResourceNotFoundError:
            api.resources.invalidate_cache()
            time.sleep(0.5)
    else:
        raise AssertionError(f"the API server serves no {body['apiVersion']} {body['kind']}")
    metadata = body["metadata"]
    resource.server_side_apply(
        body=body,
        name=metadata["name"],
        namespace=metadata.get("namespace") if resource.namespaced else None,
        field_manager="kubeseer-chart-e2e",
        force_conflicts=True,
        dry_run="All" if dry_run else None,
    )


@pytest.mark.parametrize(
    "values", [{}, chart_support.ALL_FEATURES], ids=["defaults", "all-features"]
)
def test_every_rendered_object_is_accepted_by_the_api_server(admin_api, values):
    establish_monitoring_crds(admin_api)
    namespace = "chart-dry-run"
    core = client.CoreV1Api(admin_api)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise
    objects = chart_support.render(values, release="dry", namespace=namespace)
    api = dynamic.DynamicClient(admin_api)
    refused = []
    for body in objects:
        try:
            apply(api, body, dry_run=True)
        except ApiException as e:
            refused.append(f"{body['kind']} {body['metadata']['name']}: {e.status} {e.body}")
    assert not refused, "\n".join(refused)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "DaemonSet", "ClusterRole", "NetworkPolicy"} <= kinds
    if values:
        assert {"CronJob", "ServiceMonitor", "PrometheusRule", "DeviceClass"} <= kinds


# -- the chart's components for real ---------------------------------------------------------------


@pytest.fixture
def stack(devcluster, tmp_path) -> Iterator[dict[str, Any]]:
    """The chart installed with Helm; its operator, extender and kube-scheduler running with
    their own service accounts (kubeseer.demo_chart, what `make demo-chart` runs); Prometheus
    scraping them and the profiler, with the chart's rule file."""
    profiler_ports, prometheus_port = (free_port(), free_port()), free_port()
    release = demo_chart.install_release(
        chart_support.helm(),
        devcluster.admin_kubeconfig,
        tmp_path,
        {
            "operator": {"retryDelaySeconds": 1},
            "scheduler": {"name": SCHEDULER},
        },
        release=RELEASE,
        namespace=NAMESPACE,
    )
    ports = release.ports
    prometheus_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(chart_support.RULES)],
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in job_ports]}],
            }
            for job, job_ports in (
                ("operator", [ports.operator_metrics]),
                ("extender", [ports.extender_metrics]),
                ("profiler", profiler_ports),
            )
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
    prometheus = chart_support.prometheus_tool("prometheus")
    with demo_chart.components(
        release,
        chart_support.binaries.locate(),
        tmp_path,
        KUBESEER_OBSERVATION_STORE=str(tmp_path / "store"),
    ) as procs:
        procs.start(
            "prometheus",
            [str(prometheus), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}",
             # A series born with its first count (a new family's error histogram) gets its
             # zero from the client's _created line, so rate() sees that first observation.
             "--enable-feature=created-timestamp-zero-ingestion"],
        )  # fmt: skip
        procs.wait_http(f"http://127.0.0.1:{prometheus_port}/-/ready", "Prometheus", 60)
        api = panels.PrometheusApi(f"http://127.0.0.1:{prometheus_port}")
        # The operator and the extender scraped once before anything happens, so their
        # counters start from a sample (the profilers start with the pods they watch).
        deadline = time.monotonic() + 30
        while not (
            (targets := [t for t in api.targets() if t["labels"]["job"] != "profiler"])
            and len(targets) == 2
            and all(t["health"] == "up" for t in targets)
        ):
            assert time.monotonic() < deadline, f"targets not scraped: {targets}"
            time.sleep(0.5)
        yield {
            "release": release,
            "procs": procs,
            "profiler_ports": profiler_ports,
            "tmp": tmp_path,
            "prometheus": api,
        }


JOBS = {
    # Inference of a small MLP on a whole H100: it reports SM activity (GPM), so the SM panel
    # has both series.
    "charted": ("NVIDIA-H100-80GB-HBM3", "model", "infer", 8),
    # Training of a wider MLP on an A100 MIG slice: its unused memory is the stranded-MIG
    # panel's.
    "sliced": ("NVIDIA-A100-SXM4-80GB", "wide", "train", 64),
}


def submit(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    job: tuple[str, str, str, int],
) -> None:
    product, model, mode, batch = job
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DLJob",
            "metadata": {"name": name, "labels": {"kubeseer.io/model-family": "mlp"}},
            "spec": {
                "model": {"configMapRef": {"name": model, "key": "model.onnx"}},
                "mode": mode,
                "batchSize": batch,
                "template": {
                    # KWOK keeps the Job's pod running until the test ends it.
                    "metadata": {
                        "annotations": {
                            "pod-complete.stage.kwok.x-k8s.io/delay": "24h",
                            "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "24h",
                        }
                    },
                    "spec": {"containers": [{"name": "main", "image": "example/job:1"}]},
                },
                "placement": {"gpuProducts": [product]},
            },
        },
    )


def start_profiler(stack: dict[str, Any], placed: dict[str, Any], pod: Any, port: int) -> None:
    """`kubeseer profiler` for the pod's node, as the chart's DaemonSet runs it there, reading
    the NVML stand-in: the job peaks 20 % (charted) or 5 % (sliced) above its bound."""
    release: demo_chart.Release = stack["release"]
    node, name = pod.spec.node_name, pod.metadata.name
    upper = int(pod.metadata.annotations["kubeseer.io/predicted-memory-bytes"])
    proc = stack["tmp"] / f"proc-{node}"
    for pid, text in (
        (POD_PID, cgroup_of(pod.metadata.uid, "a" * 64)),
        (SYSTEM_PID, "0::/system.slice/x.service\n"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    scenario, _ = scenario_for(placed["status"]["placement"], pod.metadata.uid)
    over = 1.2 if name.startswith("charted") else 1.05
    scenario["processes"][0].update(
        used_bytes=int(upper * over), profile=[[4.0, int(upper * (over - 0.1))]]
    )
    (stack["tmp"] / f"scenario-{name}.json").write_text(json.dumps(scenario))
    profiler = demo_chart.container(
        release.objects, "DaemonSet", release.name("profiler"), "profiler"
    )
    stack["procs"].start(
        f"profiler-{node}",
        [sys.executable, "-m", "kubeseer.cli", *profiler["args"], "--node", node,
         "--kubeconfig", str(release.kubeconfigs["profiler"]),
         "--nvml-standin", str(stack["tmp"] / f"scenario-{name}.json"), "--proc-root", str(proc),
         "--period", "0.2", "--warmup", "5", "--report-interval", "1", "--pods-refresh", "1",
         "--metrics-port", str(port)],
        demo_chart.environment(profiler, NAMESPACE, node),
    )  # fmt: skip


def finish(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "main", "image": "example/job:1", "imageID": "", "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                 "startedAt": now, "finishedAt": now}},
                    }
                ],
            }
        },
    )  # fmt: skip


def test_the_chart_runs_with_its_own_rbac_and_prometheus_sees_every_query(
    devcluster, admin_api, stack, namespace, wait_for
):
    started = time.time()
    core = client.CoreV1Api(admin_api)
    custom = client.CustomObjectsApi(admin_api)
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "model"},
            "binaryData": {"model.onnx": base64.b64encode(small_model()).decode()},
        },
    )
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {"name": "wide"},
            "binaryData": {"model.onnx": base64.b64encode(mlp(width=2048, layers=4)).decode()},
        },
    )
    for name, job in JOBS.items():
        submit(custom, namespace, name, job)

    def phase(name: str, wanted: str) -> Any:
        def probe() -> dict[str, Any] | None:
            got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return got if got.get("status", {}).get("phase") == wanted else None

        return probe

    release: demo_chart.Release = stack["release"]
    ports = release.ports
    pods = {}
    for (name, _), port in zip(JOBS.items(), stack["profiler_ports"], strict=True):
        placed = wait_for(
            f"{name} Running through the chart's scheduler", phase(name, "Running"), 120
        )
        (pod,) = core.list_namespaced_pod(
            namespace, label_selector=f"kubeseer.io/dljob={name}"
        ).items  # the pod of the attempt's Job
        assert pod.spec.scheduler_name == SCHEDULER
        pods[name] = pod
        start_profiler(stack, placed, pod, port)
    assert pods["sliced"].spec.node_name != pods["charted"].spec.node_name
    extender = metrics_text(ports.extender_metrics)
    decided = ("kubeseer_extender_decisions_total", (("decision", "decided"), ("verb", "filter")))
    assert extender[decided] >= 2

    def observed(name: str) -> Any:
        def probe() -> dict[str, Any] | None:
            got = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            entry = (
                got.get("status", {})
                .get("observed", {})
                .get("pods", {})
                .get(pods[name].metadata.name)
            )
            return entry if entry and entry["window"]["warmedUp"] else None

        return probe

    for name in JOBS:
        wait_for(f"status.observed of {name} from the chart's profiler", observed(name), 60)
    prometheus: panels.PrometheusApi = stack["prometheus"]

    def raised() -> set[str]:
        return {a["labels"]["alertname"] for a in prometheus.alerts()}

    # Prometheus, with the chart's rules, raises the alert while the pods run above their bound.
    wait_for(
        "KubeseerObservedMemoryAboveBound",
        lambda: "KubeseerObservedMemoryAboveBound" in raised(),
        30,
    )
    # The running pods' series scraped a few times (a minute when drawing docs/'s images).
    time.sleep(60 if os.environ.get("KUBESEER_PANELS_OUT") else 2)
    for pod in pods.values():
        finish(core, namespace, pod.metadata.name)

    def recorded() -> bool:
        series = metrics_text(ports.operator_metrics)
        return (
            sum(
                value
                for (metric, _), value in series.items()
                if metric == "kubeseer_feedback_bound_exceeded_total"
            )
            >= 2
        )

    wait_for("the operator's feedback of the finished attempts", recorded, 60)
    # Scraped (for docs/'s images, long enough for the error panels to show a line).
    time.sleep(30 if os.environ.get("KUBESEER_PANELS_OUT") else 3)
    node = pods["charted"].spec.node_name

    # Prometheus scraped all three and loaded the chart's rules.
    targets = prometheus.targets()
    assert sorted(t["labels"]["job"] for t in targets) == [
        "extender",
        "operator",
        "profiler",
        "profiler",
    ]
    assert all(t["health"] == "up" for t in targets), targets
    rules = prometheus.rules()
    assert len(rules) == 7 and all(r["health"] == "ok" for r in rules), rules

    # Every dashboard query and every alert's signal returns series.
    board = chart_support.dashboard()
    end = time.time()
    results: dict[tuple[int, str], list[panels.Series]] = {}
    empty = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            series = prometheus.range_query(
                chart_support.substitute(target["expr"]), started, end, 1
            )
            results[(panel["id"], target["refId"])] = series
            if not series:
                empty.append(f"panel {panel['title']!r} {target['refId']}")
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            selector = chart_support.substitute(
                variable["query"]["query"].split("(", 1)[1].rsplit(",", 1)[0]
            )
            if not prometheus.range_query(selector, started, end, 1):
                empty.append(f"variable {variable['name']}")
    queries = list(chart_support.rule_queries())
    for query, parsed in zip(queries, chart_support.parse([q.expr for q in queries]), strict=True):
        if not prometheus.range_query(parsed.signal, started, end, 1):
            empty.append(f"{query.where} signal {parsed.signal}")
    assert not empty, "queries that returned no series:\n" + "\n".join(empty)

    out = Path(os.environ.get("KUBESEER_PANELS_OUT") or stack["tmp"] / "panels")
    out.mkdir(parents=True, exist_ok=True)
    images = panels.render_rows(board, results, out)
    assert len(images) == 4 and all(p.stat().st_size > 10_000 for p in images)

    # Nothing the components did was forbidden by the chart's roles ...
    for record in stack["procs"].records:
        log = Path(record.log).read_text(errors="replace")
        assert "forbidden" not in log.lower(), (
            f"{record.name}: {process.log_tail(Path(record.log))}"
        )

    # ... and what they do not need is.
    def denied(account: str, call: Any) -> int:
        api = config.new_client_from_config(config_file=str(release.kubeconfigs[account]))
        with pytest.raises(ApiException) as refused:
            call(api)
        return refused.value.status

    assert (
        denied("operator", lambda a: client.CoreV1Api(a).list_namespaced_secret("kube-system"))
        == 403
    )
    assert (
        denied(
            "operator",
            lambda a: client.CoreV1Api(a).delete_namespaced_pod(
                pods["charted"].metadata.name, namespace
            ),
        )
        == 403
    )
    assert denied("operator", lambda a: client.CoreV1Api(a).delete_node(node)) == 403
    assert (
        denied(
            "scheduler",
            lambda a: client.CustomObjectsApi(a).patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "charted", {"status": {"phase": "Failed"}}
            ),
        )
        == 403
    )
    assert (
        denied("scheduler", lambda a: client.CoreV1Api(a).list_namespaced_secret(NAMESPACE)) == 403
    )
    assert (
        denied(
            "profiler",
            lambda a: client.CustomObjectsApi(a).patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "charted", {"metadata": {"labels": {"x": "y"}}}
            ),
        )
        == 403
    )
    assert (
        denied(
            "profiler", lambda a: client.CoreV1Api(a).read_namespaced_config_map("model", namespace)
        )
        == 403
    )
