"""The sections of config/ (issue 35): built from the settings by the function beside each,
holding the values their component reads, and never printing a secret."""

from __future__ import annotations

from cdc_outbox.config.database import database_section
from cdc_outbox.config.ha import leadership_section
from cdc_outbox.config.monitoring import health_section, heartbeat_section, slot_monitor_section
from cdc_outbox.config.polling import polling_section
from cdc_outbox.config.service import service_section
from cdc_outbox.config.settings import Settings

SETTINGS = Settings.model_validate(
    {
        "dsn": "host=db dbname=shop user=relay password=hunter2",
        "slot_name": "s1",
        "leader_lease_s": 7.0,
        "heartbeat_interval_s": 3.0,
        "monitor_interval_s": 2.0,
        "db_pool_max_size": 6,
        "kafka": {"bootstrap_servers": "k:9092", "config": {"sasl.password": "kafka-pw"}},
        "columns": {"preset": "debezium"},
    }
)


def test_sections_carry_what_their_component_reads() -> None:
    db = database_section(SETTINGS)
    assert (db.postgres_dsn(), db.db_pool_max_size) == (SETTINGS.postgres_dsn(), 6)
    assert sorted(db.secret_values()) == sorted(SETTINGS.secret_values())
    beat = heartbeat_section(SETTINGS)
    assert (beat.slot_name, beat.interval_s, beat.database) == ("s1", 3.0, db)
    lead = leadership_section(SETTINGS)
    assert (lead.slot_name, lead.lease_s, lead.database) == ("s1", 7.0, db)
    monitor = slot_monitor_section(SETTINGS)
    assert (monitor.interval_s, monitor.mode) == (2.0, "auto")
    assert monitor.fallback_blocked is not None
    assert monitor.fallback_blocked[0] == "statusless_outbox"
    assert health_section(SETTINGS).kafka_config == SETTINGS.kafka_config()
    assert polling_section(SETTINGS).polling == SETTINGS.polling
    service = service_section(SETTINGS)
    assert (service.mode.mode, service.slot_name) == ("cdc", "s1")
    assert service.loop_stale_s == SETTINGS.health.loop_stale_s


def test_no_section_prints_a_secret() -> None:
    sections = [
        database_section(SETTINGS),
        leadership_section(SETTINGS),
        heartbeat_section(SETTINGS),
        health_section(SETTINGS),
        slot_monitor_section(SETTINGS),
        polling_section(SETTINGS),
        service_section(SETTINGS),
    ]
    for section in sections:
        text = repr(section)
        assert "hunter2" not in text and "kafka-pw" not in text, text
