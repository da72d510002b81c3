"""What Kafka says about one record: the outcome interface and Kafka's error-code table.

A delivery report is either ``delivered`` or ``failed`` with a :class:`DeliveryFailure`.
:func:`describe` reads librdkafka's error code into a neutral
:class:`~cdc_outbox.errors.Failure` (the record's fault, or a problem name), and the one
classification, :func:`cdc_outbox.errors.classify`, decides on it: the failure's ``kind`` is
``DEAD_LETTER`` (never writable: the only dead-letter case) or ``RETRY`` (retry with backoff,
``alert``, the verdict's hint, names the problem; :attr:`DeliveryFailure.producer_fatal` when
the producer is unusable and must be replaced first). Kafka never says ``HALT``: the delivery
policy halts on a ``DEAD_LETTER`` with ``on_permanent_error = "halt"``. Pure: only
librdkafka's error codes are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError

from cdc_outbox.errors import Failure, FailureClass, Fault, classify

__all__ = [
    "PRODUCER_FATAL",
    "DeliveryFailure",
    "DeliveryListener",
    "Headers",
    "ReportingListener",
    "describe",
    "failure_of",
]

Headers = list[tuple[str, bytes]]

#: Record-level rejections: this record can never be written (the only dead-letter cases).
_RECORD_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,  # invalid topic name (derived from the row)
        KafkaError._INVALID_ARG,
    }
)
#: Topic-level problems someone must fix; retried (never dead-lettered) and alerted.
_ALERTS = {
    KafkaError.UNKNOWN_TOPIC_OR_PART: "topic_missing",
    KafkaError._UNKNOWN_TOPIC: "topic_missing",
    KafkaError._UNKNOWN_PARTITION: "topic_missing",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "not_authorized",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "not_authorized",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "not_authorized",
    KafkaError.POLICY_VIOLATION: "policy_violation",
}
#: The ``alert`` of a producer that is unusable (fatal error, fenced): replaced, then retried.
PRODUCER_FATAL = "producer_fatal"


@dataclass(frozen=True, slots=True)
class DeliveryFailure:
    """Why a record was not written, with the record itself (for dead-lettering)."""

    code: int
    name: str
    reason: str
    kind: FailureClass
    alert: str | None
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers

    @property
    def producer_fatal(self) -> bool:
        """The producer is unusable: replace it before retrying."""
        return self.alert == PRODUCER_FATAL


class DeliveryListener(Protocol):
    """Receives the outcome of each record produced with it."""

    def delivered(self, topic: str, headers: Headers) -> None: ...

    def failed(self, failure: DeliveryFailure) -> None: ...


class TxnOutcome:
    """One Kafka transaction of a transactional producer: ``committed`` once its commit
    succeeded (every record in it is then delivered, reported or not)."""

    __slots__ = ("committed",)

    def __init__(self) -> None:
        self.committed = False


class ReportingListener:
    """A listener that is its record's delivery callback itself, so the producer wraps it in
    nothing (one object less per record on the hot path): a subclass defines ``delivered``
    and ``failed`` (:class:`DeliveryListener`); ``headers`` and ``txn`` (the transaction the
    record went into, ``None`` without one) are set when the record is produced. One record
    per listener object."""

    __slots__ = ("headers", "txn")

    headers: Headers
    txn: TxnOutcome | None

    def delivered(self, topic: str, headers: Headers) -> None:
        raise NotImplementedError

    def failed(self, failure: DeliveryFailure) -> None:
        raise NotImplementedError

    def __call__(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery callback (``err`` a ``KafkaError`` or None, ``msg`` the
        ``Message``)."""
        if err is None:
            self.delivered(msg.topic() or "", self.headers)
        else:
            self.failed(failure_of(err, msg.topic(), msg.key(), msg.value(), self.headers))


def describe(code: int, fatal: bool) -> Failure:
    """The neutral description of Kafka error ``code`` (``fatal``: librdkafka marked it so),
    for :func:`cdc_outbox.errors.classify`."""
    if code in _RECORD_CODES:  # also when fatal: the gapless guarantee (halt policy) says so
        return Failure(Fault.RECORD)
    if fatal or code in (KafkaError._FATAL, KafkaError._FENCED):
        return Failure(Fault.SERVICE, PRODUCER_FATAL)
    return Failure(Fault.SERVICE, _ALERTS.get(code, "kafka_unavailable"))


def failure_of(
    err: Any, topic: str | None, key: bytes | None, value: bytes | None, headers: Any
) -> DeliveryFailure:
    """The :class:`DeliveryFailure` of librdkafka error ``err`` for this record."""
    code = err.code()
    verdict = classify(describe(code, bool(err.fatal())))
    return DeliveryFailure(
        code=code,
        name=err.name(),
        reason=err.str(),
        kind=verdict.kind,
        alert=verdict.hint,
        topic=topic or "",
        key=key,
        value=value,
        headers=list(headers or []),
    )
