"""The relay producer's librdkafka configuration: what we insist on, our defaults, how a
user's ``kafka.config`` is merged with them, and the start-up check that librdkafka accepts
the result (:func:`check_producer_config`: one ``config: ...`` line, exit 2, not a traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer

from cdc_outbox.errors import ConfigError
from cdc_outbox.kafka.librdkafka_log import QuietLibrdkafkaLog
from cdc_outbox.redaction import is_secret_kafka_key, redact

#: Settings we insist on: they are what makes delivery reports mean "durable, in order".
REQUIRED_CONFIG: Mapping[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
}

#: Defaults a user may override through ``kafka.config``.
DEFAULT_CONFIG: Mapping[str, str] = {
    # Never give up on a record by timeout: while the broker is down the queue fills, the relay
    # stops reading the slot, and delivery resumes in order once the broker is back.
    "message.timeout.ms": "0",
    # TCP_NODELAY, as Kafka's Java client always sets it: a transaction's records go out as one
    # produce request per partition, and Nagle holds the later ones back until TCP acknowledges
    # the first (benchmarks/producer_flush.py: lower flush p50 and p99 in 4 of 4 rounds).
    "socket.nagle.disable": "true",
    "linger.ms": "20",  # batches of ~1,000 records at high rates; adds at most 20 ms
    "batch.num.messages": "10000",
    "queue.buffering.max.messages": "200000",
    "queue.buffering.max.kbytes": "262144",
}

#: Defaults of a transactional producer (exactly-once): a closing Kafka transaction waits for
#: its last records, so they should not linger long (the commit interval batches anyway).
TRANSACTIONAL_DEFAULTS: Mapping[str, str] = {"linger.ms": "5"}


def producer_config(
    config: Mapping[str, Any], gapless: bool = False, transactional_id: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(librdkafka config of the relay's producer, the part of it we insist on): defaults <
    ``config`` < :data:`REQUIRED_CONFIG` (+ gapless guarantee, ``transactional.id``)."""
    required = {**REQUIRED_CONFIG, **({"enable.gapless.guarantee": "true"} if gapless else {})}
    if transactional_id is not None:
        required["transactional.id"] = transactional_id
    defaults = {**DEFAULT_CONFIG, **(TRANSACTIONAL_DEFAULTS if transactional_id else {})}
    return {**defaults, **config, **required}, required


def linger_s(merged: Mapping[str, Any]) -> float:
    """``linger.ms`` (or its alias ``queue.buffering.max.ms``) of a merged producer config, in
    seconds; librdkafka's default (5 ms) when neither is set or the value is no number
    (librdkafka refuses it when the producer is built)."""
    value = merged.get("linger.ms", merged.get("queue.buffering.max.ms", "5"))
    try:
        return max(float(value), 0.0) / 1000
    except (TypeError, ValueError):
        return 0.005


def eos_config(config: Mapping[str, Any], transaction_timeout_ms: int) -> dict[str, Any]:
    """``config`` for the transactional producer: our ``transaction.timeout.ms`` unless the
    user set one."""
    return {"transaction.timeout.ms": str(transaction_timeout_ms), **config}


def check_producer_config(
    config: Mapping[str, Any], gapless: bool = False, transactional: bool = False
) -> None:
    """Raise :class:`ConfigError` (one line, exit 2) if librdkafka refuses the producer the
    relay would build from ``config`` (unknown key, invalid value, conflicting settings).
    Builds that producer once and drops it; it sends nothing."""
    txn_id = "cdc-outbox-config-check" if transactional else None
    merged, _ = producer_config(config, gapless, txn_id)
    try:
        probe = Producer(merged, logger=QuietLibrdkafkaLog(max_level=logging.DEBUG))
    except (KafkaException, TypeError, ValueError) as exc:
        raise ConfigError(config_error_line(config, exc)) from None
    del probe


def config_error_line(config: Mapping[str, Any], exc: Exception) -> str:
    """``config: kafka.config ...`` naming the key librdkafka refused (when one key alone is
    refused) and its reason; secret values are never shown."""
    reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
    culprit = None
    if not reason.startswith("Failed to create"):  # one key's own value: find which one
        culprit = next(
            (k for k in config if k != "bootstrap.servers" and _refused(k, config[k])), None
        )
    where = f"kafka.config '{culprit}'" if culprit else "kafka.config"
    if culprit is not None and is_secret_kafka_key(culprit):
        reason = redact(reason, [str(config[culprit])])
    return (
        f"config: {where} is refused by librdkafka: {reason} (fix the setting; valid keys and"
        " values: librdkafka's CONFIGURATION.md)"
    )


def _refused(key: str, value: Any) -> bool:
    """Does librdkafka refuse ``key = value`` on its own? (no bootstrap servers: nothing
    connects)."""
    try:
        Producer({key: value}, logger=QuietLibrdkafkaLog(max_level=logging.DEBUG))
    except (KafkaException, TypeError, ValueError):
        return True
    return False
