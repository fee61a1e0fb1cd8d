"""The alert rules as Prometheus itself checks them: `promtool check rules` on the rendered file
and `promtool test rules` with one unit test per alert (promtool/kubeseer-rules.test.yaml)."""

from __future__ import annotations

import subprocess

import yaml
from chart_support import PROMTOOL_TESTS, RULES, prometheus_tool, rules


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(prometheus_tool("promtool")), *args], capture_output=True, text=True, check=False
    )


def test_promtool_checks_the_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(PROMTOOL_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire():
    alerts = {r["alert"] for g in rules()["groups"] for r in g["rules"]}
    tested = {
        case["alertname"]
        for test in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert alerts == tested


def test_every_alert_follows_the_mixin_conventions():
    for group in rules()["groups"]:
        for rule in group["rules"]:
            assert rule["alert"].startswith("Kubeseer"), rule["alert"]
            assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
            assert set(rule["annotations"]) >= {"summary", "description"}, rule["alert"]
            assert rule["annotations"]["summary"].endswith("."), rule["alert"]
