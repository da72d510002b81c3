"""The consumer's tables in PostgreSQL: ``processed_events`` and ``consumer_parked_keys``.

* ``processed_events (consumer_name, event_id)``: one row per event a consumer has finished
  with (applied, or dead-lettered). Inserted in the same transaction as the handler's own
  changes, so "applied" and "recorded as applied" commit together or not at all.
* ``consumer_parked_keys (consumer_name, topic, key)``: a key whose event was dead-lettered.
  Later events with that key on that topic are dead-lettered too (reason ``blocked_by <id>``)
  so that per-key order never breaks silently; the row survives restarts and rebalances.
  Deleting the row (after repairing and replaying the dead letters) unparks the key.

Every identifier goes through ``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "PARKED_KEYS_TABLE",
    "PROCESSED_EVENTS_TABLE",
    "ConsumerStore",
    "consumer_tables_ddl",
    "processed_events_ddl",
]

PROCESSED_EVENTS_TABLE = "processed_events"
PARKED_KEYS_TABLE = "consumer_parked_keys"


def processed_events_ddl(schema: str = "public") -> list[sql.Composed]:
    """Consumer-side de-duplication table: one row per (consumer, event id) handled."""
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (\n"
            "    consumer_name text NOT NULL,\n"
            "    event_id uuid NOT NULL,\n"
            "    processed_at timestamptz NOT NULL DEFAULT now(),\n"
            "    PRIMARY KEY (consumer_name, event_id)\n"
            ")"
        ).format(sql.Identifier(schema, PROCESSED_EVENTS_TABLE))
    ]


def consumer_tables_ddl(schema: str = "public") -> list[sql.Composed]:
    """``processed_events`` and ``consumer_parked_keys`` (``IF NOT EXISTS``)."""
    return [
        *processed_events_ddl(schema),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (\n"
            "    consumer_name text NOT NULL,\n"
            "    topic text NOT NULL,\n"
            "    key text NOT NULL,\n"
            "    event_id uuid,\n"
            "    reason text NOT NULL,\n"
            "    parked_at timestamptz NOT NULL DEFAULT now(),\n"
            "    PRIMARY KEY (consumer_name, topic, key)\n"
            ")"
        ).format(sql.Identifier(schema, PARKED_KEYS_TABLE)),
    ]


class ConsumerStore:
    """The consumer's statements, for one ``consumer_name`` and schema."""

    def __init__(self, consumer_name: str, schema: str = "public") -> None:
        self.consumer_name = consumer_name
        self.schema = schema
        processed = sql.Identifier(schema, PROCESSED_EVENTS_TABLE)
        parked = sql.Identifier(schema, PARKED_KEYS_TABLE)
        self._mark = sql.SQL(
            "INSERT INTO {} (consumer_name, event_id) VALUES (%s, %s) ON CONFLICT DO NOTHING"
        ).format(processed)
        self._insert_batch = sql.SQL(
            "INSERT INTO {} (consumer_name, event_id) SELECT %s, unnest(%b::uuid[])"
        ).format(processed)
        self._mark_batch = sql.SQL(
            "INSERT INTO {} (consumer_name, event_id) SELECT %s, unnest(%b::uuid[])"
            " ON CONFLICT DO NOTHING RETURNING event_id"
        ).format(processed)
        self._unmark = sql.SQL(
            "DELETE FROM {} WHERE consumer_name = %s AND event_id = ANY(%b::uuid[])"
        ).format(processed)
        self._park = sql.SQL(
            "INSERT INTO {} (consumer_name, topic, key, event_id, reason)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(parked)
        self._parked = sql.SQL(
            "SELECT topic, key, event_id FROM {} WHERE consumer_name = %s"
        ).format(parked)
        #: A plain batch INSERT met a duplicate: ON CONFLICT until a batch has none again.
        self._duplicates_seen = False

    def create_tables(self, conn: psycopg.Connection[Any]) -> None:
        for stmt in consumer_tables_ddl(self.schema):
            conn.execute(stmt)

    def mark_processed(self, conn: psycopg.Connection[Any], event_id: uuid.UUID) -> bool:
        """Record ``event_id`` as handled; False when it already was (a duplicate)."""
        cur = conn.execute(self._mark, (self.consumer_name, event_id))
        return cur.rowcount == 1

    def mark_batch(
        self, conn: psycopg.Connection[Any], event_ids: list[uuid.UUID]
    ) -> set[uuid.UUID] | None:
        """Record every id of ``event_ids`` as the FIRST statement of the transaction: None
        when they were all new and distinct (the common case: one plain multi-row INSERT,
        nothing read back), else the set of the ids that were new (the rest, and repeats
        within ``event_ids``, are duplicates). A plain INSERT that meets a duplicate raises;
        then the transaction (nothing else in it) is rolled back and the ids are inserted
        with ``ON CONFLICT DO NOTHING RETURNING event_id``, and so are the next batches' until
        one has no duplicate. The ids go as a binary array (``%b``: a sixth of the text array's
        dumping time for 500 ids, and nothing for the server to parse) and come back binary.
        Either form goes in one round trip with the transaction's ``BEGIN`` (pipelined)."""
        if not self._duplicates_seen:
            try:
                with conn.pipeline():  # BEGIN + INSERT, one Sync: the error, if any, at exit
                    conn.execute(self._insert_batch, (self.consumer_name, event_ids), binary=True)
                return None
            except psycopg.errors.UniqueViolation:
                conn.rollback()
                self._duplicates_seen = True
        distinct = list(dict.fromkeys(event_ids))
        with conn.pipeline():  # fetched after the pipeline's one Sync, not inside it
            cur = conn.execute(self._mark_batch, (self.consumer_name, distinct), binary=True)
        new = {row[0] for row in cur.fetchall()}
        self._duplicates_seen = len(new) < len(event_ids)
        return new

    def unmark(self, conn: psycopg.Connection[Any], event_ids: list[uuid.UUID]) -> None:
        """Forget ``event_ids`` again (marked by :meth:`mark_batch`, then not handled)."""
        conn.execute(self._unmark, (self.consumer_name, event_ids))

    def park(
        self,
        conn: psycopg.Connection[Any],
        topic: str,
        key: str,
        event_id: uuid.UUID | None,
        reason: str,
    ) -> None:
        conn.execute(self._park, (self.consumer_name, topic, key, event_id, reason))

    def parked(self, conn: psycopg.Connection[Any]) -> dict[tuple[str, str], str]:
        """(topic, key) -> the id (or "unknown") of the event that parked the key."""
        rows = conn.execute(self._parked, (self.consumer_name,)).fetchall()
        return {(t, k): str(e) if e is not None else "unknown" for t, k, e in rows}
