"""The batch INSERT into processed_events (issue 25): a plain multi-row INSERT while no id
repeats, the ON CONFLICT form (same outcome as before) once one does."""

from __future__ import annotations

import uuid

import psycopg

from cdc_outbox.store.processed_events import ConsumerStore


def test_mark_batch_plain_insert_then_on_conflict_after_a_duplicate(pg_dsn: str) -> None:
    store = ConsumerStore(f"store-{uuid.uuid4().hex[:8]}")
    a, b, c, d = (uuid.uuid4() for _ in range(4))
    with psycopg.connect(pg_dsn) as conn:
        store.create_tables(conn)
        conn.commit()
        assert store.mark_batch(conn, [a, b]) is None  # all new: nothing read back
        conn.commit()
        # b was recorded, c repeats within the batch: the plain INSERT fails, the
        # transaction is redone with ON CONFLICT and only the new ids come back
        assert store.mark_batch(conn, [b, c, c, d]) == {c, d}
        conn.commit()
        e = uuid.uuid4()
        assert store.mark_batch(conn, [e]) == {e}  # still ON CONFLICT: it had a duplicate
        conn.commit()
        f = uuid.uuid4()
        assert store.mark_batch(conn, [f]) is None  # the last batch had none: plain again
        conn.rollback()  # a rolled-back batch leaves no row
        rows = conn.execute(
            "SELECT event_id FROM processed_events WHERE consumer_name = %s",
            (store.consumer_name,),
        ).fetchall()
    assert {r[0] for r in rows} == {a, b, c, d, e}
