"""Polling relay against real PostgreSQL and Kafka: delivery, backoff, dead letters, redrive,
a worker killed with SIGKILL, three workers keeping per-aggregate order, commit inversion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from cdc_outbox.admin import outbox_ops as outbox_admin
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import RelayHalted
from cdc_outbox.polling.relay import PollingRelay
from cdc_outbox.service.wiring import polling_relay
from cdc_outbox.store.schema import outbox_table_ddl
from cdc_outbox_dev import workload
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import consume_all, create_topic, wait_until
from tests.support.relay import relay_settings
from tests.support.relay_process import ARTIFACTS


def _settings(dsn: str, bootstrap: str, prefix: str, **polling: Any) -> Settings:
    kafka = polling.pop("kafka_config", {})
    values = {"poll_interval_s": 0.05, "backoff_base_s": 0.2, "backoff_max_s": 1.0, **polling}
    return relay_settings(
        dsn,
        bootstrap,
        prefix,
        polling=values,
        kafka={"bootstrap_servers": bootstrap, "config": kafka},
    )


def _create_table(settings: Settings) -> None:
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        for stmt in outbox_table_ddl(settings):
            conn.execute(stmt)


def _insert(conn: psycopg.Connection[Any], agg: str, payload: dict[str, Any], **extra: Any) -> str:
    row = conn.execute(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)"
        " VALUES ('order', %s, %s, %s, %s) RETURNING id::text",
        (
            agg,
            extra.get("event_type", "OrderPlaced"),
            json.dumps(payload),
            json.dumps(extra.get("headers", {})),
        ),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _rows(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(
            "SELECT id::text, status, attempts, available_at, locked_at, locked_by, last_error,"
            " published_at FROM outbox"
        )
        names = [d.name for d in cur.description or []]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def _statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM outbox GROUP BY 1").fetchall())


@contextmanager
def _workers(*settings: Settings) -> Iterator[list[PollingRelay]]:
    """One polling worker per settings, each on its own thread, connection and producer."""
    relays = [polling_relay(s, worker_id=f"w{i}") for i, s in enumerate(settings)]
    errors: list[BaseException] = []

    def target(relay: PollingRelay) -> None:
        try:
            relay.run()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in relays]
    for t in threads:
        t.start()
    try:
        yield relays
    finally:
        for r in relays:
            r.request_stop()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a worker did not stop"
    assert not errors, errors


def test_publishes_exact_records_and_marks_rows_published(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    _create_table(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        a = _insert(conn, "o-1", {"n": 1, "x": [1, 2]}, headers={"trace": "t1", "n": 5})
        b = _insert(conn, "o-1", {"n": 2})
    relay = polling_relay(settings)
    try:
        assert relay.run_once() == 2
        assert relay.run_once() == 0
    finally:
        relay.close()
    rows = _rows(pg_dsn)
    assert {r["status"] for r in rows.values()} == {"PUBLISHED"}
    assert all(r["locked_by"] is None and r["published_at"] for r in rows.values())
    records = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.event.order"], expected_count=2
    )
    assert [dict(r.headers)["id"].decode() for r in records] == [a, b]  # one partition, in order
    first = records[0]
    assert first.key == b"o-1" and first.value == b'{"n": 1, "x": [1, 2]}'
    assert first.headers == [
        ("id", a.encode()),
        ("event_type", b"OrderPlaced"),
        ("aggregate_type", b"order"),
        ("n", b"5"),  # jsonb's key order, as the CDC relay sends it too
        ("trace", b"t1"),
    ]
    assert relay.stats.events_published == 2 and relay.stats.mode == "polling"


def test_permanent_failure_dead_letters_parks_the_aggregate_then_redrive_publishes(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    # The producer refuses records over 1,000 bytes: a permanent per-record failure.
    settings = _settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        kafka_config={"message.max.bytes": "1000"},
    )
    _create_table(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        big = _insert(conn, "o-1", {"pad": "x" * 3000})
        small = _insert(conn, "o-1", {"n": 2})  # same aggregate, later: parked behind big
        other = _insert(conn, "o-2", {"n": 1})
    relay = polling_relay(settings)
    try:
        assert relay.run_once() == 3
        rows = _rows(pg_dsn)
        assert rows[other]["status"] == "PUBLISHED"
        assert (rows[big]["status"], rows[big]["attempts"]) == ("FAILED", 0)
        assert "MSG_SIZE_TOO_LARGE" in rows[big]["last_error"]
        assert (rows[small]["status"], rows[small]["last_error"]) == ("FAILED", f"blocked_by {big}")
        assert relay.stats.events_dead_lettered == 2
        assert relay.run_once() == 0  # nothing left to claim: dead letters are not retried
    finally:
        relay.close()
    dlq = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.dlq"], expected_count=2
    )
    assert [dict(r.headers)["id"].decode() for r in dlq] == [big, small]

    flt = outbox_admin.RedriveFilter(ids=(big,))
    assert outbox_admin.redrive(settings, flt, dry_run=True) == 2  # the whole aggregate
    assert outbox_admin.redrive(settings, flt) == 2
    rows = _rows(pg_dsn)
    assert (rows[big]["status"], rows[big]["attempts"]) == ("PENDING", 0)
    assert rows[small]["status"] == "PENDING"
    fixed = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    relay = polling_relay(fixed)
    try:
        wait_until(lambda: relay.run_once() > 0, timeout=30)
    finally:
        relay.close()
    assert _rows(pg_dsn)[big]["status"] == _rows(pg_dsn)[small]["status"] == "PUBLISHED"
    records = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.event.order"], expected_count=3
    )
    assert [dict(r.headers)["id"].decode() for r in records if r.key == b"o-1"] == [big, small]


def test_missing_topic_halts_without_using_an_attempt(
    pg_dsn: str, kafka_strict_broker: Any, kafka_topic_prefix: str
) -> None:
    """A missing topic (auto-creation off) cannot heal by retrying: the relay halts (``run``
    then ends, exit 7), never dead-letters it nor uses an attempt; once the topic exists the
    next relay publishes the row."""
    bootstrap = kafka_strict_broker.bootstrap_servers
    settings = _settings(
        pg_dsn,
        bootstrap,
        kafka_topic_prefix,
        kafka_config={"topic.metadata.propagation.max.ms": "500"},
    )
    _create_table(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        event = _insert(conn, "o-1", {"n": 1})
    topic = f"{kafka_topic_prefix}.event.order"
    relay = polling_relay(settings)
    try:
        errors: list[BaseException] = []
        thread = threading.Thread(target=lambda: _catch(relay.run, errors), daemon=True)
        thread.start()
        thread.join(90)  # it ends on its own (bounded: a relay retrying forever fails here)
        relay.request_stop()
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], RelayHalted), errors
        assert f"Kafka topic '{topic}' does not exist" in str(errors[0])
        assert relay.stats.fatal is not None
        assert relay.stats.retries_by_alert["topic_missing"] >= 1
        assert relay.stats.events_dead_lettered == 0
    finally:
        relay.close()
    row = _rows(pg_dsn)[event]
    assert row["status"] != "FAILED" and row["attempts"] == 0, row
    create_topic(bootstrap, topic)
    again = polling_relay(settings)
    try:
        again.sweep(everything=True)  # the halted relay's lease, as a new leader takes it over
        wait_until(
            lambda: again.run_once() >= 0 and _rows(pg_dsn)[event]["status"] == "PUBLISHED",
            timeout=60,
        )
    finally:
        again.close()


def _catch(run: Any, errors: list[BaseException]) -> None:
    try:
        run()
    except BaseException as exc:
        errors.append(exc)


def _worker_process(settings: Settings, name: str) -> subprocess.Popen[bytes]:
    """``cdc-outbox run --mode polling`` as a real process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_OUTBOX_")}
    env.update(
        {
            "CDC_OUTBOX_DSN": settings.postgres_dsn(),
            "CDC_OUTBOX_TOPIC_TEMPLATE": settings.topic_template,
            "CDC_OUTBOX_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            # Records wait a minute in the producer: the worker holds its rows until killed.
            "CDC_OUTBOX_KAFKA__CONFIG": json.dumps({"linger.ms": "60000"}),
            "CDC_OUTBOX_POLLING__LEASE_S": str(settings.polling.lease_s),
            "CDC_OUTBOX_POLLING__POLL_INTERVAL_S": "0.05",
            "CDC_OUTBOX_METRICS_PORT": "0",
        }
    )
    ARTIFACTS.mkdir(exist_ok=True)
    with (ARTIFACTS / f"polling-{name}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cdc_outbox", "run", "--mode", "polling"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def test_worker_killed_while_holding_rows_loses_nothing(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, lease_s=1.5)
    _create_table(settings)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ids = [_insert(conn, f"o-{i % 7}", {"i": i}) for i in range(60)]
    victim = _worker_process(settings, "victim")
    try:
        wait_until(
            lambda: _statuses(pg_dsn).get("PROCESSING", 0) == 60,
            timeout=60,
            message=lambda: f"{_statuses(pg_dsn)}",
        )
        holders = {r["locked_by"] for r in _rows(pg_dsn).values()}
        assert len(holders) == 1 and None not in holders, holders
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    assert _statuses(pg_dsn) == {"PROCESSING": 60}  # held by a dead worker
    with _workers(settings):
        wait_until(
            lambda: _statuses(pg_dsn) == {"PUBLISHED": 60},
            timeout=60,
            message=lambda: f"{_statuses(pg_dsn)}",
        )
    rows = _rows(pg_dsn)
    assert all(r["attempts"] == 1 and "expired" in r["last_error"] for r in rows.values())
    records = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.event.order"], expected_count=60
    )
    assert sorted(dict(r.headers)["id"].decode() for r in records) == sorted(ids)


