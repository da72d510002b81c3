"""Checkpointing: report positions to the server so the slot's ``confirmed_flush_lsn`` moves.

Contract: the flushed position sent is the ledger's :meth:`~cdc_outbox.cdc.ledger.Ledger.
confirmable` and never decreases (PostgreSQL 15 would move a slot backwards if told a smaller
value); written >= flushed. It begins at what the slot has confirmed (``confirmed``), not
at the session's start, which a restarted session may remember past it: that start is kept
and marked like any other position before it is confirmed.
Updates go out on a timer (``status_interval_s``, well inside ``wal_sender_timeout``, also
while Kafka is down) and, at most five times a second, when the confirmed position
advanced (a smaller unconfirmed window means fewer duplicates after a crash). A position is
handed to ``keep`` (the relay: :func:`cdc_outbox.store.relay_state.keep_position`) before it is
first sent, so it survives a PostgreSQL crash, which may take the slot's own back; while
``keep`` answers False the position is not sent (persisted before it takes effect). With a
published-marker (``marker``), a position is confirmed only once every event up to it is
marked published (:class:`~cdc_outbox.cdc.ledger.MarkedWatermark`): a crash then
re-streams any row still unmarked, so none is left PENDING for a later polling pass or
catch-up to publish again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cdc_outbox.cdc.ledger import Ledger
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.cdc.relay_ports import ReplicationPort
from cdc_outbox.telemetry.relay_stats import RelayStats

MIN_CONFIRM_INTERVAL_S = 0.2


class Checkpointer:
    """Sends standby status updates for one streaming session."""

    def __init__(
        self,
        stream: ReplicationPort,
        ledger: Ledger,
        stats: RelayStats,
        *,
        start: int,
        confirmed: int | None = None,
        interval_s: float,
        keep: Callable[[int], bool] = lambda lsn: True,
        marker: PublishedMarker | None = None,
    ) -> None:
        self._marker = marker
        self._keep = keep
        self._stream = stream
        self._ledger = ledger
        self._stats = stats
        self._interval_s = interval_s
        self.written = start
        # What the slot has confirmed (default ``start``): a restarted session streams from a
        # position remembered in memory, which goes out only once kept (and marked).
        self.sent_flush = start if confirmed is None else min(confirmed, start)
        self._last_sent = 0.0

    def confirmable(self) -> int:
        """The ledger's confirmable position (capped by marking with a marker)."""
        marker = self._marker
        if marker is None:
            return self._ledger.confirmable()
        return self._ledger.confirmable(marker.handed, marker.settled)

    def note_written(self, lsn: int) -> None:
        """A position received from the server (keepalive WAL end, commit end)."""
        if lsn > self.written:
            self.written = lsn

    def maybe_send(self) -> None:
        """Send an update if the timer is due or the confirmed position moved (rate-limited)."""
        since = time.monotonic() - self._last_sent
        if since >= self._interval_s or (
            self.confirmable() > self.sent_flush and since >= MIN_CONFIRM_INTERVAL_S
        ):
            self.send()

    def send(self, *, reply_requested: bool = False) -> None:
        """Send an update now."""
        flushed = max(self.confirmable(), self.sent_flush)
        if flushed > self.sent_flush and not self._keep(flushed):
            flushed = self.sent_flush  # not persisted: not confirmed either (tried again later)
        self._stream.send_status(
            max(self.written, flushed), flushed, reply_requested=reply_requested
        )
        self._last_sent = time.monotonic()
        if flushed > self.sent_flush:
            self.sent_flush = flushed
            self._stats.confirmed_lsn = flushed
            self._stats.last_confirm_unix = time.time()
