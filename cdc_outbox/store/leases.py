"""The statements of leadership on the relay state table (issue 35: ``store/`` builds every
statement on the outbox database's own tables; moved here from ``ha/leadership.py``, which
runs them and states the contract; the text is unchanged).

- ``acquire``: take the session advisory lock ``(ns, hashtext(slot))`` and, if it was got,
  write this instance's lease into the slot's state row, in one statement; returns whether
  the lock was got, ``now()``, the previous leader and lease (and seconds left of it), and
  how long the lock's current holder has been idle (NULL: none).
- ``end_stuck``: end the holder's session if its lease expired and it was idle for over half
  a lease (re-checked in the statement).
- ``end_walsender``: end a walsender streaming the slot since before ``since``.
- ``renew``: extend our lease, only while the row names us and the lease is not over.
- ``clear``: remove our lease.
- :func:`drop_slot_if_leader`: drop the slot if it exists, is not in use and the leader
  still holds the lease, checked in the same statement.
"""

from __future__ import annotations

from psycopg import sql

__all__ = ["drop_slot_if_leader", "lease_statements"]

_HOLDER = sql.SQL(
    "SELECT l.pid, a.state_change FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid)"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
    " AND l.pid <> pg_backend_pid()"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid = (%(ns)s::bigint & 4294967295)::oid"
    " AND l.objid = (hashtext(%(slot)s)::bigint & 4294967295)::oid"
)
_SQL: dict[str, sql.SQL] = {
    # lock + lease in one statement: a standby never sees the lock held without a fresh lease
    "acquire": sql.SQL(
        "WITH lk AS (SELECT pg_try_advisory_lock(%(ns)s, hashtext(%(slot)s)) AS got),"
        " prev AS (SELECT leader_id, lease_until FROM {t} WHERE slot_name = %(slot)s),"
        " up AS (INSERT INTO {t} (slot_name, leader_id, leader_pid, lease_until)"
        " SELECT %(slot)s, %(me)s, pg_backend_pid(), {lease} FROM lk WHERE lk.got"
        " ON CONFLICT (slot_name) DO UPDATE SET leader_id = excluded.leader_id,"
        " leader_pid = excluded.leader_pid, lease_until = excluded.lease_until RETURNING 1)"
        " SELECT (SELECT got FROM lk), now(), (SELECT leader_id FROM prev),"
        " (SELECT lease_until FROM prev),"
        " (SELECT extract(epoch FROM lease_until - now())::float8 FROM prev),"
        " extract(epoch FROM now() - h.state_change)::float8"
        " FROM (SELECT 1) one LEFT JOIN ({holder}) h ON true"
    ),
    # conditions re-checked here (WHERE runs before the select list): lease expired, idle
    "end_stuck": sql.SQL(
        "SELECT h.pid, pg_terminate_backend(h.pid) FROM ({holder}) h"
        " WHERE coalesce(h.state_change < now() - make_interval(secs => %(lease)s / 2), true)"
        " AND NOT EXISTS (SELECT 1 FROM {t} WHERE slot_name = %(slot)s AND lease_until >= now())"
    ),
    "end_walsender": sql.SQL(
        "SELECT r.active_pid, pg_terminate_backend(r.active_pid)"
        " FROM pg_replication_slots r JOIN pg_stat_activity a ON a.pid = r.active_pid"
        " WHERE r.slot_name = %(slot)s AND coalesce(a.query_start, a.backend_start) < %(since)s"
    ),
    # never revives a lapsed lease: the row must still name us and its lease must not be over
    "renew": sql.SQL(
        "UPDATE {t} SET lease_until = {lease} WHERE slot_name = %(slot)s AND leader_id = %(me)s"
        " AND lease_until >= now()"
    ),
    "clear": sql.SQL(
        "UPDATE {t} SET leader_id = NULL, leader_pid = NULL, lease_until = NULL"
        " WHERE slot_name = %(slot)s AND leader_id = %(me)s"
    ),
}


def lease_statements(table: sql.Identifier) -> dict[str, sql.Composed]:
    """The statements of a leadership on the relay state table ``table``, by name (see the
    module doc); parameters ``%(ns)s``, ``%(slot)s``, ``%(me)s``, ``%(lease)s`` (seconds) and,
    for ``end_walsender``, ``%(since)s``."""
    lease = sql.SQL("now() + make_interval(secs => %(lease)s)")
    return {name: text.format(t=table, lease=lease, holder=_HOLDER) for name, text in _SQL.items()}


def drop_slot_if_leader(
    state_table: sql.Identifier, slot_name: str, leader_id: str
) -> sql.Composed:
    """Drop the slot ``slot_name`` if it exists, is not active and ``leader_id`` holds a
    lease that has not expired in the relay state table ``state_table`` (one statement: a
    frozen ex-leader never drops its successor's slot)."""
    return sql.SQL(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
        " WHERE slot_name = {slot} AND NOT active AND EXISTS (SELECT 1 FROM {state}"
        " WHERE slot_name = {slot} AND leader_id = {leader} AND lease_until > now())"
    ).format(
        slot=sql.Literal(slot_name),
        state=state_table,
        leader=sql.Literal(leader_id),
    )
