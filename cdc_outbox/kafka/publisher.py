"""The relay's Kafka producer. Only the :mod:`cdc_outbox.kafka` package imports confluent-kafka
(this module; :mod:`cdc_outbox.kafka.checkpoints`, the exactly-once checkpoint topic;
:mod:`cdc_outbox.kafka.consumer`, the consumer's side; :mod:`cdc_outbox.kafka.probe`, the
readiness check; :mod:`cdc_outbox.kafka.producer_config`, the producer's settings and their
start-up check; a unit test checks it).

Reading topics back (demo, tests, benchmarks) is ``cdc_outbox_dev.readback``, not shipped.

Contract:
- The producer is idempotent with ``acks=all``; per partition, records are written in
  ``produce`` order and retried without reordering. With ``gapless=True`` (the ``halt``
  policy) librdkafka's ``enable.gapless.guarantee`` turns any failure that would leave a gap
  into a fatal error, so nothing produced after a failed record is written.
- A record counts as delivered only when its delivery report arrives without error; the
  listener bound to it is then told ``delivered()``. Every failure reaches ``failed()`` with a
  :class:`~cdc_outbox.kafka.delivery_failure.DeliveryFailure` whose ``kind`` is the one
  classification's verdict on the Kafka error (:func:`cdc_outbox.errors.classify` of
  :func:`~cdc_outbox.kafka.delivery_failure.describe`): ``DEAD_LETTER`` (this record
  can never be written: too large, invalid; the only kind that may be dead-lettered) or
  ``RETRY`` (topic missing, not authorised, broker trouble: retry with backoff, never a dead
  letter; ``alert`` names the problem; ``producer_fatal``: make a new producer and re-send).
- :meth:`KafkaPublisher.produce` is the one produce loop: it waits while the local queue is
  full (serving delivery reports and calling ``idle``), and stops waiting with
  :class:`ProduceInterrupted` as soon as ``interrupted()`` gives a reason. An error raised by
  librdkafka's ``produce`` (other than a full queue) is reported to the listener, never raised.
- Delivery reports are only served from :meth:`KafkaPublisher.poll` / :meth:`flush`, on the
  caller's thread.
- Transactional (``transactional_id`` given, exactly-once delivery): :meth:`init_transactions`
  once (it fences any older producer with the same id and aborts its open transaction), then
  :meth:`begin` / :meth:`commit` / :meth:`abort`. A delivery report then means "written inside
  the open transaction", not "visible": only a successful :meth:`commit` makes records visible
  to ``read_committed`` consumers. Every transaction call raises :class:`TransactionFailed`.
  Between :meth:`defer` and the :meth:`release` that follows the next :meth:`commit`,
  :meth:`produce` only queues records in this process, in order, for the next transaction:
  the caller keeps working while the open transaction's records are acknowledged.
  :meth:`abort` and :meth:`close` drop them with the transaction.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.delivery_failure import (
    DeliveryListener,
    Headers,
    ReportingListener,
    TxnOutcome,
    failure_of,
)
from cdc_outbox.kafka.librdkafka_log import QuietLibrdkafkaLog
from cdc_outbox.kafka.producer_config import config_error_line, linger_s, producer_config
from cdc_outbox.redaction import redact_kafka_config

logger = logging.getLogger(__name__)


class TransactionFailed(Exception):
    """A Kafka transaction call failed. ``fatal``: the producer is unusable (fenced by a newer
    instance with the same ``transactional.id``, or another fatal error): make a new one.
    ``abortable``: abort the transaction and re-send. Otherwise retriable (e.g. a timeout)."""

    def __init__(self, reason: str, *, fatal: bool, abortable: bool) -> None:
        super().__init__(reason)
        self.fatal = fatal
        self.abortable = abortable


class ProduceInterrupted(Exception):
    """:meth:`KafkaPublisher.produce` stopped waiting for queue space; the record was not
    queued. ``args[0]`` is the reason ``interrupted()`` gave (stop, halt, restart)."""


class _DeliveryReport:
    """Delivery callback of one record (of a listener that is not a
    :class:`~cdc_outbox.kafka.delivery_failure.ReportingListener`). confluent-kafka's reports
    carry no headers, so the record's headers are kept here until the outcome is known (for
    dead-lettering)."""

    __slots__ = ("headers", "listener")

    def __init__(self, listener: DeliveryListener, headers: Headers) -> None:
        self.listener = listener
        self.headers = headers

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.listener.delivered(msg.topic() or "", self.headers)
        else:
            self.listener.failed(failure_of(err, msg.topic(), msg.key(), msg.value(), self.headers))


class ProducerClient(Protocol):
    """What :class:`KafkaPublisher` uses of ``confluent_kafka.Producer`` (a test passes a
    fake of it through ``client``; delivery reports are called from ``poll``/``flush``)."""

    def produce(
        self, topic: str, value: bytes | None, key: bytes | None, *, headers: Any, on_delivery: Any
    ) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...

    def purge(self, *, in_queue: bool, in_flight: bool, blocking: bool) -> None: ...

    def __len__(self) -> int: ...

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(self, timeout: float) -> None: ...

    def abort_transaction(self, timeout: float) -> None: ...

    def list_topics(self, *, timeout: float) -> Any: ...


#: Builds the client from the merged librdkafka configuration.
ProducerFactory = Callable[[dict[str, Any]], ProducerClient]


class KafkaPublisher:
    """An idempotent Kafka producer with per-record delivery listeners."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        gapless: bool = False,
        transactional_id: str | None = None,
        client: ProducerFactory | None = None,
    ) -> None:
        merged, required = producer_config(config, gapless, transactional_id)
        self.transactional = transactional_id is not None
        #: The producer's ``linger.ms`` in seconds: how long its records may wait for a batch.
        self.linger_s = linger_s(merged)
        #: Records produced in the open transaction (transactional only).
        self.txn_records = 0
        #: The open transaction (transactional only), stamped on each ReportingListener.
        self._txn: TxnOutcome | None = None
        #: Records held for the next transaction while the open one commits (see :meth:`defer`).
        self._deferred: deque[tuple[str, bytes | None, bytes | None, Headers, Any]] | None = None
        for key, value in required.items():
            if str(config.get(key, value)).lower() != value:
                logger.warning("kafka setting %s=%s overridden to %s", key, config[key], value)
        merged["error_cb"] = self._on_error
        self.fatal_error: str | None = None
        self._last_error_log = 0.0
        logger.debug("kafka producer config: %s", redact_kafka_config(merged))
        if client is not None:
            self._producer: ProducerClient = client(merged)
            return
        try:
            self._producer = Producer(merged, logger=QuietLibrdkafkaLog())
        except (KafkaException, TypeError, ValueError) as exc:
            raise ConfigError(config_error_line(config, exc)) from None

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        listener: DeliveryListener,
        *,
        interrupted: Callable[[], str | None] = lambda: None,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        """Queue one record; its outcome goes to ``listener`` (see the module contract).

        While the local queue is full: serve delivery reports, call ``idle()`` (e.g. keep a
        replication connection alive) and raise :class:`ProduceInterrupted` once
        ``interrupted()`` returns a reason."""
        if self._deferred is not None:
            self._deferred.append((topic, key, value, headers, listener))
            return
        if isinstance(listener, ReportingListener):
            listener.headers = headers
            listener.txn = self._txn
            report: Any = listener
        else:
            if hasattr(listener, "txn"):  # a wrapper (a tracing span) of a ReportingListener
                setattr(listener, "txn", self._txn)  # noqa: B010 (not in the protocol)
            report = _DeliveryReport(listener, headers)
        produce = self._producer.produce
        while True:
            try:
                produce(topic, value, key, headers=headers, on_delivery=report)
                self.txn_records += 1
                return
            except BufferError:
                self.poll(0.05)
                idle()
                reason = interrupted()
                if reason is not None:
                    raise ProduceInterrupted(reason) from None
            except KafkaException as exc:
                listener.failed(failure_of(exc.args[0], topic, key, value, headers))
                return

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served. A fatal error (e.g. a fenced
        transactional producer) is not raised: it is in :attr:`fatal_error`."""
        try:
            return int(self._producer.poll(timeout))
        except (KafkaException, SystemError) as exc:
            self._note_fatal(exc)
            return 0

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for all queued records; returns how many are left."""
        try:
            return int(self._producer.flush(timeout))
        except (KafkaException, SystemError) as exc:
            self._note_fatal(exc)
            return len(self._producer)

    def send_now(self, timeout: float) -> int:
        """Serve delivery reports for up to ``timeout`` s (less once every record is
        acknowledged) while librdkafka sends what it holds at once, ``linger.ms`` counting as
        elapsed; returns how many records are left. That holds only during the call (it is
        librdkafka's flush: a flag raised for the call's duration, and a wake-up of the broker
        threads): call it for the whole time you would wait for reports anyway, not for an
        instant, and again while waiting goes on."""
        return self.flush(timeout)

    def _note_fatal(self, exc: KafkaException | SystemError) -> None:
        """A fatal error raised by a call that serves reports. confluent-kafka 2.x raises a
        ``SystemError`` instead of the fatal ``KafkaException`` from ``flush`` on a fenced
        producer (measured with 2.16.1): the producer is unusable either way."""
        if self.fatal_error is None:
            if isinstance(exc, KafkaException):
                self.fatal_error = exc.args[0].str()
            else:
                self.fatal_error = f"producer failed ({type(exc).__name__}: {exc})"

    def purge(self) -> None:
        """Drop queued records; their listeners get transient failures on the next poll. A
        fatal error is not raised (see :meth:`poll`)."""
        try:
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        except (KafkaException, SystemError) as exc:
            self._note_fatal(exc)
        self.poll(0)

    def __len__(self) -> int:
        """Records queued or in flight (deferred ones included)."""
        return len(self._producer) + (len(self._deferred) if self._deferred is not None else 0)

    @property
    def unacknowledged(self) -> int:
        """Records in librdkafka (queued, in flight or with a report not yet served): those of
        the open transaction while :meth:`defer` holds the next one's back."""
        return len(self._producer)

    def close(self, timeout: float = 5.0) -> int:
        """Flush what can be flushed within ``timeout``; returns records left undelivered
        (deferred ones are dropped)."""
        self._deferred = None
        left = self.flush(timeout)
        if left:
            self.purge()
        return left

    # -- transactions (exactly-once delivery) ---------------------------------------------

    def init_transactions(self, timeout: float) -> None:
        """Register the ``transactional.id`` (fencing older producers with it) and begin."""
        self._txn_call(self._producer.init_transactions, timeout)
        self.begin()

    def begin(self) -> None:
        """Open the next transaction (local: the broker learns of it at the first record)."""
        self._txn_call(self._producer.begin_transaction)
        self.txn_records = 0
        self._txn = TxnOutcome()

    def commit(self, timeout: float) -> None:
        """Flush and commit the open transaction (retried while retriable, up to ``timeout``),
        then begin the next one."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._txn_call(
                    self._producer.commit_transaction, max(0.1, deadline - time.monotonic())
                )
                break
            except TransactionFailed as exc:
                if exc.fatal or exc.abortable or time.monotonic() >= deadline:
                    raise
        if self._txn is not None:
            self._txn.committed = True
        self.begin()

    def defer(self) -> None:
        """From now on, :meth:`produce` holds records back for the next transaction."""
        if not self.transactional:
            raise RuntimeError("only a transactional producer defers records")
        if self._deferred is None:
            self._deferred = deque()

    @property
    def deferring(self) -> bool:
        return self._deferred is not None

    def release(
        self,
        *,
        interrupted: Callable[[], str | None] = lambda: None,
        idle: Callable[[], None] = lambda: None,
    ) -> None:
        """Produce the deferred records, in order, into the open transaction and stop
        deferring. Raises :class:`ProduceInterrupted` (the produce loop's rule) with the rest
        still deferred, ahead of anything produced later."""
        pending = self._deferred
        if pending is None:
            return
        self._deferred = None
        try:
            while pending:
                topic, key, value, headers, listener = pending[0]
                self.produce(
                    topic, key, value, headers, listener, interrupted=interrupted, idle=idle
                )
                pending.popleft()
        except ProduceInterrupted:
            self._deferred = pending
            raise

    def abort(self, timeout: float) -> None:
        """Drop queued (and deferred) records and abort the open transaction, then begin the
        next one."""
        self._deferred = None
        self.purge()  # a fenced producer's fatal error surfaces in the abort below
        self._txn_call(self._producer.abort_transaction, timeout)
        self.begin()

    def _txn_call(self, call: Callable[..., None], *args: float) -> None:
        try:
            call(*args)
        except SystemError as exc:  # see _note_fatal
            self._note_fatal(exc)
            raise TransactionFailed(
                f"producer failed: {exc}", fatal=True, abortable=False
            ) from None
        except KafkaException as exc:
            err = exc.args[0]
            fatal = bool(err.fatal()) or err.code() in (KafkaError._FENCED, KafkaError._FATAL)
            if fatal and self.fatal_error is None:
                self.fatal_error = err.str()
            raise TransactionFailed(
                f"{err.name()}: {err.str()}",
                fatal=fatal,
                abortable=bool(err.txn_requires_abort()),
            ) from None

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal_error = err.str()
            logger.error("kafka producer fatal error: %s", err.str())
            return
        now = time.monotonic()
        if now - self._last_error_log > 10.0:
            self._last_error_log = now
            logger.warning("kafka: %s", err.str())
