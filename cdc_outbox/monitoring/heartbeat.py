"""Heartbeat: a transactional ``pg_logical_emit_message`` every ``heartbeat_interval_s``.

For servers where the outbox database is idle while other databases write WAL: each heartbeat
is a small committed transaction in the outbox database, so the slot sees a commit of its own
to confirm. ``pg_logical_emit_message`` needs no privilege beyond connecting (it is executable
by PUBLIC), so the least-privilege relay role suffices. The relay receives the message and
ignores it (counted in ``ignored_messages_total{kind="message"}``).

A failing heartbeat never affects the stream: it counts in ``errors``, logs a warning and is
retried at the next interval (logged at most once a minute). Each heartbeat borrows a
connection from :mod:`cdc_outbox.store.db_pool`.
"""

from __future__ import annotations

import json
import logging
import time

from cdc_outbox.config.monitoring import HeartbeatSection
from cdc_outbox.monitoring.background import BackgroundLoop
from cdc_outbox.monitoring.lag import one_line
from cdc_outbox.store import db_pool

logger = logging.getLogger(__name__)

#: Prefix of the heartbeat's logical decoding message.
HEARTBEAT_PREFIX = "cdc_outbox.heartbeat"
_ERROR_LOG_INTERVAL_S = 60.0


class Heartbeat(BackgroundLoop):
    """Background heartbeat writer; counters are plain ints read by the metrics collector."""

    thread_name = "heartbeat"

    def __init__(self, section: HeartbeatSection) -> None:
        """``section``: :func:`cdc_outbox.config.monitoring.heartbeat_section`."""
        self.section = section
        self.interval_s = section.interval_s
        self.sent = 0
        self.errors = 0
        self.last_success_unix = 0.0
        self.last_error: str | None = None
        self._last_error_log = float("-inf")
        super().__init__()

    def counts(self) -> tuple[int, int]:
        """(heartbeats committed, heartbeats failed)."""
        return self.sent, self.errors

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def beat(self) -> bool:
        """Commit one heartbeat now; ``False`` (counted, logged) if it failed. Never raises."""
        try:
            now = time.time()
            content = json.dumps({"unix": round(now, 3), "slot": self.section.slot_name})
            # pooled() with a statement timeout lends the connection inside a transaction.
            with db_pool.pooled(
                self.section.database, timeout=5.0, statement_timeout_s=5.0
            ) as conn:
                conn.execute(
                    "SELECT pg_logical_emit_message(true, %s, %s)", (HEARTBEAT_PREFIX, content)
                )
        except Exception as exc:
            self.errors += 1
            self.last_error = one_line(exc, self.section.database)
            if time.monotonic() - self._last_error_log >= _ERROR_LOG_INTERVAL_S:
                self._last_error_log = time.monotonic()
                logger.warning("heartbeat failed (the stream goes on): %s", self.last_error)
            return False
        self.sent += 1
        self.last_success_unix = now
        if self.last_error is not None:
            logger.info("heartbeat recovered")
            self.last_error = None
            self._last_error_log = float("-inf")
        return True
