"""Issue 37 item 1: an aggregate is parked only from its FAILED event on, never before it.

A FAILED row can sit behind rows of its aggregate that are still unpublished in the table:
events published before the dead letter whose PUBLISHED mark never came (a relay killed, the
slot lost), or re-streamed ones. A catch-up (real PostgreSQL + Kafka) must publish those as
the first time and park only the rows after the FAILED one; ``FailedRows.precedes`` (the
stream's comparison) must order an aggregate's rows as the table does.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from cdc_outbox.store.failed_rows import failed_rows_of
from cdc_outbox_dev.readback import read_topics
from tests.support.helpers import wait_until
from tests.support.relay import init_for_catch_up, init_outbox, relay_settings, service_thread

COMMITTED = {"isolation.level": "read_committed"}


def _insert(conn: psycopg.Connection[Any], agg: str) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
        " VALUES (%s, 'order', %s, 'OrderPlaced', '{}')",
        (event_id, agg),
    )
    return event_id


def _ids(records: list[Any]) -> list[str]:
    return [dict(r.headers)["id"].decode() for r in records]


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_catch_up_parks_an_aggregate_only_after_its_failed_row(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, delivery: str
) -> None:
    """agg-a: e0 (published by a stream, its mark lost: PENDING), e1 (dead-lettered: FAILED),
    e2 (parked: FAILED), e3 (written later: PENDING). The catch-up publishes e0 again and
    dead-letters only e3, ``blocked_by`` e1; e0 never becomes FAILED."""
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        delivery=delivery,
        eos={"checkpoint_topic": f"{kafka_topic_prefix}.checkpoints"},
    )
    init_for_catch_up(settings)
    with psycopg.connect(pg_dsn) as conn:
        e0, e1, e2 = (_insert(conn, "agg-a") for _ in range(3))
        other = _insert(conn, "agg-b")
        conn.commit()
        e3 = _insert(conn, "agg-a")
        conn.commit()
        conn.execute(
            "UPDATE outbox SET status = 'FAILED', last_error = CASE WHEN id = %s"
            " THEN 'record too large' ELSE 'blocked_by ' || %s END WHERE id = ANY(%s::uuid[])",
            (e1, e1, [e1, e2]),
        )
        conn.commit()
    with service_thread(settings) as service:
        wait_until(lambda: service.stats.phase == "STREAMING", timeout=90)
        assert service.stats.catch_ups == 1
    bootstrap = kafka_broker.bootstrap_servers
    main = _ids(read_topics(bootstrap, f"{kafka_topic_prefix}.event.", extra_config=COMMITTED))
    dlq = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", extra_config=COMMITTED)
    assert sorted(main) == sorted([e0, other])
    assert _ids(dlq) == [e3]
    assert dict(dlq[0].headers)["cdc_outbox.error"] == f"blocked_by {e1}".encode()
    with psycopg.connect(pg_dsn) as conn:
        status = dict(conn.execute("SELECT id::text, status FROM outbox").fetchall())
    assert status[e0] != "FAILED"
    assert [status[e] for e in (e1, e2, e3)] == ["FAILED"] * 3


def test_failed_rows_precedes_follows_the_aggregates_order_in_the_table(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str
) -> None:
    """The comparison a re-stream makes for an event of an aggregate parked in the table: by
    ``created_at`` (one statement each, so no two are equal); a row that is gone (published
    and deleted) comes before; a blocker that is gone (redriven) is never preceded."""
    settings = relay_settings(pg_dsn, kafka_broker.bootstrap_servers, kafka_topic_prefix)
    init_outbox(settings)
    with psycopg.connect(pg_dsn) as conn:
        e0, e1, e2 = (_insert(conn, "agg-a") for _ in range(3))
        conn.commit()
    rows = failed_rows_of(settings)
    try:
        assert rows.precedes(e0, e1)
        assert not rows.precedes(e2, e1)
        assert not rows.precedes(e1, e1)
        gone = str(uuid.uuid4())
        assert rows.precedes(gone, e1)
        assert not rows.precedes(e0, gone)
    finally:
        rows.close()
