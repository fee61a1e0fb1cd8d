"""Metric names, units, labels and pre-initialisation."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from kubeseer import metrics


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_metrics_are_registered_only_on_the_registry_given(registry: CollectorRegistry) -> None:
    metrics.OperatorMetrics(registry)
    metrics.OperatorMetrics(CollectorRegistry())  # a second operator in the process is fine
    names = {m.name for m in registry.collect()}
    assert names == {
        "kubeseer_operator_predictions",
        "kubeseer_operator_prediction_duration_seconds",
        "kubeseer_operator_placements",
        "kubeseer_operator_oom_escalations",
        "kubeseer_operator_model_fetch_failures",
        "kubeseer_operator_reconcile_duration_seconds",
    }


def test_counters_end_in_total_and_known_labels_start_at_zero(registry: CollectorRegistry) -> None:
    metrics.OperatorMetrics(registry, profiles=["A100-80GB/1g.10gb"])
    value = registry.get_sample_value
    assert value("kubeseer_operator_predictions_total", {"mode": "train", "outcome": "cached"}) == 0
    assert (
        value(
            "kubeseer_operator_placements_total",
            {"profile": "A100-80GB/1g.10gb", "outcome": "escalated"},
        )
        == 0
    )
    assert (
        value("kubeseer_operator_placements_total", {"profile": "none", "outcome": "no_fit"}) == 0
    )
    assert value("kubeseer_operator_oom_escalations_total", {"outcome": "exhausted"}) == 0
    assert value("kubeseer_operator_model_fetch_failures_total", {"reason": "unreachable"}) == 0
    assert value("kubeseer_operator_reconcile_duration_seconds_count", {"step": "place"}) == 0


def test_every_metric_has_a_help_string(registry: CollectorRegistry) -> None:
    metrics.OperatorMetrics(registry)
    assert all(len(m.documentation) > 20 for m in registry.collect())
