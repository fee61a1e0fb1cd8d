"""The extender's metrics: names, units, labels and pre-initialisation (kubeseer/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kubeseer import metrics
from kubeseer.extender import decide


def test_metrics_are_registered_only_on_the_registry_given():
    registry = CollectorRegistry()
    metrics.ExtenderMetrics(registry)
    metrics.ExtenderMetrics(CollectorRegistry())
    assert {m.name for m in registry.collect()} == {
        "kubeseer_extender_request_duration_seconds",
        "kubeseer_extender_requests",
        "kubeseer_extender_decisions",
        "kubeseer_extender_node_rejections",
        "kubeseer_extender_cached_objects",
        "kubeseer_extender_relists",
    }


def test_known_label_values_start_at_zero():
    registry = CollectorRegistry()
    metrics.ExtenderMetrics(registry, reasons=list(decide.Reason))
    value = registry.get_sample_value
    assert value("kubeseer_extender_requests_total", {"verb": "prioritize", "code": "503"}) == 0
    labels = {"verb": "filter", "decision": "malformed_annotation"}
    assert value("kubeseer_extender_decisions_total", labels) == 0
    for reason in decide.Reason:
        assert value("kubeseer_extender_node_rejections_total", {"reason": reason}) == 0
    assert value("kubeseer_extender_relists_total", {"kind": "pod", "cause": "expired"}) == 0
    assert value("kubeseer_extender_request_duration_seconds_count", {"verb": "filter"}) == 0
    assert value("kubeseer_extender_cached_objects", {"kind": "node"}) == 0


def test_the_latency_buckets_resolve_the_20_ms_goal():
    registry = CollectorRegistry()
    metrics.ExtenderMetrics(registry).request_duration.labels(verb="filter").observe(0.015)
    value = registry.get_sample_value
    bucket = "kubeseer_extender_request_duration_seconds_bucket"
    assert value(bucket, {"verb": "filter", "le": "0.01"}) == 0
    assert value(bucket, {"verb": "filter", "le": "0.02"}) == 1


def test_every_metric_has_a_help_string():
    registry = CollectorRegistry()
    metrics.ExtenderMetrics(registry)
    assert all(len(m.documentation) > 20 for m in registry.collect())
