"""The relay's durable phase: ``POLLING -> CATCHING_UP -> STREAMING``, one row per slot.

Contract:
- The phase lives in ``<outbox schema>.cdc_outbox_relay_state`` (created by ``init``) and is
  written, committed, *before* the transition takes effect: a process that dies anywhere
  finds on restart the phase whose work may be unfinished, and redoes it.
- ``CATCHING_UP(slot, consistent_point)``: a slot is being (re)created and the rows that were
  unpublished at its consistent point are being published. Streaming from that slot is only
  allowed once the phase is ``STREAMING``, which is written after every backlog row was
  acknowledged (or durably dead-lettered). A restart that finds ``CATCHING_UP`` recreates the
  slot and redoes the catch-up (duplicates possible, never a gap).
- ``POLLING``: auto mode relays by polling; returning to CDC goes through ``CATCHING_UP``.
- Writes by a leader are fenced: :func:`write_phase` with a ``leader_id`` only updates the
  row while that instance holds the lease, and raises :class:`NotLeader` otherwise.
- A missing row (a database set up by an older ``init``) reads as ``CATCHING_UP``: the safe
  choice, since whether the slot's backlog was relayed is unknown.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_outbox.admin import schema
from cdc_outbox.config import Settings
from cdc_outbox.errors import CdcOutboxError
from cdc_outbox.lsn import Lsn

__all__ = [
    "NotLeader",
    "Phase",
    "RelayState",
    "ensure_row",
    "ensure_table",
    "read_state",
    "write_phase",
]

Conn = psycopg.Connection[Any]


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

    def to_dict(self) -> dict[str, Any]:
        point = self.consistent_point
        return {
            "phase": str(self.phase),
            "consistent_point": None if point is None else str(point),
            "leader_id": self.leader_id,
            "lease_expired": self.lease_expired,
        }


def ensure_table(conn: Conn, settings: Settings) -> None:
    """Create the state table if it is missing and this role may (``init`` normally does;
    a polling-only deployment may never run ``init``). A role without CREATE gets the
    leader election's own "run `cdc-outbox init`" error later."""
    ident = schema.relay_state_ident(settings).as_string(conn)
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (ident,)).fetchone()
    if row and row[0]:
        return
    try:
        for stmt in schema.relay_state_ddl(settings):
            conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege:
        return


def read_state(conn: Conn, settings: Settings) -> RelayState:
    """The persisted state of ``settings.slot_name`` (see the module contract)."""
    row = conn.execute(
        sql.SQL(
            "SELECT phase, consistent_point::text, leader_id, leader_pid,"
            " lease_until IS NULL OR lease_until < now() FROM {} WHERE slot_name = %s"
        ).format(schema.relay_state_ident(settings)),
        (settings.slot_name,),
    ).fetchone()
    if row is None:
        return RelayState(Phase.CATCHING_UP, exists=False)
    phase, point, leader, pid, expired = row
    return RelayState(
        Phase(phase), None if point is None else Lsn.parse(point), leader, pid, bool(expired)
    )


def ensure_row(conn: Conn, settings: Settings, *, catch_up: bool) -> None:
    """Create the slot's row if missing (phase CATCHING_UP); with ``catch_up`` set an existing
    row to CATCHING_UP as well (``init`` just created the slot: its backlog is unrelayed)."""
    conflict = (
        sql.SQL("DO UPDATE SET phase = 'CATCHING_UP', consistent_point = NULL, updated_at = now()")
        if catch_up
        else sql.SQL("DO NOTHING")
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (slot_name, phase) VALUES (%s, 'CATCHING_UP')"
            " ON CONFLICT (slot_name) {}"
        ).format(schema.relay_state_ident(settings), conflict),
        (settings.slot_name,),
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
