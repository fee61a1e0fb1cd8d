#!/usr/bin/env python3
"""Renders deploy/ from charts/kubeseer, or checks that it is what the chart renders.

The chart is the one source of kubeseer's manifests. deploy/ keeps plain copies for those who
install without Helm and for the local control plane (`kubeseer devcluster up` and the
end-to-end tests apply deploy/crds and deploy/rbac): the chart rendered with its default values
as release `kubeseer` in namespace `kubeseer-system`, one file per chart template, comments
kept; the alert rules as a plain Prometheus rule file and the dashboard JSON. A unit test
(tests/unit/chart/test_chart_render.py) compares them, so a manifest edited in deploy/ alone,
or a chart change not rendered here, fails the build. The CRD goes the other way: it is edited
in deploy/crds and copied into the chart's crds/ (which Helm applies verbatim) by this script.
Not rendered: deploy/rbac/00-namespace.yaml (Helm creates the namespace with
--create-namespace), deploy/dra and deploy/devcluster (the local cluster's).

Usage: .venv/bin/python hack/render_deploy.py [--check]
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "kubeseer"
DEPLOY = REPO / "deploy"
RELEASE = "kubeseer"
NAMESPACE = "kubeseer-system"
HEADER = "# Rendered from charts/kubeseer by hack/render_deploy.py: edit the chart, not this.\n"

# Chart template -> deploy/ file. Templates not named here (the store's claim, NetworkPolicies,
# monitoring objects, retraining, DRA DeviceClasses) are for Helm installs only.
MANIFESTS: Mapping[str, str] = {
    "templates/rbac/10-serviceaccount.yaml": "rbac/10-serviceaccount.yaml",
    "templates/rbac/20-clusterrole.yaml": "rbac/20-clusterrole.yaml",
    "templates/rbac/30-clusterrolebinding.yaml": "rbac/30-clusterrolebinding.yaml",
    "templates/rbac/50-role-leader-lease.yaml": "rbac/50-role-leader-lease.yaml",
    "templates/rbac/60-profiler.yaml": "rbac/60-profiler.yaml",
    "templates/operator/deployment.yaml": "operator/deployment.yaml",
    "templates/profiler/daemonset.yaml": "profiler/daemonset.yaml",
    "templates/scheduler/00-rbac.yaml": "scheduler/00-rbac.yaml",
    "templates/scheduler/10-config.yaml": "scheduler/10-config.yaml",
    "templates/scheduler/20-deployment.yaml": "scheduler/20-deployment.yaml",
}
# deploy/ values: no claim exists without Helm, so the plain manifests keep no store (the
# operator records nothing until an admin sets KUBESEER_OBSERVATION_STORE).
DEPLOY_VALUES: Mapping[str, Any] = {"datasetStore": {"type": "none"}}
# Templates rendered with values of their own: the Role that lets the operator read the S3
# Secret, ready for an admin who creates kubeseer-s3-credentials and sets KUBESEER_S3_SECRET (the
# chart sets both together; the Deployment above reads no Secret, which would fail its start).
SEPARATE: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "templates/rbac/40-role-s3-credentials.yaml": (
        "rbac/40-role-s3-credentials.yaml",
        {**DEPLOY_VALUES, "s3": {"endpoint": "", "secretName": "kubeseer-s3-credentials"}},
    ),
}
RULES_FILE = "monitoring/kubeseer-rules.yaml"
DASHBOARD_FILE = "monitoring/kubeseer-dashboard.json"


def kube_version() -> str:
    """The Kubernetes version the local control plane runs (hack/versions.env)."""
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise SystemExit("hack/versions.env names no KUBERNETES_VERSION")


def helm_binary() -> Path:
    """Helm from the control-plane build (hack/build-control-plane.sh)."""
    sys.path.insert(0, str(REPO))
    from kubeseer.devcluster import binaries

    return binaries.locate().path("helm")


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    show_only: Sequence[str] = (),
    helm: Path | None = None,
) -> str:
    """`helm template` of the chart; raises CalledProcessError (stderr kept) when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump(dict(values or {}), file)
        file.flush()
        argv = [
            str(helm or helm_binary()),
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            kube_version(),
            "--values",
            file.name,
        ]
        for path in show_only:
            argv += ["--show-only", path]
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest stream (empty documents dropped)."""
    return [d for d in yaml.safe_load_all(text) if d]


def by_template(text: str) -> dict[str, str]:
    """Rendered text per chart template (`templates/...`), comments kept."""
    chunks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith("# Source: "):
            source = line.removeprefix("# Source: ").strip().split("/", 1)[1]
            current = chunks.setdefault(source, [])
            continue
        if current is not None:
            current.append(line)
    return {source: _tidy("".join(lines)) for source, lines in chunks.items()}


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and lines[-1] in ("", "---"):
        lines.pop()
    return "\n".join(lines) + "\n"


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, as they are written in the chart."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)


def rendered(helm: Path | None = None) -> dict[str, str]:
    """Every file of deploy/ that the chart renders, by path relative to deploy/."""
    files: dict[str, str] = {}
    chunks = by_template(template(DEPLOY_VALUES, helm=helm))
    for source, target in MANIFESTS.items():
        if source not in chunks:
            raise SystemExit(f"the chart rendered nothing for {source}")
        files[target] = HEADER + chunks[source]
    for source, (target, values) in SEPARATE.items():
        chunk = by_template(template(values, show_only=[source], helm=helm))[source]
        files[target] = HEADER + chunk
    rule = documents(
        template(
            {"prometheusRule": {"enabled": True}},
            show_only=["templates/monitoring/prometheusrule.yaml"],
            helm=helm,
        )
    )[0]
    files[RULES_FILE] = HEADER + yaml.dump(
        rule["spec"], Dumper=_BlockDumper, sort_keys=False, width=100
    )
    files[DASHBOARD_FILE] = (CHART / "dashboards" / "kubeseer.json").read_text()
    return files


def sync_crds(*, check: bool) -> list[str]:
    """deploy/crds is where the DLJob CRD is edited (the operator's owners); the chart carries
    copies in crds/, which Helm applies verbatim. Copies them over (or, with `check`, lists the
    files that differ)."""
    differ = []
    chart_crds = CHART / "crds"
    wanted = {p.name: p.read_text() for p in sorted((DEPLOY / "crds").glob("*.yaml"))}
    present = {p.name: p.read_text() for p in sorted(chart_crds.glob("*.yaml"))}
    for name in sorted(set(wanted) | set(present)):
        if wanted.get(name) == present.get(name):
            continue
        differ.append(f"charts/kubeseer/crds/{name}")
        if check:
            continue
        if name in wanted:
            (chart_crds / name).write_text(wanted[name])
        else:
            (chart_crds / name).unlink()
        print(f"synced charts/kubeseer/crds/{name} from deploy/crds")
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if deploy/ differs")
    args = parser.parse_args()
    drift = []
    for relative, text in rendered().items():
        path = DEPLOY / relative
        old = path.read_text() if path.exists() else ""
        if old == text:
            continue
        if args.check:
            drift.append(
                "".join(
                    difflib.unified_diff(
                        old.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        f"deploy/{relative}",
                        f"chart -> deploy/{relative}",
                    )
                )
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote deploy/{relative}")
    stale = sync_crds(check=args.check)
    if args.check and stale:
        drift.append(f"{', '.join(stale)} differ from deploy/crds\n")
    if drift:
        print("".join(drift))
        print("deploy/ differs from the chart: run .venv/bin/python hack/render_deploy.py")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
