"""Latency that follows the load (pure, no I/O): when the relay has librdkafka send the
records it holds at once instead of after ``linger.ms``.

``linger.ms`` holds a partition's records so that the ones produced next join their batch;
that pays only while more are coming. Contract:

- :func:`caught_up`: the relay has caught up with the WAL when a read found nothing *and* the
  last transaction it read committed at most ``BEHIND_S`` ago (its commit timestamp against
  the relay's clock). Further behind, the server still holds a backlog for it: an empty read
  is a pause of the stream (the walsender decoding), not its end, and batching pays.
- :func:`send_now`: records waiting in librdkafka are sent at once exactly when the relay
  produces no more for now: it caught up, or it is not reading. While it reads, records
  linger and batch as configured, so batches grow with the load and only then. The wiring:
  a read turn that ends caught up (``MessageRouter.read_turn``) and shutdown
  (``relay_finish``); at the in-flight limit the relay polls as before (batches are full
  there, and a flush would hold it until every record is acknowledged); the polling relay
  lingers as configured.

- :class:`Linger`: while transactions keep coming one after another (the last
  ``BUSY_SENDS`` sends of caught-up records each began less than ``BUSY_S`` after the one
  before ended: a sustained load, hundreds of transactions/s or more), records a caught-up
  read leaves waiting are held ``LINGER_S`` for the transactions that follow, then sent
  together; otherwise (a lone transaction, e.g. 20 transactions/s) they go out at once. Only
  reads that end between transactions count and are held: a read that ends inside one (a
  large transaction's frames arriving in parts) sends what it has at once. The hold never
  exceeds the producer's ``linger.ms`` (``linger.ms=0``: never held). Per
  send of a caught-up relay librdkafka makes a produce request and a round of wake-ups of its
  threads and the relay's: sent one by one at 2,000 single-row transactions/s that cost
  ~10x the CPU per event of 100-row transactions (issue 38). At-least-once only (the wiring:
  ``MessageRouter.read_turn``, one hold per read turn); exactly-once batches per Kafka
  transaction instead.

The caller then serves reports with
:meth:`~cdc_outbox.kafka.publisher.KafkaPublisher.send_now` for as long as it would wait
anyway (librdkafka counts ``linger.ms`` as elapsed only during a flush call). The
exactly-once counterpart, a Kafka transaction that closes once the relay caught up, is
:meth:`~cdc_outbox.cdc.eos_batch.EosBatch.due`.
"""

from __future__ import annotations

__all__ = ["BEHIND_S", "BUSY_S", "BUSY_SENDS", "LINGER_S", "Linger", "caught_up", "send_now"]

#: Lag (seconds from the commit of the last transaction read) past which the relay is behind.
BEHIND_S = 0.25
#: How long records of a busy caught-up relay wait for the transactions that follow (the
#: latency it adds, at most, to an event at such a load).
LINGER_S = 0.010
#: Sends of caught-up records less than ``BUSY_S`` apart, ``BUSY_SENDS`` in a row: busy.
BUSY_S = 0.005
BUSY_SENDS = 2


def caught_up(read_empty: bool, lag_s: float) -> bool:
    """Has the relay caught up with the WAL (see the module contract)? ``lag_s``: now minus
    the commit time of the last transaction read (0 if none or unknown)."""
    return read_empty and lag_s <= BEHIND_S


def send_now(waiting: int, *, caught_up: bool, reading: bool) -> bool:
    """Should the ``waiting`` records in librdkafka (queued or unacknowledged) go out now?"""
    return waiting > 0 and (caught_up or not reading)


class Linger:
    """Whether records a caught-up read leaves waiting are held (see the module contract).
    Times are ``time.monotonic()`` seconds."""

    def __init__(self) -> None:
        self._last_sent = float("-inf")
        self._streak = 0  # sends in a row, each less than BUSY_S after the one before

    def hold_s(self, now: float) -> float:
        """Seconds to hold the records waiting at a caught-up read before sending them:
        ``LINGER_S`` while busy, else 0. Asked once per send, :meth:`sent` once it is done."""
        self._streak = self._streak + 1 if now - self._last_sent < BUSY_S else 0
        return LINGER_S if self._streak >= BUSY_SENDS else 0.0

    def sent(self, now: float) -> None:
        """The records went out (the send ended at ``now``)."""
        self._last_sent = now
