"""docker/compose.yaml: valid against the Compose specification (check-jsonschema's bundled
compose-spec schema, offline), broken copies rejected, and wired as documented: PostgreSQL
with logical WAL, KRaft Kafka, init from the relay image, two relays, Prometheus with the
alert rules (promtool), Grafana provisioned. Every CDC_OUTBOX_* variable is a real setting."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_outbox.errors import ConfigError
from tests.support.deploy import DOCKER, image_env, relay_env, settings_of

COMPOSE = DOCKER / "compose.yaml"


def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())  # resolves the << merge keys
    assert isinstance(doc, dict)
    return doc


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def check_compose_spec(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with its bundled copy of the Compose specification schema."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_compose_file_is_valid_compose_spec() -> None:
    result = check_compose_spec(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (("stop_grace_period: 40s", "stop_grace: 40s"), "stop_grace"),  # unknown key
        (("condition: service_completed_successfully", "condition: service_done"),
         "service_done"),  # not one of the allowed values
        (('      - "9078:9077"', '      - ["9078", "9077"]'), "9078"),  # wrong type
        (("  pgdata:\n", "  pgdata: 42\n"), "42"),
    ],
)  # fmt: skip
def test_a_broken_compose_file_is_rejected(
    tmp_path: Path, change: tuple[str, str], complaint: str
) -> None:
    text = COMPOSE.read_text()
    assert change[0] in text
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace(change[0], change[1], 1))
    result = check_compose_spec(broken)
    assert result.returncode == 1, result.stdout
    assert "Schema validation errors" in result.stdout and complaint in result.stdout


def test_databases_and_init() -> None:
    s = services()
    assert s["postgres"]["image"] == "postgres:15"
    assert s["postgres"]["command"] == ["postgres", "-c", "wal_level=logical"]
    kafka = s["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert not any("ZOOKEEPER" in key for key in kafka["environment"])
    init = s["init"]
    assert init["command"] == ["init", "--create-table"]
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert init["image"] == s["relay-1"]["image"] and init["build"] == s["relay-1"]["build"]
    build = init["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
        DOCKER / "Dockerfile"
    )


def test_two_relays_one_image_with_grace() -> None:
    s = services()
    relays = {name: svc for name, svc in s.items() if svc.get("command") == ["run"]}
    assert sorted(relays) == ["relay-1", "relay-2"]
    host_ports = set()
    for svc in relays.values():
        assert svc["image"] == s["init"]["image"]
        assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
        settings = settings_of({**image_env(), **relay_env(svc)})
        assert settings.kafka.bootstrap_servers == "kafka:9092"
        grace = float(re.fullmatch(r"(\d+)s", svc["stop_grace_period"]).group(1))  # type: ignore[union-attr]
        assert grace > settings.shutdown_grace_s + 5
        (mapping,) = svc["ports"]
        host, container = mapping.split(":")
        assert int(container) == settings.metrics_port
        host_ports.add(host)
    assert len(host_ports) == 2
    writer = s["writer"]
    assert writer["entrypoint"] == ["python", "/opt/cdc-outbox/writer.py"]
    assert "./writer.py:/opt/cdc-outbox/writer.py:ro" in writer["volumes"]


def test_every_cdc_outbox_variable_is_a_real_setting() -> None:
    for name, svc in services().items():
        env = relay_env(svc)
        if any(k.startswith("CDC_OUTBOX_") for k in env):
            settings_of({**image_env(), **env})  # raises ConfigError for a misspelt one
            assert svc["image"] == "cdc-outbox:local", name  # only our image reads them
    with pytest.raises(ConfigError, match="unknown setting CDC_OUTBOX_SHUTDOWN_GRACE"):
        settings_of({"CDC_OUTBOX_DSN": "host=x", "CDC_OUTBOX_SHUTDOWN_GRACE": "30"})


def test_bind_mounts_exist() -> None:
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), (name, source)
            else:
                assert source in compose()["volumes"], (name, source)


def test_prometheus_scrapes_both_relays_with_the_alert_rules() -> None:
    s = services()
    mounts = dict(v.split(":")[:2] for v in s["prometheus"]["volumes"])
    assert mounts["./prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./prometheus-alerts.yml"] == "/etc/prometheus/prometheus-alerts.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in s["prometheus"]["command"]
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (static,) = job["static_configs"]
    port = image_env()["CDC_OUTBOX_METRICS_PORT"]
    assert sorted(static["targets"]) == [f"relay-1:{port}", f"relay-2:{port}"]
    promtool = shutil.which("promtool")  # installed by scripts/bootstrap.sh
    assert promtool is not None, "promtool missing: run scripts/bootstrap.sh"
    result = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        cwd=DOCKER, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rules = yaml.safe_load((DOCKER / "prometheus-alerts.yml").read_text())["groups"][0]["rules"]
    assert f"Checking prometheus-alerts.yml\n  SUCCESS: {len(rules)} rules found" in result.stdout


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    grafana = services()["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboard_target = mounts["./grafana-dashboard.json"]
    provisioning = DOCKER / "grafana" / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services()
    assert "9090:9090" in services()["prometheus"]["ports"]
    providers = yaml.safe_load((provisioning / "dashboards" / "cdc-outbox.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert str(Path(dashboard_target).parent) == provider["options"]["path"]
    env = grafana["environment"]
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == dashboard_target
    dashboard = json.loads((DOCKER / "grafana-dashboard.json").read_text())
    variable = dashboard["templating"]["list"][0]  # picks the (default) Prometheus source
    assert variable["type"] == "datasource" and variable["query"] == source["type"]


def test_cache_example_consumer_reads_redis_and_runs_the_example_handler() -> None:
    s = services()
    consumer = s["order-cache"]
    assert consumer["command"][:3] == [
        "consume", "--handler", "examples.cache_invalidation.consumer:handle",
    ]  # fmt: skip
    module = consumer["command"][2].split(":")[0].replace(".", "/") + ".py"
    assert (COMPOSE.parent.parent / module).exists()
    assert "../examples:/opt/cdc-outbox/examples:ro" in consumer["volumes"]
    assert consumer["working_dir"] == "/opt/cdc-outbox"
    assert consumer["environment"]["ORDERS_REDIS_URL"] == "redis://redis:6379/0"
    assert consumer["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "--save" in s["redis"]["command"]
