"""Read-only inspection of the server, outbox tables, replication slot and publication.

:func:`inspect_database` gathers everything preflight, ``init``, ``status`` and ``drop`` need
in one :class:`DatabaseState` (a few catalog queries per configured outbox table, no writes):
one :class:`TableState` per table, in configuration order. :func:`id_column_type` tells
statements that match rows by id which array type to cast their ids to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.lsn import Lsn
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.schema import FAILOVER_SLOTS_VERSION

__all__ = [
    "ColumnType",
    "Conn",
    "DatabaseState",
    "OutboxFigures",
    "PublicationStatus",
    "SlotStatus",
    "StandbyState",
    "TableState",
    "id_column_type",
    "inspect_database",
    "inspect_standby",
    "inspect_table",
    "outbox_figures",
    "outbox_id_type",
]

Conn = psycopg.Connection[tuple[Any, ...]]


@dataclass(slots=True)
class SlotStatus:
    """A row of pg_replication_slots plus lag (current WAL - confirmed_flush_lsn) and retained
    WAL (current WAL - restart_lsn), both in bytes."""

    name: str
    slot_type: str
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: Lsn | None
    restart_lsn: Lsn | None
    lag_bytes: int | None
    retained_wal_bytes: int | None
    wal_status: str | None
    safe_wal_size: int | None
    plugin: str | None
    database: str | None
    #: 17+ (None before): see cdc_outbox.ha.slot_invalidation.
    invalidation_reason: str | None = None


@dataclass(frozen=True, slots=True)
class StandbyState:
    """What a standby shows: its settings and our slot there (``slot_synced`` None: absent)."""

    version_num: int
    in_recovery: bool
    sync_replication_slots: str
    hot_standby_feedback: str
    primary_slot_name: str
    primary_conninfo: str
    slot_synced: bool | None


@dataclass(slots=True)
class PublicationStatus:
    """A publication; ``tables`` as pg_publication_tables lists them: a partitioned table
    appears under its own name only with ``via_root`` (publish_via_partition_root), otherwise
    as its leaf partitions."""

    name: str
    tables: list[str]
    operations: list[str]
    all_tables: bool
    via_root: bool = False


@dataclass(slots=True)
class TableState:
    """One configured outbox table as the catalog shows it (``oid`` None: it does not exist).

    ``schema_exists``/``can_create_in_schema``: its schema exists and the role may create in
    it; ``id_type``: the id column's type as ``format_type`` shows it (None: no such column).
    """

    schema: str
    table: str
    oid: int | None = None
    owned: bool = False
    partitioned: bool = False
    partitions: list[str] = field(default_factory=list)  # leaves, if partitioned
    columns: set[str] = field(default_factory=set)
    schema_exists: bool = True
    can_create_in_schema: bool = True
    id_type: str | None = None

    @property
    def name(self) -> str:
        """``schema.table``."""
        return f"{self.schema}.{self.table}"

    def published_as(self, via_root: bool) -> list[str]:
        """The names a publication lists this table under: its leaves when it is partitioned
        and the publication lacks ``publish_via_partition_root``, else its own."""
        return sorted(self.partitions) if self.partitioned and not via_root else [self.name]


@dataclass(slots=True)
class DatabaseState:
    """What :func:`inspect_database` found; ``slot``/``publication`` are None if absent;
    ``tables``: every configured outbox table, in configuration order."""

    version_num: int
    version: str
    wal_level: str
    max_slots: int
    used_slots: int
    max_senders: int
    used_senders: int
    superuser: bool
    replication: bool
    user: str
    database: str
    can_create_in_db: bool
    tables: list[TableState] = field(default_factory=list)
    slot: SlotStatus | None = None
    publication: PublicationStatus | None = None
    #: track_commit_timestamp is on (a catch-up can order rows by commit time).
    commit_timestamps: bool = False
    #: PostgreSQL 17+: ``synchronized_standby_slots`` and the slot's ``failover`` column.
    synchronized_standby_slots: str | None = None
    slot_failover: bool | None = None
    #: ``max_slot_wal_keep_size`` in MB (-1: unlimited, a slot is never invalidated for size).
    max_slot_wal_keep_size_mb: int = -1


_SERVER_SQL = """
SELECT current_setting('server_version_num')::int, current_setting('server_version'),
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int,
       r.rolsuper, r.rolreplication, current_user, current_database(),
       has_database_privilege(current_database(), 'CREATE'),
       current_setting('track_commit_timestamp') = 'on',
       (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size')
FROM pg_roles r
WHERE r.rolname = current_user
"""
_SCHEMA_SQL = "SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = %s"
_TABLE_SQL = """
SELECT c.oid, pg_has_role(c.relowner, 'USAGE'), c.relkind = 'p'
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
_COLUMNS_SQL = (
    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
    " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
)
_LEAVES_SQL = """
SELECT n.nspname, c.relname
FROM pg_partition_tree(%s) t
JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE t.isleaf
"""
_SLOT_SQL = """
SELECT slot_name, slot_type, active, active_pid, confirmed_flush_lsn::text, restart_lsn::text,
       pg_wal_lsn_diff(w.lsn, confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(w.lsn, restart_lsn)::bigint,
       wal_status, safe_wal_size, plugin, database,
       to_jsonb(s) ->> 'invalidation_reason'
FROM pg_replication_slots s,
     LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                          ELSE pg_current_wal_lsn() END AS lsn) w
WHERE slot_name = %s
"""
_OPS = ("insert", "update", "delete", "truncate")
_PUB_SQL = """
SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
FROM pg_publication WHERE pubname = %s
"""
_PUB_TABLES_SQL = """
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s
ORDER BY schemaname, tablename
"""

#: PostgreSQL 17+ only (the setting and the column are new there).
_FAILOVER_SQL = """
SELECT current_setting('synchronized_standby_slots'),
       (SELECT failover FROM pg_replication_slots WHERE slot_name = %s)
"""
_STANDBY_SQL = """
SELECT current_setting('server_version_num')::int, pg_is_in_recovery(),
       current_setting('sync_replication_slots', true), current_setting('hot_standby_feedback'),
       current_setting('primary_slot_name'), current_setting('primary_conninfo'),
       (SELECT CASE WHEN current_setting('server_version_num')::int >= 170000
                    THEN (to_jsonb(s) ->> 'synced')::bool AND NOT s.temporary
                    ELSE false END
        FROM pg_replication_slots s WHERE slot_name = %s)
"""


def inspect_standby(conn: Conn, slot_name: str) -> StandbyState:
    """The failover-slot settings of a standby and whether ``slot_name`` is synced there
    (``primary_conninfo`` is read to find its ``dbname`` only; it is never logged)."""
    row = conn.execute(_STANDBY_SQL, (slot_name,)).fetchone()
    assert row is not None
    version, recovery, sync, feedback, slot, primary, synced = row
    return StandbyState(version, recovery, sync or "off", feedback, slot, primary, synced)


def inspect_table(conn: Conn, schema: str, table: str, id_column: str) -> TableState:
    """One outbox table's :class:`TableState` (``id_column``: the column whose type to read)."""
    ts = TableState(schema, table)
    srow = conn.execute(_SCHEMA_SQL, (schema,)).fetchone()
    ts.schema_exists = srow is not None
    ts.can_create_in_schema = bool(srow[0]) if srow is not None else False
    trow = conn.execute(_TABLE_SQL, (schema, table)).fetchone()
    if trow is not None:
        ts.oid, ts.owned, ts.partitioned = trow
        if ts.partitioned:
            leaves = conn.execute(_LEAVES_SQL, (ts.oid,))
            ts.partitions = sorted(f"{s}.{t}" for s, t in leaves)
        types: dict[str, str] = dict(conn.execute(_COLUMNS_SQL, (ts.oid,)).fetchall())
        ts.columns = set(types)
        ts.id_type = types.get(id_column)
    return ts


def inspect_database(conn: Conn, settings: Settings) -> DatabaseState:
    """Read the server settings, role privileges, every outbox table, slot and publication."""
    row = conn.execute(_SERVER_SQL).fetchone()
    assert row is not None
    st = DatabaseState(*row[:-2])
    st.commit_timestamps = bool(row[-2])
    st.max_slot_wal_keep_size_mb = int(row[-1])
    st.tables = [
        inspect_table(conn, o.schema_name, o.table, settings.column_names(o).id)
        for o in settings.outbox_settings()
    ]
    st.slot = slot_status(conn, settings.slot_name)
    if st.version_num >= FAILOVER_SLOTS_VERSION:
        frow = conn.execute(_FAILOVER_SQL, (settings.slot_name,)).fetchone()
        assert frow is not None
        st.synchronized_standby_slots, st.slot_failover = frow
    prow = conn.execute(_PUB_SQL, (settings.publication_name,)).fetchone()
    if prow is not None:
        ops = [op for op, on in zip(_OPS, prow[1:5], strict=True) if on]
        tables = [
            f"{s}.{t}" for s, t in conn.execute(_PUB_TABLES_SQL, (settings.publication_name,))
        ]
        st.publication = PublicationStatus(
            settings.publication_name, tables, ops, prow[0], via_root=prow[5]
        )
    return st


def slot_status(conn: Conn, slot_name: str) -> SlotStatus | None:
    """The slot's row of ``pg_replication_slots`` (None if there is no such slot)."""
    srow = conn.execute(_SLOT_SQL, (slot_name,)).fetchone()
    if srow is None:
        return None
    name, kind, active, pid, flushed, restart, lag, retained, wal, safe, plugin, db, why = srow
    return SlotStatus(
        name, kind, active, pid, _lsn(flushed), _lsn(restart), lag, retained, wal, safe,
        plugin, db, why,
    )  # fmt: skip


def _lsn(text: str | None) -> Lsn | None:
    return None if text is None else Lsn.parse(text)


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A column's SQL type: ``name`` as ``format_type`` shows it (``uuid``, ``bigint``,
    ``character varying(64)``); ``schema`` and ``type_name`` name it in ``pg_type``."""

    name: str
    schema: str
    type_name: str

    @property
    def is_uuid(self) -> bool:
        return (self.schema, self.type_name) == ("pg_catalog", "uuid")

    def array(self) -> sql.Composed:
        """The array type, to cast a parameter with: ``"pg_catalog"."int8"[]`` (a typmod such
        as varchar's length is not kept; comparing with the column does not need it)."""
        return sql.SQL("{}[]").format(sql.Identifier(self.schema, self.type_name))


_COLUMN_TYPE_SQL = """
SELECT format_type(a.atttypid, a.atttypmod), tn.nspname, t.typname
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace tn ON tn.oid = t.typnamespace
WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND a.attnum > 0
  AND NOT a.attisdropped
"""


def id_column_type(conn: Conn, settings: Settings, outbox: OutboxSettings | None = None
                   ) -> ColumnType:  # fmt: skip
    """The SQL type of the id column of ``outbox`` (None: the first; one catalog query);
    :class:`ConfigError` if the table or column does not exist."""
    o = outbox or settings.outbox()
    column = settings.column_names(o).id
    schema, table = o.schema_name, o.table
    row = conn.execute(_COLUMN_TYPE_SQL, (schema, table, column)).fetchone()
    if row is None:
        raise ConfigError(f"config: no column {column!r} in table {schema}.{table}")
    return ColumnType(*row)


@dataclass(slots=True)
class OutboxFigures:
    """What one outbox table holds now (``status``, ``lag``, the per-table gauges).

    ``unpublished_rows``: PENDING or PROCESSING rows (every row of a layout without status
    columns); ``oldest_unpublished_age_seconds``: the oldest of them, by ``created_at`` (0 when
    there is none; None without that column); ``failed_rows``/``parked_aggregates``: dead
    letters and the aggregates they park (None without status columns). All None when the
    table does not exist (``exists`` False)."""

    outbox: str
    exists: bool = False
    unpublished_rows: int | None = None
    oldest_unpublished_age_seconds: float | None = None
    pending_rows: int | None = None
    failed_rows: int | None = None
    parked_aggregates: int | None = None


_REL_COLUMNS_SQL = """
SELECT a.attname FROM pg_attribute a
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""


def outbox_figures(conn: Conn, outboxes: Sequence[OutboxTable]) -> list[OutboxFigures]:
    """:class:`OutboxFigures` of ``outboxes`` (e.g. ``OutboxTable.all_of(settings)``), in
    their order (one catalog query and one count per table)."""
    figures = []
    for outbox in outboxes:
        f = OutboxFigures(outbox.name)
        figures.append(f)
        columns = {r[0] for r in conn.execute(_REL_COLUMNS_SQL, (outbox.ident.as_string(conn),))}
        if not columns:
            continue
        f.exists = True
        if not (outbox.has_status and {"status", "created_at"} <= columns):
            row = conn.execute(outbox.count_unpublished()).fetchone()
            f.unpublished_rows = int(row[0]) if row else 0
            continue
        row = conn.execute(outbox.status_counts()).fetchone()
        assert row is not None
        f.unpublished_rows, age, f.pending_rows, f.failed_rows, f.parked_aggregates = row
        f.oldest_unpublished_age_seconds = max(float(age), 0.0)
    return figures


def outbox_id_type(conn: Conn, schema: str, table: str, column: str) -> ColumnType:
    """The SQL type of ``column`` of the outbox table ``schema.table`` (one catalog query;
    :func:`id_column_type` for one given by name, e.g. each of several outbox tables);
    :class:`ConfigError` if the table or column does not exist."""
    row = conn.execute(_COLUMN_TYPE_SQL, (schema, table, column)).fetchone()
    if row is None:
        raise ConfigError(f"config: no column {column!r} in table {schema}.{table}")
    return ColumnType(*row)
