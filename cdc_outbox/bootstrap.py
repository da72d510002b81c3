"""Preflight checks, ``init``, ``status`` and ``drop`` against PostgreSQL.

- :func:`preflight` inspects the server and returns :class:`Check` rows (never raises for a
  failed check); ``init`` raises :class:`PreflightFailed` (exit 3) if any check failed.
- :func:`init` creates what is missing - the outbox table (only with ``create_table``), a
  publication of the outbox's inserts, a ``pgoutput`` logical slot - and nothing else. An
  existing publication that differs (other tables, other operations) is a failed check, never
  altered. Idempotent: a second run has no actions.
- :func:`status` reports slot position/lag/retained WAL, publication tables, pending rows.
- :func:`drop` drops the slot and the publication, never the table.

Connection failures raise :class:`DatabaseUnavailable` (exit 1).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cdc_outbox import schema
from cdc_outbox.config import Settings, redact_dsn
from cdc_outbox.errors import CdcOutboxError, PreflightError
from cdc_outbox.lsn import Lsn

logger = logging.getLogger(__name__)
Conn = psycopg.Connection[tuple[Any, ...]]
MIN_SERVER_VERSION = 140000


class DatabaseUnavailable(CdcOutboxError):
    """PostgreSQL could not be reached or refused the login (exit code 1)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One preflight result; ``fix`` says what to do when ``ok`` is false."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


class PreflightFailed(PreflightError):
    """At least one preflight check failed; ``checks`` holds all of them."""

    def __init__(self, checks: list[Check]) -> None:
        self.checks = checks
        failed = [c for c in checks if not c.ok]
        super().__init__(
            "preflight failed: "
            + "; ".join(
                f"{c.name}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "") for c in failed
            )
        )


class SlotActive(PreflightError):
    """``drop`` refused: a relay is streaming from the slot."""


def connect(settings: Settings) -> Conn:
    """An autocommit connection; ``DatabaseUnavailable`` (one line, no secrets) on failure."""
    dsn = settings.postgres_dsn()
    given = conninfo_to_dict(dsn)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = 10
    if "application_name" not in given:
        extra["application_name"] = "cdc-outbox"
    try:
        return psycopg.connect(dsn, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        message = " ".join(str(exc).split())
        for secret in settings.secret_values():
            message = message.replace(secret, "***")
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {message}"
        ) from None


# -- inspection ----------------------------------------------------------------------------


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


@dataclass(slots=True)
class PublicationStatus:
    name: str
    tables: list[str]
    operations: list[str]
    all_tables: bool


@dataclass(slots=True)
class _State:
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
    can_create_in_schema: bool
    table_oid: int | None = None
    table_owned: bool = False
    table_columns: set[str] = field(default_factory=set)
    slot: SlotStatus | None = None
    publication: PublicationStatus | None = None


_SERVER_SQL = """
SELECT current_setting('server_version_num')::int, current_setting('server_version'),
       current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int,
       r.rolsuper, r.rolreplication, current_user, current_database(),
       has_database_privilege(current_database(), 'CREATE'),
       coalesce(has_schema_privilege(n.oid, 'CREATE'), false)
FROM pg_roles r
LEFT JOIN pg_namespace n ON n.nspname = %s
WHERE r.rolname = current_user
"""
_TABLE_SQL = """
SELECT c.oid, pg_has_role(c.relowner, 'USAGE')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""
_COLUMNS_SQL = (
    "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
)
_SLOT_SQL = """
SELECT slot_name, slot_type, active, active_pid, confirmed_flush_lsn::text, restart_lsn::text,
       pg_wal_lsn_diff(w.lsn, confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(w.lsn, restart_lsn)::bigint,
       wal_status, safe_wal_size, plugin, database
FROM pg_replication_slots,
     LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                          ELSE pg_current_wal_lsn() END AS lsn) w
