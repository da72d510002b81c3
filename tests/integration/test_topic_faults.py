"""Topic-level Kafka faults are never dead-lettered, and no event is lost.

Against the strict broker (auto-creation off, ACLs enforced): a topic whose writes are denied
is retried and alerted (``cdc_outbox_delivery_alert``) and flows once the ACL is lifted; a
missing topic cannot heal by retrying, so ``run`` ends (exit 7) with one line naming the
topic and the fix, without confirming the stuck events, and a ``run`` after the topic was
created delivers them all.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from prometheus_client import CollectorRegistry, generate_latest

from cdc_outbox.config.settings import Settings
from cdc_outbox.monitoring.latency import LatencyHistogram
from cdc_outbox.monitoring.metrics import RelayCollector
from cdc_outbox.telemetry.relay_stats import RelayStats
from cdc_outbox_dev.readback import count_records, read_topics
from tests.support.helpers import allow_topic_writes, create_topic, deny_topic_writes, wait_until
from tests.support.relay import (
    current_wal_lsn,
    init_outbox,
    outbox_statuses,
    relay_settings,
    relay_thread,
    slot_position,
)
from tests.support.relay_process import RelayProcess

EVENTS = 20


def _metrics(stats: RelayStats) -> str:
    registry = CollectorRegistry()
    registry.register(RelayCollector(lambda: stats, LatencyHistogram(), None, None))
    return generate_latest(registry).decode()


def _write(dsn: str) -> list[str]:
    ids = []
    with psycopg.connect(dsn) as conn:
        for n in range(EVENTS):
            ids.append(str(uuid.uuid4()))
            conn.execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
                " VALUES (%s, 'order', %s, 'OrderPlaced', %s)",
                (ids[-1], f"agg-{n % 4}", json.dumps({"n": n})),
            )
        conn.commit()
    return ids


def _prepared(dsn: str, bootstrap: str, prefix: str) -> tuple[Settings, str]:
    """CDC settings (a missing topic reported after 1 s, not 30), the outbox, the dead-letter
    topic; returns them and the events' topic."""
    kafka = {
        "bootstrap_servers": bootstrap,
        "config": {"topic.metadata.propagation.max.ms": "1000"},
    }
    settings = relay_settings(dsn, bootstrap, prefix, mode="cdc", kafka=kafka)
    init_outbox(settings)
    create_topic(bootstrap, f"{prefix}.dlq")
    return settings, f"{prefix}.event.order"


def _stuck_then_fixed(dsn: str, bootstrap: str, prefix: str, alert: str, fault, fix) -> None:
    settings, topic = _prepared(dsn, bootstrap, prefix)
    fault(topic)
    with relay_thread(settings) as relay:
        wait_until(lambda: slot_position(dsn, settings.slot_name)[1], timeout=60)
        start, _ = slot_position(dsn, settings.slot_name)
        ids = _write(dsn)
        committed = current_wal_lsn(dsn)
        wait_until(
            lambda: relay.stats.retries_by_alert.get(alert, 0) >= 2,
            timeout=90,
            message=lambda: f"{relay.stats}",
        )
        text = _metrics(relay.stats)
        assert f'cdc_outbox_delivery_alert{{alert="{alert}"}} 1.0' in text, text
        assert relay.stats.events_dead_lettered == 0
        assert relay.stats.events_published == 0
        confirmed, _ = slot_position(dsn, settings.slot_name)
        assert confirmed < committed, (start, confirmed, committed)
        fix(topic)
        wait_until(
            lambda: relay.stats.events_published >= EVENTS,
            timeout=90,
            message=lambda: f"{relay.stats}",
        )
        wait_until(lambda: slot_position(dsn, settings.slot_name)[0] >= committed, timeout=30)
        assert relay.stats.events_dead_lettered == 0
    records = read_topics(bootstrap, topic)
    assert {dict(r.headers)["id"].decode() for r in records} == set(ids)
    assert count_records(bootstrap, f"{prefix}.dlq") == 0


def test_missing_topic_ends_run_naming_it_and_loses_nothing(
    pg_dsn: str, kafka_strict_broker, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_strict_broker.bootstrap_servers
    settings, topic = _prepared(pg_dsn, bootstrap, kafka_topic_prefix)
    ids = _write(pg_dsn)
    first = RelayProcess(settings, "topic-missing-1")
    first.start()
    try:
        code = first.wait(120)  # bounded: a relay retrying forever fails here
    finally:
        first.stop_quietly()
    log = first.log_tail(20_000)
    errors = [line for line in log.splitlines() if line.startswith("cdc-outbox: error: ")]
    assert code == 7, log
    assert errors == [
        f"cdc-outbox: error: topic: Kafka topic '{topic}' does not exist and the broker does"
        " not create it (Broker: Unknown topic or partition) (fix: create it, e.g."
        f" kafka-topics.sh --create --topic {topic}, or set auto.create.topics.enable=true"
        " on the brokers; then start run again)"
    ], log
    assert outbox_statuses(pg_dsn) == {"PENDING": EVENTS}  # none counted as published
    assert count_records(bootstrap, f"{kafka_topic_prefix}.dlq") == 0
    create_topic(bootstrap, topic)
    second = RelayProcess(settings, "topic-missing-2")
    second.start()
    try:
        wait_until(lambda: outbox_statuses(pg_dsn) == {"PUBLISHED": EVENTS}, timeout=90,
                   message=lambda: second.log_tail())  # fmt: skip
        second.terminate()
        assert second.wait(60) == 0, second.log_tail()
    finally:
        second.stop_quietly()
    records = read_topics(bootstrap, topic)
    assert {dict(r.headers)["id"].decode() for r in records} == set(ids)
    assert count_records(bootstrap, f"{kafka_topic_prefix}.dlq") == 0


def test_denied_writes_are_retried_and_alerted_never_dead_lettered(
    pg_dsn: str, kafka_strict_broker, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_strict_broker.bootstrap_servers

    def deny(topic: str) -> None:
        create_topic(bootstrap, topic)
        deny_topic_writes(bootstrap, topic)

    _stuck_then_fixed(
        pg_dsn,
        bootstrap,
        kafka_topic_prefix,
        "not_authorized",
        fault=deny,
        fix=lambda topic: allow_topic_writes(bootstrap, topic),
    )
