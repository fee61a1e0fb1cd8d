"""Every PromQL expression of the dashboard and the alert rules, read by Prometheus' own parser
(hack/promql-names), uses only metrics kubeseer.metrics declares: a renamed or removed metric
fails here, not in an admin's empty panel."""

from __future__ import annotations

import pytest
from chart_support import dashboard_queries, declared_metric_names, parse, rule_queries


@pytest.fixture(scope="module")
def parsed():
    queries = [*dashboard_queries(), *rule_queries()]
    return list(zip(queries, parse([q.expr for q in queries]), strict=True))


def test_every_expression_parses(parsed):
    errors = [f"{q.where}: {p.error}" for q, p in parsed if p.error]
    assert not errors, "\n".join(errors)


def test_every_expression_selects_only_declared_metrics(parsed):
    declared = declared_metric_names()
    unknown = [f"{q.where}: {m}" for q, p in parsed for m in p.metrics if m not in declared]
    assert not unknown, "\n".join(unknown)
    assert all(p.metrics for _, p in parsed), "an expression selects no metric at all"


def test_every_alert_compares_a_signal_with_a_threshold(parsed):
    alerts = [(q, p) for q, p in parsed if q.where.startswith("alert ")]
    assert len(alerts) == 7
    assert all(p.signal for _, p in alerts), [q.where for q, p in alerts if not p.signal]


def test_a_misspelt_metric_is_caught():
    (parsed,) = parse(["sum(rate(kubeseer_operator_placement_total[5m])) > 0"])
    assert parsed.metrics == ("kubeseer_operator_placement_total",)
    assert "kubeseer_operator_placement_total" not in declared_metric_names()
    (broken,) = parse(["sum(rate(kubeseer_operator_placements_total[5m]) > "])
    assert broken.error