WHERE slot_name = %s
"""
_OPS = ("insert", "update", "delete", "truncate")
_PUB_SQL = """
SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate
FROM pg_publication WHERE pubname = %s
"""
_PUB_TABLES_SQL = """
SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s
ORDER BY schemaname, tablename
"""


def _inspect(conn: Conn, settings: Settings) -> _State:
    row = conn.execute(_SERVER_SQL, (settings.outbox_schema,)).fetchone()
    assert row is not None
    st = _State(*row)
    trow = conn.execute(_TABLE_SQL, (settings.outbox_schema, settings.outbox_table)).fetchone()
    if trow is not None:
        st.table_oid, st.table_owned = trow
        st.table_columns = {r[0] for r in conn.execute(_COLUMNS_SQL, (st.table_oid,))}
    srow = conn.execute(_SLOT_SQL, (settings.slot_name,)).fetchone()
    if srow is not None:
        name, kind, active, pid, flushed, restart, lag, retained, wal, safe, plugin, db = srow
        st.slot = SlotStatus(
            name, kind, active, pid, _lsn(flushed), _lsn(restart), lag, retained, wal, safe,
            plugin, db,
        )  # fmt: skip
    prow = conn.execute(_PUB_SQL, (settings.publication_name,)).fetchone()
    if prow is not None:
        ops = [op for op, on in zip(_OPS, prow[1:], strict=True) if on]
        tables = [
            f"{s}.{t}" for s, t in conn.execute(_PUB_TABLES_SQL, (settings.publication_name,))
        ]
        st.publication = PublicationStatus(settings.publication_name, tables, ops, prow[0])
    return st


def _lsn(text: str | None) -> Lsn | None:
    return None if text is None else Lsn.parse(text)


def _required_columns(settings: Settings) -> list[str]:
    cols = settings.column_names()
    names = [cols.id, cols.aggregate_type, cols.aggregate_id, cols.event_type, cols.payload]
    return names + ([cols.headers] if cols.headers else [])


def preflight(conn: Conn, settings: Settings, *, create_table: bool = False) -> list[Check]:
    """Readiness checks; names: server_version, wal_level, replication_privilege,
    replication_slots, wal_senders, outbox_table, outbox_columns, publication, slot."""
    return _checks(_inspect(conn, settings), settings, create_table)


def _check(name: str, ok: bool, detail: str, fix: str = "") -> Check:
    return Check(name, ok, detail, "" if ok else fix)


def _checks(st: _State, settings: Settings, create_table: bool) -> list[Check]:
    priv = st.superuser or st.replication
    free_slots = st.max_slots - st.used_slots
    free_senders = st.max_senders - st.used_senders
    checks = [
        _check("server_version", st.version_num >= MIN_SERVER_VERSION,
               f"PostgreSQL {st.version}", "upgrade to PostgreSQL 14 or later"),
        _check("wal_level", st.wal_level == "logical", f"wal_level is '{st.wal_level}'",
               "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"),
        _check("replication_privilege", priv,
               f"role '{st.user}' {'has' if priv else 'lacks'} REPLICATION",
               f'as a superuser: ALTER ROLE "{st.user}" REPLICATION'),
        _check("replication_slots", True, f"slot '{settings.slot_name}' already exists")
        if st.slot is not None else
        _check("replication_slots", free_slots > 0,
               f"{free_slots} of {st.max_slots} replication slots free",
               "raise max_replication_slots (restart) or drop unused slots"),
        _check("wal_senders", free_senders > 0,
               f"{free_senders} of {st.max_senders} WAL senders free",
               "raise max_wal_senders (restart)"),
    ]  # fmt: skip
    table = f"{settings.outbox_schema}.{settings.outbox_table}"
    if st.table_oid is not None:
        missing = [c for c in _required_columns(settings) if c not in st.table_columns]
        checks.append(_check("outbox_table", True, f"table {table} exists"))
        checks.append(_check("outbox_columns", not missing,
                             f"missing column(s): {', '.join(missing)}" if missing
                             else "all columns present",
                             "fix the columns.* settings or the table"))  # fmt: skip
    elif create_table:
        ok = st.can_create_in_schema
        checks.append(_check("outbox_table", ok,
                             f"table {table} will be created" if ok
                             else f"no CREATE privilege on schema {settings.outbox_schema}",
                             "run init as the schema owner"))  # fmt: skip
    else:
        checks.append(_check("outbox_table", False, f"table {table} does not exist",
                             "pass --create-table, or create it from sql/outbox.sql"))  # fmt: skip
    checks.append(_publication_check(st, settings, table))
    checks.append(_slot_check(st, settings))
    return checks


def _publication_check(st: _State, settings: Settings, table: str) -> Check:
    name, pub = settings.publication_name, st.publication
    if pub is None:
        can = (st.superuser or st.table_owned or st.table_oid is None) and st.can_create_in_db
        return _check("publication", can,
                      f"publication '{name}' will be created" if can else
                      f"publication '{name}' is missing and role '{st.user}' may not create it",
                      "run init as the outbox table's owner (or a superuser)")  # fmt: skip
    problems = []
    if pub.all_tables or pub.tables != [table]:
        problems.append(f"covers {'ALL TABLES' if pub.all_tables else ', '.join(pub.tables)}")
    if pub.operations != ["insert"]:
        problems.append(f"publishes {', '.join(pub.operations) or 'nothing'}")
    return _check("publication", not problems,
                  f"publication '{name}' {' and '.join(problems)}; expected inserts of {table} only"
                  if problems else f"publication '{name}' publishes inserts of {table}",
                  f"`cdc-outbox drop --yes` then init again, or ALTER PUBLICATION {name} "
                  f"SET TABLE {table}; ALTER PUBLICATION {name} SET (publish = 'insert')",
                  )  # fmt: skip


def _slot_check(st: _State, settings: Settings) -> Check:
    name, slot = settings.slot_name, st.slot
    if slot is None:
        return _check("slot", True, f"slot '{name}' will be created")
    if slot.slot_type != "logical" or slot.plugin != "pgoutput":
        return _check("slot", False,
                      f"slot '{name}' is {slot.slot_type}/{slot.plugin}, not logical/pgoutput",
                      "choose another slot_name, or drop that slot")  # fmt: skip
    if slot.database != st.database:
        return _check("slot", False, f"slot '{name}' belongs to database '{slot.database}'",
                      "choose another slot_name, or connect to that database")  # fmt: skip
    if slot.wal_status == "lost":
        return _check("slot", False, f"slot '{name}' was invalidated (wal_status lost)",
                      "`cdc-outbox drop --yes` then init; recover missed rows by polling",
                      )  # fmt: skip
    return _check("slot", True, f"slot '{name}' exists (pgoutput)")


# -- init ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Action:
    """One change ``init`` makes (or would make, with ``dry_run``)."""

    name: str
    sql: str


@dataclass(slots=True)
class InitReport:
    checks: list[Check]
    actions: list[Action]
    dry_run: bool

    @property
    def nothing_to_do(self) -> bool:
        return not self.actions

    def to_dict(self) -> dict[str, Any]:
        return {
            "checks": [asdict(c) for c in self.checks],
            "actions": [asdict(a) for a in self.actions],
            "dry_run": self.dry_run,
            "nothing_to_do": self.nothing_to_do,
        }


def init(settings: Settings, create_table: bool = False, dry_run: bool = False) -> InitReport:
    """Create the missing table (only with ``create_table``), publication and slot."""
    with connect(settings) as conn:
        st = _inspect(conn, settings)
        checks = _checks(st, settings, create_table)
        if not all(c.ok for c in checks):
            raise PreflightFailed(checks)
        ddl: list[tuple[str, sql.Composed]] = []
        if st.table_oid is None:
            stmts = schema.outbox_table_ddl(settings)
            ddl += [("create_table" if i == 0 else "create_index", s) for i, s in enumerate(stmts)]
        if st.publication is None:
            ddl.append(("create_publication", schema.publication_ddl(settings)))
        slot_sql = schema.create_slot_sql(settings) if st.slot is None else None
        actions = [Action(name, stmt.as_string(conn)) for name, stmt in ddl]
        if slot_sql is not None:
            actions.append(Action("create_slot", slot_sql.as_string(conn)))
        if not dry_run:
            with conn.transaction():
                for _, stmt in ddl:
                    conn.execute(stmt)
            for name, _ in ddl:
                logger.info("init: %s done", name)
            # A slot cannot be created in a transaction that wrote; and the publication
            # must exist before the slot's consistent point for pgoutput to use it.
            if slot_sql is not None:
                row = conn.execute(slot_sql).fetchone()
                logger.info("init: created slot %s: %s", settings.slot_name, row)
        elif not actions:
            logger.debug("init: nothing to do")
        return InitReport(checks, actions, dry_run)


# -- status --------------------------------------------------------------------------------


@dataclass(slots=True)
class StatusReport:
    database: str
    server_version: str
    outbox_table: str
    table_exists: bool
    pending_rows: int | None
    slot: SlotStatus | None
    publication: PublicationStatus | None
    checks: list[Check]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (LSNs as text)."""
        data = asdict(self)
        if self.slot is not None:
            for key in ("confirmed_flush_lsn", "restart_lsn"):
                value = getattr(self.slot, key)
                data["slot"][key] = None if value is None else str(value)
        return data


