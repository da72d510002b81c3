"""Issue 35.1: one error vocabulary. One classification (retry / dead-letter / halt) named the
same in every stage, one list of SQLSTATEs that cannot heal, and back-off bounds as a policy
object (:class:`cdc_outbox.config.backoff.BackoffPolicy`) instead of literals at call sites."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from cdc_outbox import errors
from cdc_outbox.cdc import replication_stream
from cdc_outbox.cdc.replication_stream import ReplicationError
from cdc_outbox.config.backoff import RECONNECT, STARTUP, Backoff, BackoffPolicy
from cdc_outbox.config.models import PollingSettings
from cdc_outbox.consumer.settings import ConsumerSettings
from cdc_outbox.delivery import policy
from cdc_outbox.errors import FailureClass, SchemaMissing, classify
from cdc_outbox.kafka import delivery_failure

PACKAGE = Path(errors.__file__).parent


def test_the_one_classification_has_three_names() -> None:
    assert [c.value for c in FailureClass] == ["retry", "dead_letter", "halt"]


def test_errors_classify_says_halt_or_retry() -> None:
    assert classify(SchemaMissing("schema: x (fix: y)")).kind is FailureClass.HALT
    assert classify(OSError("network unreachable")).kind is FailureClass.RETRY


@pytest.mark.parametrize(
    ("code", "fatal", "expected"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, False, FailureClass.DEAD_LETTER),
        (KafkaError.MSG_SIZE_TOO_LARGE, True, FailureClass.DEAD_LETTER),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, False, FailureClass.RETRY),
        (KafkaError._FATAL, False, FailureClass.RETRY),  # a new producer, then retried
        (KafkaError._TRANSPORT, True, FailureClass.RETRY),
    ],
)
def test_kafka_classification_uses_the_same_names(
    code: int, fatal: bool, expected: FailureClass
) -> None:
    assert classify(delivery_failure.describe(code, fatal)).kind is expected


def test_a_fatal_producer_is_retried_with_a_new_producer() -> None:
    verdict = classify(delivery_failure.describe(KafkaError._FENCED, False))
    failure = delivery_failure.DeliveryFailure(
        1, "X", "x", verdict.kind, verdict.hint, "t", b"k", b"v", []
    )
    assert failure.producer_fatal
    verdict = classify(delivery_failure.describe(KafkaError._TRANSPORT, False))
    failure = delivery_failure.DeliveryFailure(
        1, "X", "x", verdict.kind, verdict.hint, "t", b"k", b"v", []
    )
    assert not failure.producer_fatal


def test_the_delivery_policy_speaks_the_same_vocabulary() -> None:
    assert policy.FailureAction is FailureClass
    assert policy.on_encode_failure("invalid", True) is FailureClass.HALT


def test_replication_stream_reads_the_one_sqlstate_list() -> None:
    source = Path(replication_stream.__file__).read_text()
    assert not re.findall(r"\"[0-9A-Z]{5}\"", source), "SQLSTATE literals in replication_stream"
    assert "password authentication failed" not in source
    permanent = replication_stream._PERMANENT_SQLSTATES
    assert permanent >= errors.SQLSTATE_PRIVILEGE | errors.SQLSTATE_AUTH
    assert permanent == errors.REPLICATION_PERMANENT_SQLSTATES


def test_the_replication_error_keeps_missing_privilege_and_sqlstate() -> None:
    assert ReplicationError("x", sqlstate="42501").missing_privilege
    assert ReplicationError("x", sqlstate="42501").sqlstate == "42501"
    assert ReplicationError("permission denied to start WAL sender").missing_privilege
    assert not ReplicationError("x", sqlstate="55000").missing_privilege


def test_backoff_policy_defaults_live_in_one_place() -> None:
    assert BackoffPolicy() == RECONNECT == BackoffPolicy(0.5, 30.0)
    assert BackoffPolicy(0.5, 5.0) == STARTUP
    assert [RECONNECT.delay(n) for n in (1, 2, 7, 8)] == [0.5, 1.0, 30.0, 30.0]
    backoff = Backoff(STARTUP)
    assert [backoff.failed() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 5.0]


def test_settings_give_their_backoff_policy() -> None:
    assert PollingSettings().backoff == BackoffPolicy(1.0, 300.0)
    assert PollingSettings(backoff_base_s=2, backoff_max_s=9).backoff == BackoffPolicy(2, 9)
    consumer = ConsumerSettings(
        consumer_name="c", group_id="g", topics=("t",), bootstrap_servers="k:1"
    )
    assert consumer.retry_backoff == BackoffPolicy(0.2, 5.0)


def test_no_backoff_literals_at_call_sites() -> None:
    literal = re.compile(r"(?:Backoff|doubling|BackoffPolicy)\(\s*[\w.]*\s*[0-9]")
    offenders = [
        f"{path.relative_to(PACKAGE)}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "backoff.py"
        for line in path.read_text().splitlines()
        if literal.search(line) or re.search(r"doubling\([^)]*,", line)
    ]
    assert not offenders, offenders
