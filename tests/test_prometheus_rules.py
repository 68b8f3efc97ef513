"""deploy/prometheus/alerts.yml loads in Prometheus (``promtool check
rules``), every rule has a unit test that passes (``promtool test rules``),
and every metric a rule names is one GET /metrics exports."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.metrics_names import exported_names, promql_metric_names

RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "alerts_test.yml"
PROMTOOL = shutil.which("promtool")


def promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool not found: apt-get install prometheus (.ci/services.sh does on CI)"
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60
    )


def test_the_rules_load_in_prometheus():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_every_rule_has_a_passing_unit_test():
    ran = promtool("test", "rules", RULE_TESTS.name)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert rules == tested


@pytest.mark.django_db
def test_every_metric_a_rule_names_is_exported(client, settings):
    exported = exported_names(client, settings)
    named = {
        metric
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        for metric in promql_metric_names(rule["expr"])
    }
    assert named and named <= exported, sorted(named - exported)
