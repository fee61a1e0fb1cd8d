"""values.schema.json refuses what the chart cannot use, and says which value and why."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from chart_support import render

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("a misspelt key", {"operator": {"replica": 2}}, "additional properties 'replica' not allowed"),
    ("negative replicas", {"operator": {"replicas": -1}}, "/operator/replicas"),
    ("an unknown pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("an empty repository", {"image": {"repository": ""}}, "/image/repository"),
    (
        "a privileged container",
        {"securityContext": {"privileged": True}},
        "/securityContext/privileged",
    ),
    (
        "privilege escalation",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "/securityContext/allowPrivilegeEscalation",
    ),
    (
        "a writable root filesystem",
        {"securityContext": {"readOnlyRootFilesystem": False}},
        "/securityContext/readOnlyRootFilesystem",
    ),
    (
        "an added capability",
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}},
        "/securityContext/capabilities/add",
    ),
    (
        "a root profiler",
        {"profiler": {"podSecurityContext": {"runAsNonRoot": False}}},
        "/profiler/podSecurityContext/runAsNonRoot",
    ),
    ("user id 0", {"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext/runAsUser"),
    (
        "an unconfined seccomp profile",
        {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "/podSecurityContext/seccompProfile/type",
    ),
    ("a port out of range", {"operator": {"metricsPort": 70000}}, "/operator/metricsPort"),
    (
        "a lease shorter than 3 s",
        {"operator": {"leaseDurationSeconds": 1}},
        "/operator/leaseDurationSeconds",
    ),
    (
        "a size that is no quantity",
        {"datasetStore": {"pvc": {"size": "ten gigs"}}},
        "/datasetStore/pvc/size",
    ),
    ("an unknown store", {"datasetStore": {"type": "nfs"}}, "/datasetStore/type"),
    ("an S3 store without a URL", {"datasetStore": {"type": "s3"}}, "/datasetStore/s3/url"),
    (
        "an S3 URL of another scheme",
        {"datasetStore": {"s3": {"url": "gs://bucket"}}},
        "/datasetStore/s3/url",
    ),
    ("an endpoint without scheme", {"s3": {"endpoint": "minio:9000"}}, "/s3/endpoint"),
    (
        "a numeric dashboard label",
        {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}},
        "/grafanaDashboard/labels/grafana_dashboard",
    ),
    ("a cron line of three fields", {"retraining": {"schedule": "0 3 *"}}, "/retraining/schedule"),
    (
        "an output outside the store",
        {"retraining": {"output": "../../etc/x.pt"}},
        "/retraining/output",
    ),
    (
        "a replay outside the store",
        {"retraining": {"replay": "../data"}},
        "/retraining/replay",
    ),
    (
        "a relative base checkpoint",
        {"retraining": {"baseCheckpoint": "default.pt"}},
        "/retraining/baseCheckpoint",
    ),
    (
        "a resource the extender cannot manage",
        {"scheduler": {"extender": {"managedResources": ["amd.com/gpu"]}}},
        "/scheduler/extender/managedResources/0",
    ),
    (
        "no managed resource at all",
        {"scheduler": {"extender": {"managedResources": []}}},
        "/scheduler/extender/managedResources",
    ),
    (
        "a timeout that is no duration",
        {"scheduler": {"extender": {"httpTimeout": "five"}}},
        "/scheduler/extender/httpTimeout",
    ),
    (
        "an error ratio above 1",
        {"prometheusRule": {"thresholds": {"extenderErrorRatio": 2}}},
        "/prometheusRule/thresholds/extenderErrorRatio",
    ),
    (
        "a scrape interval without unit",
        {"serviceMonitor": {"interval": "30"}},
        "/serviceMonitor/interval",
    ),
    (
        "a namespace with capitals",
        {"operator": {"watchNamespaces": ["Team-A"]}},
        "/operator/watchNamespaces/0",
    ),
    ("a string where a number goes", {"operator": {"maxAttempts": "3"}}, "/operator/maxAttempts"),
]

BAD_COMBINATIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "a margin window smaller than its minimum",
        {"operator": {"recalibration": {"minSamples": 50, "window": 20}}},
        "operator.recalibration.window must be at least operator.recalibration.minSamples",
    ),
    (
        "retraining without a store",
        {"retraining": {"enabled": True}, "datasetStore": {"type": "none"}},
        "retraining.enabled needs an observation store",
    ),
    (
        "retraining on S3 with nowhere to write",
        {
            "retraining": {"enabled": True},
            "datasetStore": {"type": "s3", "s3": {"url": "s3://observations/cluster-a"}},
        },
        "needs retraining.outputClaim",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"),
    [(v, m) for _, v, m in BAD_VALUES + BAD_COMBINATIONS],
    ids=[why for why, _, _ in BAD_VALUES + BAD_COMBINATIONS],
)
def test_bad_values_are_refused_naming_the_value(values, message):
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render(values)
    assert message in refused.value.stderr, refused.value.stderr
