"""The relay's durable phase: ``POLLING -> CATCHING_UP -> STREAMING``, one row per slot.

Contract:
- The phase lives in ``<outbox schema>.cdc_outbox_relay_state`` (created by ``init``) and is
  written, committed, *before* the transition takes effect: a process that dies anywhere
  finds on restart the phase whose work may be unfinished, and redoes it.
- ``CATCHING_UP(slot, consistent_point)``: a slot is being (re)created and the rows that were
  unpublished at its consistent point are being published (``init`` leaves it when the table
  had unpublished rows once its new slot existed; with none it writes ``STREAMING`` at the
  slot's consistent point: :func:`record_new_slot`, :mod:`cdc_outbox.cdc.catch_up_rule`).
  Streaming from that slot is only allowed once the phase is ``STREAMING``, which is written
  after every backlog row was acknowledged (or durably dead-lettered). A restart that finds
  ``CATCHING_UP`` recreates the slot and redoes the catch-up (duplicates possible, never a
  gap).
- ``POLLING``: auto mode relays by polling; returning to CDC goes through ``CATCHING_UP``.
- Writes by a leader are fenced: :func:`write_phase` with a ``leader_id`` only updates the
  row while that instance holds the lease, and raises :class:`NotLeader` otherwise.
- A missing row (a database set up by an older ``init``) reads as ``CATCHING_UP``: the safe
  choice, since whether the slot's backlog was relayed is unknown.
- ``confirmed_lsn``: the position the relay confirms to the slot (every event before it is in
  Kafka), written by :func:`keep_position` (committed) before each confirmation is sent. The
  slot's own ``confirmed_flush_lsn`` is only saved to disk now and then, so a PostgreSQL crash
  can move it back by seconds or (with a long-running transaction open) far more; a stream
  starts from the greater of the two (:func:`kept_position`), and PostgreSQL skips the
  transactions before it. It only grows, and only ever holds confirmed positions; a value of
  an earlier incarnation of the slot is harmless: it is below the new slot's consistent point.
- ``streamed_tables`` (issue 36): which outbox tables the slot has been streaming, each
  ``schema.table`` with the LSN from which the stream publishes its rows (rows of
  transactions committed before it were published by a catch-up). Written, committed,
  *before* it takes effect (:func:`record_streamed_tables`): after a table's catch-up is
  done and before a session streams it, after a new slot's catch-up, and at a session start
  that no longer streams a table (it is dropped from the record: its rows are ignored from
  then on, so adding it again later means a catch-up). None (an older table or slot):
  unknown, read as "the first configured outbox only" by the relay
  (:mod:`cdc_outbox.cdc.new_tables`).
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import psycopg
from psycopg import sql

from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.lsn import Lsn
from cdc_outbox.store import db_pool, schema
from cdc_outbox.store.inspection import SlotStatus, slot_status

__all__ = [
    "KeepOutcome",
    "NotLeader",
    "Phase",
    "RelayState",
    "SlotFacts",
    "ensure_table",
    "has_confirmed_lsn",
    "keep_position",
    "kept_position",
    "read_state",
    "record_new_slot",
    "record_streamed_tables",
    "slot_facts",
    "streamed_tables",
    "write_phase",
]

Conn = psycopg.Connection[Any]
logger = logging.getLogger(__name__)


class Phase(enum.StrEnum):
    POLLING = "POLLING"
    CATCHING_UP = "CATCHING_UP"
    STREAMING = "STREAMING"


class NotLeader(CdcOutboxError):
    """This instance no longer holds the leader lease; it must stop relaying."""


@dataclass(frozen=True, slots=True)
class RelayState:
    """One row of the state table (``phase`` CATCHING_UP when the row is missing)."""

    phase: Phase
    consistent_point: Lsn | None = None
    leader_id: str | None = None
    leader_pid: int | None = None
    lease_expired: bool | None = None
    exists: bool = True
    confirmed_lsn: Lsn | None = None

    def to_dict(self) -> dict[str, Any]:
        point = self.consistent_point
        return {
            "phase": str(self.phase),
            "consistent_point": None if point is None else str(point),
            "leader_id": self.leader_id,
            "lease_expired": self.lease_expired,
            "confirmed_lsn": None if self.confirmed_lsn is None else str(self.confirmed_lsn),
        }


def ensure_table(conn: Conn, settings: Settings) -> None:
    """Create the state table if it is missing, or add ``confirmed_lsn`` to an older one, if
    this role may (``init`` normally does; a polling-only deployment may never run ``init``).
    A role without the privilege gets the leader election's own "run `cdc-outbox init`"
    error later (no table), or a relay that warns it cannot keep its position (no column)."""
    try:
        for _, stmt in missing_ddl(conn, settings):
            conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege:
        return


def missing_ddl(conn: Conn, settings: Settings) -> list[tuple[str, sql.Composed]]:
    """``(step, statement)`` that bring the state table up to date: ``create_state_table``
    steps when it is missing, ``add_confirmed_lsn`` for one older than that column,
    ``add_streamed_tables`` for one older than that one, or none."""
    if not table_exists(conn, settings):
        return [("create_state_table", s) for s in schema.relay_state_ddl(settings)]
    steps = []
    if not has_confirmed_lsn(conn, settings):
        steps.append(("add_confirmed_lsn", schema.relay_state_confirmed_ddl(settings)))
    if not _has_column(conn, settings, "streamed_tables"):
        steps.append(("add_streamed_tables", _streamed_tables_ddl(settings)))
    return steps


def _streamed_tables_ddl(settings: Settings) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS streamed_tables jsonb").format(
        schema.relay_state_ident(settings)
    )


def table_exists(conn: Conn, settings: Settings) -> bool:
    """Whether the state table exists."""
    ident = schema.relay_state_ident(settings).as_string(conn)
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (ident,)).fetchone()
    return bool(row and row[0])


def has_confirmed_lsn(conn: Conn, settings: Settings) -> bool:
    """Whether the (existing) state table has the ``confirmed_lsn`` column."""
    return _has_column(conn, settings, "confirmed_lsn")


def _has_column(conn: Conn, settings: Settings, column: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass"
        " AND attname = %s AND NOT attisdropped",
        (schema.relay_state_ident(settings).as_string(conn), column),
    ).fetchone()
    return row is not None


def read_state(conn: Conn, settings: Settings) -> RelayState:
    """The persisted state of ``settings.slot_name`` (see the module contract)."""
    row = conn.execute(
        sql.SQL(
            "SELECT phase, consistent_point::text, leader_id, leader_pid,"
            " lease_until IS NULL OR lease_until < now(),"
            " to_jsonb(s) ->> 'confirmed_lsn'"  # NULL in a table made by an older init
            " FROM {} s WHERE slot_name = %s"
        ).format(schema.relay_state_ident(settings)),
        (settings.slot_name,),
    ).fetchone()
    if row is None:
        return RelayState(Phase.CATCHING_UP, exists=False)
    phase, point, leader, pid, expired, confirmed = row
    return RelayState(
        Phase(phase),
        None if point is None else Lsn.parse(point),
        leader,
        pid,
        bool(expired),
        confirmed_lsn=None if confirmed is None else Lsn.parse(confirmed),
    )


#: What :func:`keep_position` achieved: ``kept`` (committed), ``unsupported`` (the table has no
#: ``confirmed_lsn`` column: warned, never to be tried again; confirmations go out unkept, as
#: with an older ``init``), ``failed`` (the database did not take it now: logged; the
#: confirmation must wait, or a later start would find the slot past every recorded position
#: and catch up needlessly).
KeepOutcome = Literal["kept", "unsupported", "failed"]


def keep_position(settings: Settings, lsn: int) -> KeepOutcome:
    """Raise the slot's ``confirmed_lsn`` to ``lsn`` (committed when this returns ``kept``)."""
    try:
        # Short waits: this runs on the relay thread, and a database that is down fails the
        # stream anyway (the confirmation cannot go out either).
        with db_pool.pooled(settings, timeout=2.0, statement_timeout_s=5.0) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET confirmed_lsn = greatest(confirmed_lsn, %s::pg_lsn)"
                    " WHERE slot_name = %s"
                ).format(schema.relay_state_ident(settings)),
                (str(Lsn(lsn)), settings.slot_name),
            )
    except psycopg.errors.UndefinedColumn:
        logger.warning(
            "the relay state table has no confirmed_lsn column: run `cdc-outbox init` (as its"
            " owner) to add it; until then a PostgreSQL crash may make the relay re-send the"
            " events of the seconds (or more) before it"
        )
        return "unsupported"
    except (CdcOutboxError, psycopg.Error) as exc:
        logger.warning(
            "could not keep the confirmed position %s (not confirmed yet): %s", Lsn(lsn), exc
        )
        return "failed"
    return "kept"