def status(settings: Settings) -> StatusReport:
    """Read-only snapshot of the slot, publication and outbox (works for the relay role)."""
    with connect(settings) as conn:
        st = _inspect(conn, settings)
        pending = None
        if st.table_oid is not None and "status" in st.table_columns:
            query = sql.SQL("SELECT count(*) FROM {} WHERE status = 'PENDING'").format(
                schema.outbox_ident(settings)
            )
            row = conn.execute(query).fetchone()
            pending = int(row[0]) if row else None
        return StatusReport(
            database=redact_dsn(settings.postgres_dsn()),
            server_version=st.version,
            outbox_table=f"{settings.outbox_schema}.{settings.outbox_table}",
            table_exists=st.table_oid is not None,
            pending_rows=pending,
            slot=st.slot,
            publication=st.publication,
            checks=_checks(st, settings, create_table=False),
        )


# -- drop ----------------------------------------------------------------------------------


@dataclass(slots=True)
class DropReport:
    dropped: list[str]
    terminated_pid: int | None = None

    @property
    def nothing_to_do(self) -> bool:
        return not self.dropped

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "nothing_to_do": self.nothing_to_do}


_ACTIVE_PID_SQL = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active"


def drop(settings: Settings, force: bool = False, wait_s: float = 10.0) -> DropReport:
    """Drop the slot then the publication (the table stays).

    An active slot raises :class:`SlotActive` (exit 3) unless ``force``, which terminates the
    backend using it and waits up to ``wait_s`` for the slot to be released.
    """
    report = DropReport([])
    with connect(settings) as conn:
        st = _inspect(conn, settings)
        if st.slot is not None:
            if st.slot.database not in (None, st.database):
                raise PreflightError(
                    f"slot '{settings.slot_name}' belongs to database "
                    f"'{st.slot.database}'; connect to it to drop the slot"
                )
            pid = st.slot.active_pid if st.slot.active else None
            if pid is not None and not force:
                raise SlotActive(
                    f"slot '{settings.slot_name}' is active for PID {pid}; "
                    "stop the relay first (or pass --force to terminate it)"
                )
            if pid is not None:
                logger.warning("drop: terminating PID %s (using slot %s)", pid, settings.slot_name)
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                report.terminated_pid = pid
                _wait_released(conn, settings.slot_name, wait_s)
            conn.execute(schema.drop_slot_sql(settings))
            report.dropped.append(f"slot {settings.slot_name}")
            logger.info("drop: dropped slot %s", settings.slot_name)
        if st.publication is not None:
            conn.execute(schema.drop_publication_ddl(settings))
            report.dropped.append(f"publication {settings.publication_name}")
            logger.info("drop: dropped publication %s", settings.publication_name)
    return report


def _wait_released(conn: Conn, slot_name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while conn.execute(_ACTIVE_PID_SQL, (slot_name,)).fetchone() is not None:
        if time.monotonic() > deadline:
            raise SlotActive(f"slot '{slot_name}' still active {timeout_s:g}s after terminate")
        time.sleep(0.05)
