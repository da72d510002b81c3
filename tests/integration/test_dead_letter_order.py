"""One delivery policy in every mode: a poison event in the middle of an aggregate's stream.

In CDC streaming, snapshot catch-up and polling alike: the poison event and the later events
of its aggregate are dead-lettered (reason, then ``blocked_by <id>``) and their rows FAILED;
other aggregates flow; ``redrive`` (after fixing the row) publishes all of them in their
original order, ahead of the aggregate's later events; a fallback to polling afterwards
publishes nothing that was dead-lettered.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

from cdc_outbox.admin import outbox_ops as outbox_admin
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import RelayHalted
from cdc_outbox.service.relay_service import Service
from cdc_outbox.service.wiring import build_service
from cdc_outbox_dev.readback import ConsumedRecord, count_records, read_topics
from tests.support.helpers import wait_until
from tests.support.relay import (
    init_for_catch_up,
    init_outbox,
    outbox_statuses,
    oversized_record_overrides,
    relay_settings,
    relay_thread,
    service_thread,
)


def _insert(conn: psycopg.Connection[Any], agg: str, payload: str | None) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
        " VALUES (%s, 'order', %s, 'OrderPlaced', %s)",
        (event_id, agg, payload),
    )
    return event_id


class _Scenario:
    """agg-p: ok, POISON (null payload), then three more (one per transaction); agg-0..4 flow."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.poisoned: list[str] = []  # agg-p events in order, from the poison on
        self.before: list[str] = []
        self.others: list[str] = []

    def write(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            self.before.append(_insert(conn, "agg-p", '{"n": 0}'))
            self.others += [_insert(conn, f"agg-{i}", '{"n": 0}') for i in range(5)]
            conn.commit()
            self.poisoned.append(_insert(conn, "agg-p", None))
            conn.commit()
            for n in (2, 3, 4):
                self.poisoned.append(_insert(conn, "agg-p", json.dumps({"n": n})))
                self.others.append(_insert(conn, f"agg-{n}", json.dumps({"n": n})))
                conn.commit()

    def fix_poison(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            conn.execute(
                "UPDATE outbox SET payload = '{\"n\": 1}' WHERE id = %s", (self.poisoned[0],)
            )

    @property
    def expected_dead(self) -> int:
        return len(self.poisoned)


def _ids(records: list[ConsumedRecord]) -> list[str]:
    return [dict(r.headers)["id"].decode() for r in records]


def _check_parked(settings: Settings, scenario: _Scenario, bootstrap: str, prefix: str) -> None:
    """DLQ: the poison with its reason, the later ones blocked_by it; rows FAILED; others out."""
    dlq = read_topics(bootstrap, f"{prefix}.dlq")
    first = {}
    for r in dlq:
        first.setdefault(dict(r.headers)["id"].decode(), dict(r.headers))
    assert set(first) == set(scenario.poisoned), _ids(dlq)
    assert b"null" in first[scenario.poisoned[0]]["cdc_outbox.error"]
    for later in scenario.poisoned[1:]:
        assert first[later]["cdc_outbox.error"] == f"blocked_by {scenario.poisoned[0]}".encode()
    main = _ids(read_topics(bootstrap, f"{prefix}.event."))
    assert set(scenario.poisoned).isdisjoint(main)
    assert set(scenario.before + scenario.others) <= set(main)
    with psycopg.connect(settings.postgres_dsn()) as conn:
        rows = dict(
            conn.execute(
                "SELECT id::text, status || ':' || coalesce(last_error, '') FROM outbox"
                " WHERE aggregate_id = 'agg-p'"
            ).fetchall()
        )
    assert rows[scenario.before[0]].startswith("PUBLISHED") or rows[scenario.before[0]].startswith(
        "PENDING"
    )
    for event_id in scenario.poisoned:
        assert rows[event_id].startswith("FAILED:"), rows
    assert "null" in rows[scenario.poisoned[0]]
    assert rows[scenario.poisoned[1]] == f"FAILED:blocked_by {scenario.poisoned[0]}"


def _redrive_and_check(
    settings: Settings, scenario: _Scenario, bootstrap: str, prefix: str, published: Any
) -> None:
    """Fix the row, redrive, write one more: agg-p arrives complete and in order."""
    main_before = len(read_topics(bootstrap, f"{prefix}.event."))
    scenario.fix_poison()
    moved = outbox_admin.redrive(settings, outbox_admin.RedriveFilter(ids=(scenario.poisoned[0],)))
    assert moved == scenario.expected_dead  # the whole aggregate, not just the one row
    with psycopg.connect(settings.postgres_dsn()) as conn:
        after = _insert(conn, "agg-p", '{"n": 5}')
        conn.commit()
    wait_until(
        lambda: published() >= main_before + scenario.expected_dead + 1,
        timeout=60,
        message=lambda: f"published {published()}",
    )
    main = read_topics(bootstrap, f"{prefix}.event.")
    agg_p = [i for i in _ids(main) if i in {*scenario.before, *scenario.poisoned, after}]
    assert agg_p == [*scenario.before, *scenario.poisoned, after]
    wait_until(
        lambda: outbox_statuses(settings.postgres_dsn()).get("FAILED", 0) == 0,
        timeout=30,
        message=lambda: f"{outbox_statuses(settings.postgres_dsn())}",
    )


def test_cdc_parks_the_aggregate_and_redrive_publishes_it_in_order(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="cdc"
    )
    init_outbox(settings)
    scenario = _Scenario(pg_dsn)
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "STREAMING", timeout=60)
        scenario.write()
        wait_until(
            lambda: (
                service.stats.events_dead_lettered >= scenario.expected_dead
                and service.stats.events_published >= 1 + len(scenario.others)
            ),
            timeout=60,
            message=lambda: f"{service.stats}",
        )
        wait_until(lambda: outbox_statuses(pg_dsn).get("FAILED", 0) == 4, timeout=30)
        _check_parked(settings, scenario, kafka_broker.bootstrap_servers, kafka_topic_prefix)
        _redrive_and_check(
            settings,
            scenario,
            kafka_broker.bootstrap_servers,
            kafka_topic_prefix,
            lambda: service.stats.events_published,
        )


def test_catch_up_parks_the_aggregate_and_polling_later_republishes_nothing(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """The backlog (written before the first start) goes through the catch-up; then a
    polling relay runs on the same table and publishes nothing that was dead-lettered."""
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_for_catch_up(settings)
    scenario = _Scenario(pg_dsn)
    scenario.write()
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "STREAMING", timeout=60)
        assert service.stats.catch_ups == 1
        assert service.stats.events_dead_lettered == scenario.expected_dead
    wait_until(lambda: outbox_statuses(pg_dsn).get("PENDING", 0) == 0, timeout=30)
    _check_parked(settings, scenario, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    before = _ids(read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event."))
    polling = relay_settings(
        pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix, mode="polling"
    )
    with service_thread(polling) as service:
        wait_until(lambda: service.stats.phase == "POLLING", timeout=30)
        with psycopg.connect(pg_dsn) as conn:
            marker = _insert(conn, "agg-0", '{"marker": true}')
            conn.commit()
        wait_until(lambda: service.stats.events_published >= 1, timeout=30)
    after = _ids(read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event."))
    assert sorted(after) == sorted([*before, marker])  # the polling pass published only it
    assert outbox_statuses(pg_dsn)["FAILED"] == scenario.expected_dead


def test_polling_parks_the_aggregate_and_redrive_publishes_it_in_order(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        mode="polling",
        polling={"poll_interval_s": 0.05},
    )
    init_outbox(settings)
    scenario = _Scenario(pg_dsn)
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "POLLING", timeout=60)
        scenario.write()
        wait_until(
            lambda: (
                outbox_statuses(pg_dsn).get("FAILED", 0) == scenario.expected_dead
                and outbox_statuses(pg_dsn).get("PENDING", 0) == 0
            ),
            timeout=60,
            message=lambda: f"{outbox_statuses(pg_dsn)} {service.stats}",
        )
        _check_parked(settings, scenario, kafka_broker.bootstrap_servers, kafka_topic_prefix)
        _redrive_and_check(
            settings,
            scenario,
            kafka_broker.bootstrap_servers,
            kafka_topic_prefix,
            lambda: service.stats.events_published,
        )


def test_a_record_the_broker_rejects_parks_its_aggregate_or_counts_order_broken(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str
) -> None:
    """max_record_bytes above the broker's 1 MB limit lets a 2 MB record reach the broker.
    The event written in the same transaction right behind it was produced before the
    rejection came back: it is either parked or counted as order broken, never silent.
    An event written after the dead letter is parked for sure."""
    import base64
    import os

    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        mode="cdc",
        **oversized_record_overrides(kafka_broker.bootstrap_servers),
    )
    init_outbox(settings)
    blob = base64.b64encode(os.urandom(1_500_000)).decode()
    with relay_thread(settings) as relay, psycopg.connect(pg_dsn) as conn:
        big = _insert(conn, "agg-1", json.dumps({"blob": blob}))
        right_behind = _insert(conn, "agg-1", '{"n": 2}')
        conn.commit()
        wait_until(lambda: relay.stats.events_dead_lettered >= 1, timeout=90)
        later = _insert(conn, "agg-1", '{"n": 3}')
        conn.commit()
        wait_until(
            lambda: relay.stats.events_dead_lettered + relay.stats.events_published >= 3,
            timeout=60,
            message=lambda: f"{relay.stats}",
        )
        stats = relay.stats
    main = _ids(read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event."))
    dlq = read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.dlq")
    dlq_ids = _ids(dlq)
    assert big in dlq_ids and big not in main
    assert b"MSG_SIZE_TOO_LARGE" in dict(dlq[dlq_ids.index(big)].headers)["cdc_outbox.error"]
    assert later in dlq_ids and later not in main
    if right_behind in main:
        assert stats.order_broken == 1
    else:
        assert right_behind in dlq_ids and stats.order_broken == 0


@pytest.mark.parametrize("mode", ["cdc", "polling"])
def test_halt_policy_stops_before_any_later_event_in_every_mode(
    pg_dsn: str, kafka_broker, kafka_topic_prefix: str, mode: str
) -> None:
    """``on_permanent_error = "halt"``: the relay stops at the poison event; nothing of its
    aggregate after it is sent, its row is not dead-lettered, the slot does not pass it."""
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        mode=mode,
        on_permanent_error="halt",
        polling={"poll_interval_s": 0.05},
    )
    init_outbox(settings)
    with psycopg.connect(pg_dsn) as conn:
        first = _insert(conn, "agg-p", '{"n": 0}')
        conn.commit()
    service = build_service(settings)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run_into(service, errors), daemon=True)
    thread.start()
    try:
        wait_until(lambda: service.stats.events_published >= 1, timeout=60)
        with psycopg.connect(pg_dsn) as conn:
            poison = _insert(conn, "agg-p", None)
            after = _insert(conn, "agg-p", '{"n": 2}')
            conn.commit()
        thread.join(60)
        assert not thread.is_alive(), "the relay did not halt"
    finally:
        service.request_stop()
        thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], RelayHalted), errors
    assert poison in str(errors[0])
    main = _ids(read_topics(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.event."))
    assert main == [first]
    assert count_records(kafka_broker.bootstrap_servers, f"{kafka_topic_prefix}.dlq") == 0
    statuses = outbox_statuses(pg_dsn)
    assert statuses.get("FAILED", 0) == 0
    with psycopg.connect(pg_dsn) as conn:
        left = dict(
            conn.execute(
                "SELECT id::text, status FROM outbox WHERE id = ANY(%s::uuid[])", ([poison, after],)
            ).fetchall()
        )
    assert left == {poison: "PENDING", after: "PENDING"}
    if mode == "cdc":  # the poison's transaction is still in the slot: it was not confirmed
        with psycopg.connect(pg_dsn) as conn:
            pending = conn.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,"
                " 'proto_version', '1', 'publication_names', %s)",
                (settings.slot_name, settings.publication_name),
            ).fetchone()
        assert pending is not None and pending[0] >= 4  # Begin, 2 x Insert, Commit


def _run_into(service: Service, errors: list[BaseException]) -> None:
    try:
        service.run()
    except BaseException as exc:
        errors.append(exc)
