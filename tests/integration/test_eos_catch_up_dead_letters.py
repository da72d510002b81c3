"""Issue 37 item 5: exactly-once catch-up keeps its dead letters when a Kafka transaction
does not commit (real PostgreSQL + Kafka, a relay process killed at a named crash point).

A catch-up batch holds a poison row (NULL payload: dead-lettered) and the row parked behind
it. Killed just before the Kafka commit, the batch is aborted: the redo must produce both
dead letters again (their rows may not be FAILED yet, or the redo skips them and the dead
letters are lost). Killed just after it, the dead letters are committed: the redo must not
produce them again (the checkpoint names them, and they are marked FAILED before the redo).
read_committed sees each dead letter once and every other event once.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from cdc_outbox_dev.readback import read_topics
from tests.support.relay import init_for_catch_up, relay_settings, wait_streamed_past_now
from tests.support.relay_process import RelayProcess

COMMITTED = {"isolation.level": "read_committed"}


def _insert(conn: psycopg.Connection[Any], agg: str, payload: str | None) -> str:
    row = conn.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)"
        " VALUES (gen_random_uuid(), 'order', %s, 'E', %s::jsonb) RETURNING id::text",
        (agg, payload),
    ).fetchone()
    assert row is not None
    return str(row[0])


def _ids(records: list[Any]) -> list[str]:
    return [dict(r.headers)["id"].decode() for r in records]


@pytest.mark.parametrize("crash_at", ["eos.before_kafka_commit", "eos.after_kafka_commit"])
def test_catch_up_dead_letters_survive_a_kill_around_the_kafka_commit(
    pg_dsn: str, kafka_broker: Any, kafka_topic_prefix: str, crash_at: str
) -> None:
    settings = relay_settings(
        pg_dsn,
        kafka_broker.bootstrap_servers,
        kafka_topic_prefix,
        delivery="exactly_once",
        eos={"checkpoint_topic": f"{kafka_topic_prefix}.checkpoints"},
    )
    init_for_catch_up(settings)
    with psycopg.connect(pg_dsn) as conn:
        ok = _insert(conn, "agg-a", "{}")
        poison = _insert(conn, "agg-a", None)
        parked = _insert(conn, "agg-a", "{}")
        other = _insert(conn, "agg-b", "{}")
        conn.commit()
    crashing = RelayProcess(settings, "eos-catch-up-dlq-crash", CDC_OUTBOX_CRASH_AT=crash_at)
    crashing.start()
    assert crashing.wait(90) == -signal.SIGKILL, crashing.log_tail()
    assert f"crash point {crash_at}" in crashing.log_tail(50_000)
    relay = RelayProcess(settings, "eos-catch-up-dlq-redo")
    relay.start()
    try:
        wait_streamed_past_now(pg_dsn, settings.slot_name, 90, message=relay.log_tail)
    finally:
        relay.stop_quietly()
    bootstrap = kafka_broker.bootstrap_servers
    dlq = read_topics(bootstrap, f"{kafka_topic_prefix}.dlq", extra_config=COMMITTED)
    main = read_topics(bootstrap, f"{kafka_topic_prefix}.event.", extra_config=COMMITTED)
    assert sorted(_ids(dlq)) == sorted([poison, parked]), relay.log_tail()
    assert sorted(_ids(main)) == sorted([ok, other])
    with psycopg.connect(pg_dsn) as conn:
        rows = dict(
            conn.execute("SELECT id::text, status || ':' || coalesce(last_error, '') FROM outbox")
        )
    assert rows[poison].startswith("FAILED:") and "null" in rows[poison], rows
    assert rows[parked] == f"FAILED:blocked_by {poison}"
    assert rows[ok].startswith("PUBLISHED") and rows[other].startswith("PUBLISHED")
