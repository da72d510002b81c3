"""DDL for the outbox tables, the consumer-side ``processed_events`` table, the publication
and roles.

Per-table statements take the :class:`OutboxSettings` of one outbox (None: the first
configured); the publication and the role cover every configured outbox table. The relay's own
state table lives in the first outbox's schema.

Every configured name goes through ``psycopg.sql.Identifier``; nothing is string-formatted.
Functions return lists of ``sql.Composed`` statements; render with ``.as_string(conn)``.
``sql/*.sql`` holds the same DDL (default preset) as hand-readable scripts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from psycopg import sql

from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.store.processed_events import PROCESSED_EVENTS_TABLE as PROCESSED_EVENTS_TABLE
from cdc_outbox.store.processed_events import consumer_tables_ddl

logger = logging.getLogger(__name__)

#: Columns the polling relay updates (default preset; never renamed; granted column-wise).
POLLING_COLUMNS = (
    "status",
    "attempts",
    "available_at",
    "locked_at",
    "locked_by",
    "published_at",
    "last_error",
)
STATUSES = ("PENDING", "PROCESSING", "PUBLISHED", "FAILED")
#: The relay's own durable state (phase per slot, leader lease), next to the outbox.
RELAY_STATE_TABLE = "cdc_outbox_relay_state"
PHASES = ("POLLING", "CATCHING_UP", "STREAMING")


def outbox_ident(settings: Settings, outbox: OutboxSettings | None = None) -> sql.Identifier:
    """``schema.table`` of ``outbox`` (None: the first configured)."""
    o = outbox or settings.outbox()
    return sql.Identifier(o.schema_name, o.table)


def create_schema_ddl(schema: str) -> sql.Composed:
    """``CREATE SCHEMA IF NOT EXISTS`` (``init --create-table`` for an outbox in a new schema)."""
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))


def _index_name(table: str, suffix: str) -> str:
    return f"{table[: 63 - len(suffix)]}{suffix}"


def outbox_table_ddl(
    settings: Settings, outbox: OutboxSettings | None = None
) -> list[sql.Composed]:
    """CREATE TABLE (+ pending index for the default preset), ``IF NOT EXISTS``, of ``outbox``
    (None: the first configured).

    default preset: the event columns, ``headers`` (unless disabled), ``created_at`` and the
    polling columns. debezium preset: Debezium's outbox shape (no polling columns).
    """
    o = outbox or settings.outbox()
    cols = settings.column_names(o)
    lines: list[sql.Composable] = [
        sql.SQL("{} uuid PRIMARY KEY DEFAULT gen_random_uuid()").format(sql.Identifier(cols.id)),
        sql.SQL("{} text NOT NULL").format(sql.Identifier(cols.aggregate_type)),
        sql.SQL("{} text NOT NULL").format(sql.Identifier(cols.aggregate_id)),
        sql.SQL("{} text NOT NULL").format(sql.Identifier(cols.event_type)),
        sql.SQL("{} jsonb").format(sql.Identifier(cols.payload)),
    ]
    if cols.headers is not None:
        lines.append(
            sql.SQL("{} jsonb NOT NULL DEFAULT '{{}}'").format(sql.Identifier(cols.headers))
        )
    if cols.tracing_span_context is not None:
        lines.append(sql.SQL("{} text").format(sql.Identifier(cols.tracing_span_context)))
    lines += [sql.SQL("{} text").format(sql.Identifier(c)) for c in cols.header_sources()]
    polling = o.columns.has_status
    if polling:
        statuses = sql.SQL(", ").join(sql.Literal(s) for s in STATUSES)
        lines += [
            # clock_timestamp(), not now(): rows of one transaction get increasing times,
            # so created_at orders an aggregate's events within a transaction too.
            sql.SQL("created_at timestamptz NOT NULL DEFAULT clock_timestamp()"),
            sql.SQL("status text NOT NULL DEFAULT 'PENDING' CHECK (status IN ({}))").format(
                statuses
            ),
            sql.SQL("attempts integer NOT NULL DEFAULT 0"),
            sql.SQL("available_at timestamptz NOT NULL DEFAULT now()"),
            sql.SQL("locked_at timestamptz"),
            sql.SQL("locked_by text"),
            sql.SQL("published_at timestamptz"),
            sql.SQL("last_error text"),
        ]
    table = outbox_ident(settings, o)
    stmts = [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (\n    {}\n)").format(
            table, sql.SQL(",\n    ").join(lines)
        )
    ]
    if polling:
        stmts.append(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} (available_at) WHERE status = 'PENDING'"
            ).format(sql.Identifier(_index_name(o.table, "_pending_idx")), table)
        )
        stmts.append(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} ({}, created_at)"
                " WHERE status IN ('PENDING', 'PROCESSING')"
            ).format(
                sql.Identifier(_index_name(o.table, "_unpublished_idx")),
                table,
                sql.Identifier(cols.aggregate_id),
            )
        )
        stmts.append(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} ({}, created_at) WHERE status = 'FAILED'"
            ).format(
                sql.Identifier(_index_name(o.table, "_failed_idx")),
                table,
                sql.Identifier(cols.aggregate_id),
            )
        )
    return stmts


def relay_state_ident(settings: Settings) -> sql.Identifier:
    """``schema.cdc_outbox_relay_state`` in the first outbox's schema: one row per slot
    (:mod:`cdc_outbox.store.relay_state`)."""
    return sql.Identifier(settings.outbox().schema_name, RELAY_STATE_TABLE)


def relay_state_ddl(settings: Settings) -> list[sql.Composed]:
    """The relay state table: persisted phase, consistent point, leader lease, confirmed
    position and streamed outbox tables per slot."""
    phases = sql.SQL(", ").join(sql.Literal(p) for p in PHASES)
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (\n"
            "    slot_name text PRIMARY KEY,\n"
            "    phase text NOT NULL DEFAULT 'CATCHING_UP' CHECK (phase IN ({})),\n"
            "    consistent_point pg_lsn,\n"
            "    leader_id text,\n"
            "    leader_pid integer,\n"
            "    lease_until timestamptz,\n"
            "    confirmed_lsn pg_lsn,\n"
            "    streamed_tables jsonb,\n"
            "    updated_at timestamptz NOT NULL DEFAULT now()\n"
            ")"
        ).format(relay_state_ident(settings), phases)
    ]


def relay_state_confirmed_ddl(settings: Settings) -> sql.Composed:
    """Adds ``confirmed_lsn`` to a relay state table made by an older ``init``."""
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS confirmed_lsn pg_lsn").format(
        relay_state_ident(settings)
    )


def processed_events_ddl(schema: str = "public") -> list[sql.Composed]:
    """Consumer-side tables: ``processed_events`` (de-duplication) and ``consumer_parked_keys``
    (keys held after a dead letter), from :mod:`cdc_outbox.store.processed_events`."""
    return consumer_tables_ddl(schema)


def _tables(settings: Settings, outboxes: Sequence[OutboxSettings] | None) -> sql.Composed:
    chosen = settings.outbox_settings() if outboxes is None else outboxes
    return sql.SQL(", ").join(outbox_ident(settings, o) for o in chosen)


def publication_ddl(settings: Settings) -> sql.Composed:
    """One publication of the inserts of every configured outbox table, only.

    ``publish_via_partition_root``: when an outbox is partitioned, inserts into its partitions
    are streamed as inserts into the outbox table itself (the relation the relay maps); for a
    plain table it changes nothing.
    """
    return sql.SQL(
        "CREATE PUBLICATION {} FOR TABLE {}"
        " WITH (publish = 'insert', publish_via_partition_root = true)"
    ).format(sql.Identifier(settings.publication_name), _tables(settings, None))


def add_to_publication_ddl(settings: Settings, outboxes: Sequence[OutboxSettings]) -> sql.Composed:
    """Adds ``outboxes`` (configured tables the publication lacks) to the publication."""
    return sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
        sql.Identifier(settings.publication_name), _tables(settings, outboxes)
    )


def drop_publication_ddl(settings: Settings) -> sql.Composed:
    return sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
        sql.Identifier(settings.publication_name)
    )


#: The first PostgreSQL major with failover slots (``pg_replication_slots.failover``).
FAILOVER_SLOTS_VERSION = 170000


def slot_failover(wanted: bool, server_version: int) -> bool:
    """Whether a new slot is created with ``failover = true``: ``wanted`` (the
    ``slot_failover`` setting) and the server is 17+ (on older servers the setting is
    ignored, with an INFO line)."""
    if not wanted:
        return False
    if server_version < FAILOVER_SLOTS_VERSION:
        logger.info(
            "slot_failover ignored: PostgreSQL %d has no failover slots (17+)",
            server_version // 10000,
        )
        return False
    return True


def create_slot_sql(settings: Settings, failover: bool = False) -> sql.Composed:
    """Create the pgoutput logical slot (plain SQL function); returns its consistent point.
    ``failover`` (PostgreSQL 17+ only): the slot is synchronized to standbys."""
    if failover:
        return sql.SQL(
            "SELECT lsn::text FROM pg_create_logical_replication_slot"
            "({}, 'pgoutput', false, false, true)"
        ).format(sql.Literal(settings.slot_name))
    return sql.SQL(
        "SELECT lsn::text FROM pg_create_logical_replication_slot({}, 'pgoutput')"
    ).format(sql.Literal(settings.slot_name))


def drop_slot_sql(settings: Settings) -> sql.Composed:
    return sql.SQL("SELECT pg_drop_replication_slot({})").format(sql.Literal(settings.slot_name))


def role_ddl(settings: Settings, role: str = "cdc_outbox") -> list[sql.Composed]:
    """Least-privilege relay role (the CREATE ROLE has no password; set one separately).

    REPLICATION for the slot; per outbox table SELECT for polling and status, UPDATE on the
    polling columns only and DELETE (cleanup of published rows). Creating the publication
    needs table ownership, so ``init`` is run by the table owner and ``run`` by this role.
    """
    r = sql.Identifier(role)
    stmts = [sql.SQL("CREATE ROLE {} WITH LOGIN REPLICATION").format(r)]
    schemas = [settings.outbox().schema_name]
    schemas += [o.schema_name for o in settings.outbox_settings() if o.schema_name not in schemas]
    stmts += [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(s), r) for s in schemas
    ]
    for o in settings.outbox_settings():
        table = outbox_ident(settings, o)
        stmts.append(sql.SQL("GRANT SELECT ON {} TO {}").format(table, r))
        if o.columns.has_status:
            update_cols = sql.SQL(", ").join(sql.Identifier(c) for c in POLLING_COLUMNS)
            stmts.append(sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(update_cols, table, r))
        stmts.append(sql.SQL("GRANT DELETE ON {} TO {}").format(table, r))
    stmts.append(
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(relay_state_ident(settings), r)
    )
    return stmts
