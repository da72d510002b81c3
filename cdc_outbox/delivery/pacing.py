"""Latency that follows the load (pure, no I/O): when the relay has librdkafka send the
records it holds at once instead of after ``linger.ms``.

``linger.ms`` holds a partition's records so that the ones produced next join their batch;
that pays only while more are coming. Contract of :func:`send_now`: records waiting in
librdkafka are sent at once exactly when the relay produces no more for now: its last read
found nothing (caught up with the WAL) or it is not reading (the in-flight limit, a full
exactly-once batch, a polling batch awaiting its outcomes, shutdown). While it reads, records
linger and batch as configured, so batches grow with the load and only then.

The caller then serves reports with
:meth:`~cdc_outbox.kafka.publisher.KafkaPublisher.send_now` for as long as it would wait
anyway (librdkafka counts ``linger.ms`` as elapsed only during a flush call). The
exactly-once counterpart, a Kafka transaction that closes once the relay caught up, is
:meth:`~cdc_outbox.delivery.eos_batch.EosBatch.due`.
"""

from __future__ import annotations

__all__ = ["send_now"]


def send_now(waiting: int, *, caught_up: bool, reading: bool) -> bool:
    """Should the ``waiting`` records in librdkafka (queued or unacknowledged) go out now?"""
    return waiting > 0 and (caught_up or not reading)
