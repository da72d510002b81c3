"""docker/ monitoring assets: Prometheus alert rules and the Grafana dashboard.

Structure is always checked; promtool (Debian package ``prometheus``), when installed, also
checks the rules' syntax and runs their unit tests (docker/prometheus-alerts.test.yml).
Every metric the assets use must be one the relay exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.metrics import every_exported_name

DOCKER = Path(__file__).resolve().parents[2] / "docker"
RULES = DOCKER / "prometheus-alerts.yml"
#: Metrics that Prometheus itself writes for every target.
PROMETHEUS_BUILTINS = {"up"}
#: PromQL words that may precede "(" or "{" and are not metric names.
_PROMQL_WORDS = {
    "and", "or", "unless", "on", "ignoring", "by", "without", "group_left", "group_right",
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile",
    "time", "absent", "le", "bool", "offset",
}  # fmt: skip
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[|\s*(?:[<>=!]=?|$|\)))")


def metric_names(expr: str) -> set[str]:
    """Names of the metrics an expression selects (words followed by {, [, a comparison,
    a closing parenthesis or the end), without PromQL keywords and label names."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values and strings
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    return {m for m in _SELECTOR.findall(expr) if m not in _PROMQL_WORDS}


def load_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("groups"), list)
    rules: list[dict[str, Any]] = []
    for group in doc["groups"]:
        assert group.get("name"), group
        assert isinstance(group.get("rules"), list) and group["rules"]
        rules.extend(group["rules"])
    return rules


def grafana_exprs() -> list[str]:
    doc = json.loads((DOCKER / "grafana-dashboard.json").read_text())
    exprs = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            exprs.append(target["expr"])
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"].replace("label_values(", "(").split(",")[0] + ")")
    return exprs


def test_metric_name_extraction() -> None:
    assert metric_names('up{job="x"} == 0') == {"up"}
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{i=~"$i"}[5m])))') == {
        "a_bucket"
    }
    assert metric_names('b == 0 and on(instance) c{mode="cdc"} == 1') == {"b", "c"}
    assert metric_names("time() - d") == {"d"}


def test_rules_are_well_formed_and_cover_the_required_alerts() -> None:
    rules = load_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "duplicate alert names"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["expr"].strip()
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"].strip()
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    required = {
        "CdcOutboxSlotLagHigh": "cdc_outbox_slot_lag_bytes >",
        "CdcOutboxSlotWalUnreserved": 'cdc_outbox_slot_wal_status{status="unreserved"}',
        "CdcOutboxSlotLost": 'cdc_outbox_slot_wal_status{status="lost"}',
        "CdcOutboxOldestUnpublishedTooOld": "cdc_outbox_oldest_unpublished_age_seconds >",
        "CdcOutboxRelayDown": 'up{job="cdc-outbox"} == 0',
        "CdcOutboxDeadLettersIncreasing": "increase(cdc_outbox_events_dead_lettered_total",
        # per outbox table (label outbox = schema.table)
        "CdcOutboxOutboxBacklogTooOld": "cdc_outbox_outbox_oldest_unpublished_age_seconds >",
        "CdcOutboxOutboxParkedAggregates": "cdc_outbox_outbox_parked_aggregates >",
        "CdcOutboxPollingFallbackDisabled": "cdc_outbox_polling_fallback_disabled == 1",
    }
    for alert, fragment in required.items():
        assert fragment in exprs.get(alert, ""), alert


def test_every_metric_used_by_rules_and_dashboard_is_exported() -> None:
    exported = every_exported_name() | PROMETHEUS_BUILTINS
    used_by_rules = set().union(*(metric_names(r["expr"]) for r in load_rules()))
    used_by_dashboard = set().union(*(metric_names(e) for e in grafana_exprs()))
    assert "cdc_outbox_slot_lag_bytes" in used_by_rules
    assert "cdc_outbox_commit_to_ack_latency_seconds_bucket" in used_by_dashboard
    assert not used_by_rules - exported, sorted(used_by_rules - exported)
    assert not used_by_dashboard - exported, sorted(used_by_dashboard - exported)


def test_grafana_dashboard_is_importable() -> None:
    doc = json.loads((DOCKER / "grafana-dashboard.json").read_text())
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in doc["panels"]}
    assert {"Slot lag and retained WAL", "Throughput by topic", "Commit→ack latency"} <= titles
    per_outbox = [
        t["expr"]
        for p in doc["panels"]
        if "by outbox table" in p["title"]
        for t in p.get("targets", [])
    ]
    assert len(per_outbox) == 4 and all('outbox=~"$outbox"' in e for e in per_outbox)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert "cdc_outbox_outbox_unpublished_rows, outbox" in variables["outbox"]["definition"]
    for panel in doc["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_promtool_checks_and_unit_tests_the_rules_when_installed() -> None:
    promtool = shutil.which("promtool")
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    assert config["rule_files"] == ["prometheus-alerts.yml"]
    assert config["scrape_configs"][0]["job_name"] == "cdc-outbox"  # what CdcOutboxRelayDown uses
    if promtool is None:  # structure is checked by the tests above
        return
    for args in (["check", "rules", RULES.name], ["test", "rules", "prometheus-alerts.test.yml"]):
        result = subprocess.run(
            [promtool, *args], cwd=DOCKER, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