class SlotFacts(NamedTuple):
    """What the catch-up rule (:mod:`cdc_outbox.cdc.catch_up_rule`) decides on: the state row,
    the slot (None if missing) and whether the state table keeps positions."""

    state: RelayState
    slot: SlotStatus | None
    keeps_position: bool


def slot_facts(settings: Settings) -> SlotFacts:
    """Read :class:`SlotFacts` (one pooled connection). Raises ``psycopg.Error`` or
    ``DatabaseUnavailable``."""
    with db_pool.pooled(settings, timeout=5.0, statement_timeout_s=5.0) as conn:
        exists = table_exists(conn, settings)
        keeps = exists and has_confirmed_lsn(conn, settings)
        state = (
            read_state(conn, settings) if exists else RelayState(Phase.CATCHING_UP, exists=False)
        )
        return SlotFacts(state, slot_status(conn, settings.slot_name), keeps)


def kept_position(settings: Settings) -> int:
    """The slot's persisted ``confirmed_lsn``, where a stream may start (see the module
    contract); 0 if there is none or it cannot be read (logged: a start from the slot's own
    position then re-sends more, loses nothing)."""
    try:
        with db_pool.pooled(settings, timeout=5.0, statement_timeout_s=5.0) as conn:
            return int(read_state(conn, settings).confirmed_lsn or 0)
    except (CdcOutboxError, psycopg.Error) as exc:
        logger.warning("could not read the kept confirmed position: %s", exc)
        return 0


