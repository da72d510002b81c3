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

The caller then serves reports with
:meth:`~cdc_outbox.kafka.publisher.KafkaPublisher.send_now` for as long as it would wait
anyway (librdkafka counts ``linger.ms`` as elapsed only during a flush call). The
exactly-once counterpart, a Kafka transaction that closes once the relay caught up, is
:meth:`~cdc_outbox.cdc.eos_batch.EosBatch.due`.
"""

from __future__ import annotations

__all__ = ["BEHIND_S", "caught_up", "send_now"]

#: Lag (seconds from the commit of the last transaction read) past which the relay is behind.
BEHIND_S = 0.25


def caught_up(read_empty: bool, lag_s: float) -> bool:
    """Has the relay caught up with the WAL (see the module contract)? ``lag_s``: now minus
    the commit time of the last transaction read (0 if none or unknown)."""
    return read_empty and lag_s <= BEHIND_S


def send_now(waiting: int, *, caught_up: bool, reading: bool) -> bool:
    """Should the ``waiting`` records in librdkafka (queued or unacknowledged) go out now?"""
    return waiting > 0 and (caught_up or not reading)
