"""Preflight checks, ``init``, ``status`` and ``drop`` against PostgreSQL.

- :func:`preflight` inspects the server and returns :class:`Check` rows (never raises for a
  failed check); ``init`` raises :class:`PreflightFailed` (exit 3) if any check failed.
  Checks live in :mod:`cdc_outbox.admin.preflight`, catalog queries in
  :mod:`cdc_outbox.store.inspection`; both are re-exported here.
- :func:`init` creates what is missing - each configured outbox table (only with
  ``create_table``; its schema too, if missing), ONE publication of the inserts of every
  configured table, a ``pgoutput`` logical slot - and nothing else. An existing publication
  lacking configured tables gets them added (an ``[[outboxes]]`` entry added later); one that
  differs otherwise (other tables, other operations) is a failed check, never altered. When
  tables are added next to an existing slot and already hold unpublished rows (which that slot
  never streams), the relay's phase is set to CATCHING_UP: its next start publishes them.
  Idempotent: a second run has no actions.
- :func:`status` reports slot position/lag/retained WAL, publication tables, and per outbox
  table its unpublished rows, oldest unpublished age, FAILED rows and parked aggregates.
- :func:`drop` drops the slot and the publication, never a table.

Connection failures raise :class:`DatabaseUnavailable` (exit 1).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cdc_outbox.admin.checks import Check
from cdc_outbox.admin.failover_checks import standby_failover_checks
from cdc_outbox.admin.preflight import (
    MIN_SERVER_VERSION,
    PreflightFailed,
    evaluate_checks,
    missing_from_publication,
    preflight,
    table_state,
)
from cdc_outbox.config.settings import OutboxSettings, Settings
from cdc_outbox.delivery.policy import guarantee_in_effect
from cdc_outbox.errors import DatabaseUnavailable, PreflightError
from cdc_outbox.ha.leadership_rules import application_name
from cdc_outbox.lsn import Lsn
from cdc_outbox.redaction import redact, redact_dsn
from cdc_outbox.store import relay_state, schema
from cdc_outbox.store.inspection import (
    Conn,
    OutboxFigures,
    PublicationStatus,
    SlotStatus,
    inspect_database,
    inspect_standby,
    outbox_figures,
)
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = [
    "MIN_SERVER_VERSION",
    "Action",
    "Conn",
    "DatabaseUnavailable",
    "DropReport",
    "InitReport",
    "PreflightFailed",
    "PublicationStatus",
    "SlotActive",
    "SlotStatus",
    "StatusReport",
    "connect",
    "drop",
    "init",
    "preflight",
    "standby_checks",
    "status",
    "unpublished_rows",
]

logger = logging.getLogger(__name__)


class SlotActive(PreflightError):
    """``drop`` refused: a relay is streaming from the slot."""


def connect(settings: Settings, dsn: str | None = None) -> Conn:
    """An autocommit connection (to ``dsn``, by default the settings' database);
    ``DatabaseUnavailable`` (one line, no secrets) on failure."""
    dsn = settings.postgres_dsn() if dsn is None else dsn
    given = conninfo_to_dict(dsn)
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = 10
    if "application_name" not in given:
        extra["application_name"] = "cdc-outbox"
    try:
        return psycopg.connect(dsn, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        message = redact(" ".join(str(exc).split()), settings.secret_values())
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {message}"
        ) from None


def standby_checks(settings: Settings, dsn: str) -> list[Check]:
    """Whether the standby at ``dsn`` is set up for failover slots and has our slot synced
    (:mod:`cdc_outbox.admin.failover_checks`; ``status --standby``)."""
    with connect(settings, dsn) as conn:
        st = inspect_standby(conn, settings.slot_name)
    return standby_failover_checks(st, settings.slot_name)


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
    """Create the missing tables (only with ``create_table``), publication (or add the
    configured tables it lacks) and slot."""
    with connect(settings) as conn:
        st = inspect_database(conn, settings)
        checks = evaluate_checks(st, settings, create_table, adding=True)
        if not all(c.ok for c in checks):
            raise PreflightFailed(checks)
        ddl: list[tuple[str, sql.Composed]] = []
        new_schemas: set[str] = set()
        for outbox in settings.outbox_settings():
            ts = table_state(st, outbox)
            if ts.oid is not None:
                continue
            if not ts.schema_exists and outbox.schema_name not in new_schemas:
                new_schemas.add(outbox.schema_name)
                ddl.append(("create_schema", schema.create_schema_ddl(outbox.schema_name)))
            stmts = schema.outbox_table_ddl(settings, outbox)
            ddl += [("create_table" if i == 0 else "create_index", s) for i, s in enumerate(stmts)]
        added = missing_from_publication(st, settings)
        if st.publication is None:
            ddl.append(("create_publication", schema.publication_ddl(settings)))
        elif added:
            ddl.append(("add_to_publication", schema.add_to_publication_ddl(settings, added)))
        ddl += relay_state.missing_ddl(conn, settings)
        slot_sql = None
        if st.slot is None:
            failover = schema.slot_failover(settings.slot_failover, st.version_num)
            slot_sql = schema.create_slot_sql(settings, failover)
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
            point = None
            if slot_sql is not None:
                row = conn.execute(slot_sql).fetchone()
                point = None if row is None else Lsn.parse(row[0])
                logger.info("init: created slot %s at %s", settings.slot_name, point)
            _record_slot(conn, settings, point, added)
            for check in checks:
                if check.warning:
                    logger.warning("init: %s: %s (%s)", check.name, check.detail, check.fix)
        elif not actions:
            logger.debug("init: nothing to do")
        return InitReport(checks, actions, dry_run)


def _record_slot(
    conn: Conn, settings: Settings, point: Lsn | None, added: list[OutboxSettings]
) -> None:
    """Record the slot's phase: a new slot streams from its point unless rows are already
    unpublished. Tables added next to an existing slot are not in its ``streamed_tables``:
    the relay catches them up at its next start (the slot never streams rows committed
    before they joined the publication)."""
    backlog = unpublished_rows(conn, settings)
    # A new slot never streams rows committed before its consistent point. Counted after it
    # exists, no unpublished row means none of those is unpublished: the relay streams this
    # slot (STREAMING at its point). Otherwise its first start publishes them (catch-up).
    relay_state.record_new_slot(
        conn, settings, None if backlog else point, created=point is not None
    )
    names = ", ".join(o.name for o in settings.outbox_settings())
    if backlog and point is not None:
        logger.warning(
            "init: %d unpublished rows already in %s; the relay publishes them (catch-up)"
            " before it streams",
            backlog,
            names,
        )
    elif point is not None:
        logger.info(
            "init: no unpublished rows: the relay streams slot %s from %s",
            settings.slot_name,
            point,
        )
    elif added and (waiting := unpublished_rows(conn, settings, added)):
        # Nothing to record: the slot's streamed_tables lacks the added tables, so the relay's
        # next session start catches them up (cdc_outbox.cdc.new_tables), table by table.
        logger.warning(
            "init: %d unpublished rows already in %s, added to publication %s: slot %s never"
            " streams them; the relay's next start publishes them (catch-up of those tables):"
            " restart it",
            waiting,
            ", ".join(o.name for o in added),
            settings.publication_name,
            settings.slot_name,
        )


def unpublished_rows(
    conn: Conn, settings: Settings, outboxes: list[OutboxSettings] | None = None
) -> int:
    """Rows a catch-up would publish (all rows for a layout without a status column), summed
    over ``outboxes`` (None: every configured outbox table)."""
    total = 0
    for outbox in settings.outbox_settings() if outboxes is None else outboxes:
        row = conn.execute(OutboxTable.of(settings, outbox).count_unpublished()).fetchone()
        total += int(row[0]) if row else 0
    return total


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
    #: The relay's durable phase and leader (None before ``init`` created the state table).
    relay: dict[str, Any] | None = None
    #: Dead-lettered rows (FAILED) and the aggregates they park (default preset only).
    failed_rows: int | None = None
    parked_aggregates: int | None = None
    #: Per configured outbox table (schema.table), in configuration order; the totals above
    #: sum the tables with status columns.
    outboxes: list[OutboxFigures] | None = None

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
        st = inspect_database(conn, settings)
        figures = outbox_figures(conn, OutboxTable.all_of(settings))
        kept = [f for f in figures if f.failed_rows is not None]
        pending = _total([f.pending_rows for f in kept])
        failed = _total([f.failed_rows for f in kept])
        parked = _total([f.parked_aggregates for f in kept])
        relay = None
        if relay_state.table_exists(conn, settings):
            relay = relay_state.read_state(conn, settings).to_dict()
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s",
                (application_name(settings.slot_name),),
            ).fetchone()
            instances = int(row[0]) if row else 0
            leading = 1 if relay["leader_id"] and not relay["lease_expired"] else 0
            relay["instances"] = instances
            relay["standby_instances"] = max(instances - leading, 0)
            relay["delivery"] = settings.delivery
            relay["delivery_in_effect"] = guarantee_in_effect(settings.delivery, relay["phase"])
        return StatusReport(
            database=redact_dsn(settings.postgres_dsn()),
            server_version=st.version,
            outbox_table=", ".join(f.outbox for f in figures),
            table_exists=all(f.exists for f in figures),
            pending_rows=pending,
            slot=st.slot,
            publication=st.publication,
            checks=evaluate_checks(st, settings, create_table=False),
            relay=relay,
            failed_rows=failed,
            parked_aggregates=parked,
            outboxes=figures,
        )


def _total(values: list[int | None]) -> int | None:
    """The sum, None when there is nothing to sum."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


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
        st = inspect_database(conn, settings)
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