def test_three_workers_keep_per_aggregate_order(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    # Producers that send after different delays: a worker overtakes another one that holds
    # earlier events of the same aggregate whenever the claim lets two of them hold it at once.
    workers = [
        _settings(
            pg_dsn,
            kafka_broker.bootstrap_servers,
            kafka_topic_prefix,
            batch_size=40,
            kafka_config={"linger.ms": linger},
        )
        for linger in ("150", "0", "20")
    ]
    settings = workers[0]
    _create_table(settings)
    # 20 aggregates per writer, transactions of at most 20 events: an aggregate appears at most
    # once per transaction, so its seq order is its created_at order.
    spec = workload.WorkloadSpec(events=4_000, writers=3, aggregates=60, txn_sizes=(1, 5, 20))
    with _workers(*workers) as relays:
        report = workload.write_orders(pg_dsn, spec, columns=settings.column_names())
        wait_until(
            lambda: _statuses(pg_dsn) == {"PUBLISHED": report.committed},
            timeout=120,
            message=lambda: f"{_statuses(pg_dsn)}",
        )
    shares = [r.stats.events_published for r in relays]
    assert sum(shares) >= report.committed and all(shares), shares
    expected = workload.stored_events(pg_dsn, columns=settings.column_names())
    verdict = workload.tally(
        expected, read_topics(kafka_broker.bootstrap_servers, kafka_topic_prefix)
    )
    assert verdict.ok, verdict.summary() + f" {verdict.order_violations[:5]}"
    assert verdict.expected == report.committed == 4_000


def test_commit_inversion_loses_nothing_with_three_workers(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    _create_table(settings)
    with (
        _workers(settings, settings, settings),
        psycopg.connect(pg_dsn) as late,
        psycopg.connect(pg_dsn) as early,
    ):
        # Transaction A starts first (earlier created_at) but commits last.
        a1 = _insert(late, "o-1", {"tx": "A"})
        a2 = _insert(late, "o-3", {"tx": "A"})
        b1 = _insert(early, "o-1", {"tx": "B"})
        b2 = _insert(early, "o-2", {"tx": "B"})
        early.commit()
        wait_until(lambda: _statuses(pg_dsn) == {"PUBLISHED": 2}, timeout=30)
        late.commit()
        wait_until(lambda: _statuses(pg_dsn) == {"PUBLISHED": 4}, timeout=30)
    with psycopg.connect(pg_dsn) as conn:
        created = dict(conn.execute("SELECT id::text, created_at FROM outbox").fetchall())
    assert created[a1] < created[b1]  # the inversion really happened
    records = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.event.order"], expected_count=4
    )
    by_agg = [(r.key, dict(r.headers)["id"].decode()) for r in records if r.key == b"o-1"]
    # Visibility order: B's event was published before A's became visible.
    assert [i for _, i in by_agg] == [b1, a1]
    assert {dict(r.headers)["id"].decode() for r in records} == {a1, a2, b1, b2}


def test_inverted_commit_waits_while_its_aggregate_is_in_flight(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    # Worker A holds what it claims (its producer waits a minute before sending).
    slow = _settings(pg_dsn, bootstrap, kafka_topic_prefix, kafka_config={"linger.ms": "60000"})
    slow = slow.model_copy(update={"shutdown_grace_s": 0.5})
    settings = _settings(pg_dsn, bootstrap, kafka_topic_prefix)
    _create_table(settings)
    with psycopg.connect(pg_dsn) as late, psycopg.connect(pg_dsn) as early:
        a1 = _insert(late, "o-1", {"tx": "A"})  # earlier created_at, commits last
        b1 = _insert(early, "o-1", {"tx": "B"})
        early.commit()
        worker_b = polling_relay(settings, worker_id="b")
        try:
            with _workers(slow):
                wait_until(lambda: _rows(pg_dsn)[b1]["status"] == "PROCESSING", timeout=30)
                late.commit()
                # a1 is earlier than b1, but b1 of the same aggregate is in flight: a1 waits.
                assert worker_b.run_once() == 0
                assert _rows(pg_dsn)[a1]["status"] == "PENDING"
            # Worker A stopped without an acknowledgement and gave b1 back; both go out now.
            assert _rows(pg_dsn)[b1]["status"] == "PENDING"
            wait_until(lambda: worker_b.run_once() > 0, timeout=30)
        finally:
            worker_b.close()
    assert _statuses(pg_dsn) == {"PUBLISHED": 2}
    records = consume_all(bootstrap, [f"{kafka_topic_prefix}.event.order"], until_idle_s=1.0)
    ids = [dict(r.headers)["id"].decode() for r in records]
    # Worker B's batch, in created_at order, comes last (A may have flushed b1 when stopping).
    assert ids[-2:] == [a1, b1] and set(ids) == {a1, b1}


def test_survives_database_restart_and_broker_outage(
    pg_server: Any, pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    settings = _settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    _create_table(settings)

    def insert(n: int, tag: str) -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for i in range(n):
                _insert(conn, f"o-{i % 3}", {"tag": tag, "i": i})

    with _workers(settings) as (relay,):
        insert(20, "before")
        wait_until(lambda: _statuses(pg_dsn) == {"PUBLISHED": 20}, timeout=30)
        pg_server.restart()
        insert(20, "after-db-restart")
        wait_until(lambda: _statuses(pg_dsn) == {"PUBLISHED": 40}, timeout=60)
        assert relay.stats.restarts >= 1  # it saw the outage and reconnected
        kafka_broker.stop()
        try:
            insert(20, "broker-down")
            # Claimed and produced, but not acknowledged: held PROCESSING, never PUBLISHED.
            wait_until(lambda: _statuses(pg_dsn).get("PROCESSING", 0) > 0, timeout=30)
            assert _statuses(pg_dsn).get("PUBLISHED") == 40
        finally:
            kafka_broker.start()
        wait_until(
            lambda: _statuses(pg_dsn) == {"PUBLISHED": 60},
            timeout=120,
            message=lambda: f"{_statuses(pg_dsn)}",
        )
    records = consume_all(
        kafka_broker.bootstrap_servers, [f"{kafka_topic_prefix}.event.order"], expected_count=60
    )
    assert len({dict(r.headers)["id"] for r in records}) == 60
