"""One active relay per slot among any number of ``cdc-outbox run`` processes.

Contract:
- Leader = holds the session advisory lock ``(lock_namespace(), hashtext(slot_name))`` on a
  dedicated autocommit connection AND has written its lease into the state row (``leader_id``,
  ``leader_pid``, ``lease_until = now() + leader_lease_s``); one statement does both.
- A daemon thread renews the lease every ``lease/5`` s, and at once when the server writes to
  or closes the idle connection. A failed renew, 0 rows or a broken connection: leadership is
  lost at once and the connection is closed (which frees the lock).
- Self-fencing: :meth:`Leadership.is_leader` is False once ``lease/2`` passed (monotonic clock)
  since the start of the last successful renew, so a stopped or partitioned leader stops before
  a standby may take over (at lease expiry). Callers check it before each side effect. A lapsed
  term is over for good: the renew thread ends it (closing the lock connection) instead of
  renewing, and the renew statement itself refuses an expired lease; only :meth:`acquire`
  starts a new term.
- With ``loop_stalled``, the lease follows the caller's main loop: a renew that finds it
  stalled ends the term, so a standby takes over from a leader whose loop hangs.
- A standby retries the lock every ``min(0.5, lease/5)`` s. When the holder's lease expired and
  its session did nothing for over half a lease (SIGSTOP, partition), the standby ends that
  session. Once leader, a walsender that started streaming the slot before this leadership is
  ended as soon as the previous lease has expired. Nothing else is touched.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors, sql
from psycopg.conninfo import conninfo_to_dict

from cdc_outbox.config.ha import LeadershipSection
from cdc_outbox.errors import CdcOutboxError, raise_if_cannot_heal
from cdc_outbox.ha.leadership_rules import (
    LeaseClock,
    connection_params,
    holder_is_stuck,
    lock_namespace,
)
from cdc_outbox.redaction import redact
from cdc_outbox.store.leases import lease_statements

__all__ = ["Leadership"]

logger = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]


class Leadership:
    """Leader election for ``section.slot_name`` (see the module contract). Thread-safe; one
    thread at a time calls :meth:`acquire`."""

    def __init__(
        self,
        section: LeadershipSection,
        state_table: sql.Identifier,
        instance_id: str | None = None,
        *,
        loop_stalled: Callable[[], str | None] | None = None,
    ) -> None:
        """``section``: :func:`cdc_outbox.config.ha.leadership_section`; ``state_table``: the
        relay state table (``schema.relay_state_ident(settings)``). ``loop_stalled()``: None
        while the leader's main loop turns, else why it is stalled (checked before each renew;
        a stalled loop ends the term)."""
        self._loop_stalled = loop_stalled
        self.instance_id = (
            instance_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        )
        self._section, self._lease = section, section.lease_s
        self._state_table = state_table
        self._args: dict[str, Any] = {
            "ns": lock_namespace(),
            "slot": section.slot_name,
            "me": self.instance_id,
            "lease": self._lease,
        }
        self._sql = lease_statements(state_table)
        self._fence = LeaseClock(self._lease / 2)
        self._conn_lock = threading.Lock()  # serializes use of the connection; taken first
        self._state_lock = threading.Lock()  # guards the fields below; held only briefly
        self._conn: Conn | None = None
        self._leader = False
        self._seen_leader: str | None = None
        self._stuck_for: float | None = None  # how long the holder's lease has been expired
        self._renew_stop = threading.Event()

    @property
    def role(self) -> str:
        return "leader" if self.is_leader() else "standby"

    def is_leader(self) -> bool:
        """True while the lock connection is up and the last renew began < lease/2 ago."""
        with self._state_lock:
            conn = self._conn
            return self._leader and conn is not None and not conn.closed and self._fence.valid()

    def describe(self) -> dict[str, object]:
        """Role, this instance and the leader last seen in the state table (no I/O)."""
        with self._state_lock:
            seen = self._seen_leader
        return {"role": self.role, "instance_id": self.instance_id, "leader_id": seen}

    def acquire(self, stop: threading.Event) -> bool:
        """Stand by until this instance is the leader (True) or ``stop`` is set (False).

        Survives the database being down (reconnects); raises :class:`CdcOutboxError` only if
        the state table is missing."""
        if self.is_leader():
            return True
        self._end_term()
        started, interval = time.monotonic(), min(0.5, self._lease / 5)
        last_error, seen = "", "?"
        while not stop.is_set():
            pause = interval
            try:
                with self._conn_lock:
                    if self._conn is None or self._conn.closed:
                        self._conn = self._connect()
                    if last_error:
                        self._log(logging.INFO, "database reachable again")
                        last_error = ""
                    if self._try_lock(self._conn, started):
                        return True
                    if self._seen_leader != seen:
                        seen = str(self._seen_leader)
                        self._log(logging.INFO, "standing by (leader %s)", seen)
                    if self._end_stuck_leader(self._conn):
                        pause = 0.05  # its backend is exiting: the lock is free in a moment
            except (errors.UndefinedTable, errors.InvalidSchemaName):
                self._close_conn()
                table = self._state_table.as_string(None)
                raise CdcOutboxError(
                    f"leader election: state table {table} is missing; run `cdc-outbox init`"
                ) from None
            except psycopg.Error as exc:
                self._close_conn()
                raise_if_cannot_heal(exc)
                if (message := self._redact(exc)) != last_error:
                    self._log(logging.WARNING, "%s; retrying", message)
                last_error = message
            stop.wait(pause)
        return False

    def release(self) -> None:
        """Give up: clear the leader columns, unlock, close the connection. Idempotent."""
        self._renew_stop.set()
        with self._conn_lock:
            with self._state_lock:
                conn, was_leader = self._conn, self._leader
                self._conn, self._leader = None, False
                self._fence.reset()
            if conn is None:
                return
            try:
                if was_leader:
                    conn.execute(self._sql["clear"], self._args)
                    conn.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error as exc:
                self._log(logging.WARNING, "release: %s", self._redact(exc))
            finally:
                conn.close()
        if was_leader:
            self._log(logging.INFO, "released")

    # -- internals ------------------------------------------------------------------------------

    def _try_lock(self, conn: Conn, started: float) -> bool:
        """One attempt (``_conn_lock`` held): lock + lease, else note the holder's state."""
        sent = time.monotonic()
        row = conn.execute(self._sql["acquire"], self._args).fetchone()
        assert row is not None
        got, server_now, prev_id, prev_until, prev_left, holder_idle = row
        with self._state_lock:
            self._seen_leader = self.instance_id if got else prev_id
            if got:
                self._leader = True
                self._fence.reset()  # a new term
                self._fence.renewed(sent)
        if not got:
            stuck = holder_is_stuck(prev_left, holder_idle, self._lease)
            self._stuck_for = -(prev_left or 0.0) if stuck else None
            return False
        waited = time.monotonic() - started
        self._log(logging.INFO, "became leader after %.2f s (previous %s)", waited, prev_id)
        pending = None
        if prev_until is not None and prev_left is not None:
            if prev_left < 0:
                self._end_old_walsender(conn, server_now)
            else:  # the previous leader may still be stopping: wait for its lease to expire
                pending = (time.monotonic() + prev_left + 0.05, server_now)
        self._renew_stop = threading.Event()
        args = (conn, self._renew_stop, pending)
        threading.Thread(target=self._renew, args=args, name="leader-renew", daemon=True).start()
        return True

    def _end_stuck_leader(self, conn: Conn) -> bool:
        expired_for, self._stuck_for = self._stuck_for, None
        if expired_for is None:
            return False
        rows = conn.execute(self._sql["end_stuck"], self._args).fetchall()
        for pid, _ in rows:
            self._log(
                logging.WARNING,
                "lease expired %.1f s ago: ended stuck leader backend %s",
                expired_for,
                pid,
            )
        return any(ended for _, ended in rows)

    def _end_old_walsender(self, conn: Conn, since: datetime) -> None:
        for pid, _ in conn.execute(self._sql["end_walsender"], {**self._args, "since": since}):
            self._log(logging.WARNING, "ended walsender %s of an expired leader", pid)

    def _renew(
        self, conn: Conn, stop: threading.Event, pending: tuple[float, datetime] | None
    ) -> None:
        """Renew thread of one term; ``pending``: (when, since) to end an old walsender."""
        interval = self._lease / 5
        next_renew = time.monotonic() + interval
        while not stop.is_set():
            try:
                self._wait(conn, next_renew, stop)
                with self._conn_lock:
                    if stop.is_set() or conn is not self._conn:
                        return
                    with self._state_lock:
                        lapsed = not self._fence.valid()
                    stalled = self._loop_stalled() if self._loop_stalled is not None else None
                    if lapsed or stalled is not None:
                        lapse = f"the lease lapsed (no renew for over {self._lease / 2:g} s)"
                        self._lose(conn, stalled or lapse)
                        return
                    sent = time.monotonic()
                    if conn.execute(self._sql["renew"], self._args).rowcount != 1:
                        self._lose(conn, "the state row's lease expired or names another leader")
                        return
                    with self._state_lock:
                        self._fence.renewed(sent)
                    if pending is not None and time.monotonic() >= pending[0]:
                        self._end_old_walsender(conn, pending[1])
                        pending = None
            except (psycopg.Error, OSError, ValueError) as exc:
                with self._conn_lock:
                    if conn is self._conn and not stop.is_set():
                        self._lose(conn, self._redact(exc))
                return
            next_renew = max(sent + interval, time.monotonic() + 0.02)

    @staticmethod
    def _wait(conn: Conn, until: float, stop: threading.Event) -> None:
        """Sleep until ``until`` (monotonic) or the server writes to or closes ``conn``. Short
        slices: a sleep interrupted by SIGSTOP resumes with its remaining time, not at ``until``."""
        fd = conn.fileno()
        while (left := until - time.monotonic()) > 0 and not stop.is_set():
            if select.select([fd], [], [], min(left, 0.1))[0]:
                return

    def _lose(self, conn: Conn, reason: str) -> None:
        """Leadership ended (``_conn_lock`` held): not leader from now on; close the lock."""
        with self._state_lock:
            self._leader, self._conn = False, None
            self._fence.reset()
        conn.close()
        self._log(logging.WARNING, "lost leadership: %s", reason)

    def _end_term(self) -> None:
        """Before standing by again: stop the renew thread; close a fenced term's lock."""
        self._renew_stop.set()
        with self._conn_lock, self._state_lock:
            conn, was_leader = self._conn, self._leader
            if was_leader:
                self._conn, self._leader = None, False
                self._fence.reset()
        if was_leader and conn is not None:
            conn.close()
            self._log(logging.WARNING, "lease not renewed in time: gave up leadership")

    def _close_conn(self) -> None:
        with self._state_lock:
            conn, self._conn, self._leader = self._conn, None, False
        if conn is not None:
            conn.close()

    def _connect(self) -> Conn:
        dsn = self._section.database.postgres_dsn()
        params = connection_params(self._lease, conninfo_to_dict(dsn), self._section.slot_name)
        conn = psycopg.connect(dsn, autocommit=True, **params)
        conn.execute(  # the server notices a dead peer too; a renew never blocks past lease/2
            "SELECT set_config('tcp_keepalives_idle', '2', false),"
            " set_config('tcp_keepalives_interval', '1', false),"
            " set_config('tcp_keepalives_count', '3', false),"
            " set_config('tcp_user_timeout', %(ms)s, false),"
            " set_config('statement_timeout', %(ms)s, false),"
            " set_config('idle_session_timeout', '0', false)",
            {"ms": str(params["tcp_user_timeout"])},
        )
        return conn

    def _log(self, level: int, message: str, *args: object) -> None:
        logger.log(level, "leader election (slot %s): " + message, self._section.slot_name, *args)

    def _redact(self, exc: BaseException) -> str:
        message = " ".join(str(exc).split()) or type(exc).__name__
        return redact(message, self._section.database.secret_values())