def record_new_slot(
    conn: Conn, settings: Settings, streamable_from: int | None, *, created: bool
) -> None:
    """``init``'s record of the slot. Not ``created`` (it existed): add a CATCHING_UP row if
    there is none, change nothing else. ``created``: the slot is a new incarnation, so the
    kept ``confirmed_lsn`` and ``streamed_tables`` of an earlier one are cleared (unknown
    streamed tables: the relay catches up every outbox but the first before streaming it,
    :mod:`cdc_outbox.cdc.new_tables`), and the phase is STREAMING, with every configured
    table recorded as streamed, at
    ``streamable_from`` (its consistent point, given when no row committed before it is
    unpublished: the slot alone delivers everything) or else CATCHING_UP (its backlog)."""
    table = schema.relay_state_ident(settings)
    if not created:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (slot_name, phase) VALUES (%s, 'CATCHING_UP')"
                " ON CONFLICT (slot_name) DO NOTHING"
            ).format(table),
            (settings.slot_name,),
        )
        return
    phase = Phase.CATCHING_UP if streamable_from is None else Phase.STREAMING
    point = None if streamable_from is None else str(Lsn(streamable_from))
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (slot_name, phase, consistent_point) VALUES (%s, %s, %s::pg_lsn)"
            " ON CONFLICT (slot_name) DO UPDATE SET phase = EXCLUDED.phase,"
            " consistent_point = EXCLUDED.consistent_point, confirmed_lsn = NULL,"
            " updated_at = now()"
        ).format(table),
        (settings.slot_name, str(phase), point),
    )
    if _has_column(conn, settings, "streamed_tables"):
        # STREAMING at its point: every configured table is the slot's own from there on
        # (none is "added later"); CATCHING_UP: the relay records them once caught up.
        tables = None
        if point is not None:
            tables = json.dumps(dict.fromkeys((o.name for o in settings.outbox_settings()), point))
        conn.execute(
            sql.SQL("UPDATE {} SET streamed_tables = %s::jsonb WHERE slot_name = %s").format(table),
            (tables, settings.slot_name),
        )


def write_phase(
    conn: Conn,
    settings: Settings,
    phase: Phase,
    *,
    leader_id: str,
    consistent_point: int | None = None,
) -> None:
    """Persist ``phase`` (committed when this returns) while ``leader_id`` holds the lease;
    raises :class:`NotLeader` if it does not (another instance took over)."""
    with conn.transaction():
        cur = conn.execute(
            sql.SQL(
                "UPDATE {} SET phase = %s, consistent_point = %s::pg_lsn, updated_at = now()"
                " WHERE slot_name = %s AND leader_id = %s AND lease_until > now()"
            ).format(schema.relay_state_ident(settings)),
            (
                str(phase),
                None if consistent_point is None else str(Lsn(consistent_point)),
                settings.slot_name,
                leader_id,
            ),
        )
        if cur.rowcount != 1:
            raise NotLeader(
                f"instance {leader_id} no longer holds the lease of slot {settings.slot_name}"
            )


def streamed_tables(settings: Settings) -> dict[str, int] | None:
    """The slot's ``streamed_tables`` (see the module contract): ``schema.table`` -> the LSN
    from which its rows are streamed; None when unknown (no row, no column, NULL). Raises
    ``psycopg.Error`` or ``DatabaseUnavailable``."""
    with db_pool.pooled(settings, timeout=5.0, statement_timeout_s=5.0) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT to_jsonb(s) -> 'streamed_tables' FROM {} s WHERE slot_name = %s"
            ).format(schema.relay_state_ident(settings)),
            (settings.slot_name,),
        ).fetchone()
    if row is None or not isinstance(row[0], dict):
        return None
    return {str(name): int(Lsn.parse(str(lsn))) for name, lsn in row[0].items()}


def record_streamed_tables(settings: Settings, tables: dict[str, int]) -> None:
    """Make ``tables`` (``schema.table`` -> from LSN) the slot's ``streamed_tables``,
    committed when this returns. Raises ``psycopg.Error`` (a missing column included) or
    ``DatabaseUnavailable``."""
    value = json.dumps({name: str(Lsn(lsn)) for name, lsn in tables.items()})
    with db_pool.pooled(settings, timeout=5.0, statement_timeout_s=5.0) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET streamed_tables = %s::jsonb WHERE slot_name = %s").format(
                schema.relay_state_ident(settings)
            ),
            (value, settings.slot_name),
        )
