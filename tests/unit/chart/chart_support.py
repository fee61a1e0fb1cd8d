"""What the chart's tests share: Helm and the Prometheus tools from their cached builds, the
chart rendered with given values, every PromQL expression of the dashboard and the rules, and
the metric names kubeseer.metrics declares.

Not a test module: the tests beside it import it (pytest puts this directory on sys.path). The
end-to-end chart tests import it too.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.devcluster import binaries, errors

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "kubeseer"
DASHBOARD = CHART / "dashboards" / "kubeseer.json"
RULES = REPO / "deploy" / "monitoring" / "kubeseer-rules.yaml"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool" / "kubeseer-rules.test.yaml"

# Every optional feature on: what `helm lint` and the server-side dry run see besides defaults.
ALL_FEATURES: Mapping[str, Any] = {
    "operator": {"watchNamespaces": ["team-a", "team-b"], "verbose": True},
    "s3": {"endpoint": "https://minio.example:9000", "secretName": "kubeseer-s3-credentials"},
    "dra": {"enabled": True, "createDeviceClasses": True},
    "profiler": {"runtimeClassName": "nvidia"},
    "retraining": {"enabled": True, "includeStandin": True},
    "networkPolicy": {
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    },
    "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "GPU"}},
    "imagePullSecrets": ["registry-credentials"],
    "commonLabels": {"team": "ml-platform"},
}


def _render_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "render_deploy", REPO / "hack" / "render_deploy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_deploy = _render_module()


@functools.cache
def helm() -> Path:
    """Helm from the control-plane build (built first where Go is; seconds when cached);
    skips the test where it cannot exist."""
    if binaries.go_available():
        return binaries.build().path("helm")
    try:
        return binaries.locate().path("helm")
    except errors.BinariesMissingError as e:
        pytest.skip(f"Go is not installed, so Helm cannot be built here ({e})")


def render(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The chart's objects for these values (release kubeseer in kubeseer-system by default)."""
    return render_deploy.documents(render_deploy.template(values, helm=helm(), **kwargs))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


# -- Prometheus tools (hack/build-prometheus.sh) ---------------------------------------------------


def _prometheus_env() -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in (REPO / "hack" / "prometheus.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )


def prometheus_dir() -> Path:
    return binaries.cache_root() / "bin" / f"prometheus-{_prometheus_env()['PROMETHEUS_VERSION']}"


def monitoring_crd(name: str) -> Path:
    """A Prometheus Operator CRD (e.g. monitoring.coreos.com_servicemonitors.yaml), from its
    Go module by hack/build-prometheus.sh."""
    prometheus_tool("prometheus")
    version = _prometheus_env()["PROMETHEUS_OPERATOR_VERSION"]
    return prometheus_dir() / "crds" / version / name


@functools.cache
def prometheus_tool(name: str) -> Path:
    """prometheus, promtool or promql-names, built first if Go is here; skips where it is not."""
    if not binaries.go_available() and not prometheus_dir().is_dir():
        pytest.skip("Go is not installed, so Prometheus cannot be built here")
    subprocess.run(["bash", str(REPO / "hack" / "build-prometheus.sh")], check=True)
    if name == "promql-names":
        found = sorted(prometheus_dir().glob("promql-names-*"))
        assert found, "hack/build-prometheus.sh built no promql-names"
        return found[-1]
    return prometheus_dir() / name


@dataclass(frozen=True)
class Parsed:
    """One expression as Prometheus' parser read it."""

    error: str
    metrics: tuple[str, ...]
    signal: str


def parse(expressions: list[str]) -> list[Parsed]:
    """Each expression through Prometheus' own PromQL parser (hack/promql-names)."""
    out = subprocess.run(
        [str(prometheus_tool("promql-names"))],
        input=json.dumps(expressions),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        Parsed(r.get("error", ""), tuple(r["metrics"]), r.get("signal", ""))
        for r in json.loads(out)
    ]


# -- the expressions -----------------------------------------------------------------------------

# Grafana's variables, as a query for the last hour would see them with every value selected.
GRAFANA_VARIABLES = {
    "$__rate_interval": "2m",
    "$__interval": "30s",
    "$__range": "1h",
    "$namespace": ".*",
    "$dljob": ".*",
    "$family": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


def substitute(expr: str) -> str:
    for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
    return expr


@dataclass(frozen=True)
class Query:
    """A PromQL expression the dashboard or the rules run, and where it comes from."""

    where: str
    expr: str


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_queries(board: dict[str, Any] | None = None) -> Iterator[Query]:
    """Every panel target and query variable, Grafana's variables substituted (a variable's
    `label_values(selector, label)` contributes its selector)."""
    board = board or dashboard()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield Query(f"panel {panel['title']!r} {target['refId']}", substitute(target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["query"]["query"])
        assert match and match["selector"], f"variable {variable['name']}: not label_values(...)"
        yield Query(f"variable {variable['name']}", substitute(match["selector"]))


def rules(text: str | None = None) -> dict[str, Any]:
    return dict(yaml.safe_load(text or RULES.read_text()))


def rule_queries(groups: dict[str, Any] | None = None) -> Iterator[Query]:
    for group in (groups or rules())["groups"]:
        for rule in group["rules"]:
            yield Query(f"alert {rule.get('alert') or rule.get('record')}", rule["expr"])


def declared_metric_names() -> frozenset[str]:
    """Every series name kubeseer.metrics can export (a histogram's _bucket, _count, _sum)."""
    registry = CollectorRegistry()
    metrics.OperatorMetrics(registry, profiles=["H100-80GB-HBM3/whole"])
    metrics.FeedbackMetrics(registry)
    metrics.ProfilerMetrics(registry)
    metrics.ExtenderMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
            "gauge": ("",),
        }[family.type]
        names.update(family.name + suffix for suffix in suffixes)
    return frozenset(names)
