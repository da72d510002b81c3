"""Issue 35.1: one classification. :func:`cdc_outbox.errors.classify` is the one function that
says retry / dead-letter / halt (with a hint) for any failure: an exception, or a failure a
layer describes (:class:`~cdc_outbox.errors.Failure`: Kafka's reports, the encoder's)."""

from __future__ import annotations

import re
from pathlib import Path

from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox import errors
from cdc_outbox.delivery import policy
from cdc_outbox.errors import (
    AuthenticationFailed,
    ConfigError,
    Failure,
    FailureClass,
    Fault,
    PrivilegeMissing,
    SchemaMissing,
    Verdict,
    cannot_heal,
    classify,
    raise_if_cannot_heal,
)
from cdc_outbox.kafka.delivery_failure import describe

PACKAGE = Path(errors.__file__).parent
_KAFKA_CODES = sorted({v for v in vars(KafkaError).values() if type(v) is int})
_RECORD_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError._INVALID_ARG,
}


def test_exactly_one_classify_in_the_package() -> None:
    found = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for _ in re.finditer(r"^\s*def classify\(", path.read_text(), re.MULTILINE)
    ]
    assert found == ["errors.py"]


class _DbError(Exception):
    """Stands in for a psycopg error: what the classification reads (sqlstate, text)."""

    def __init__(self, text: str, sqlstate: str | None) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


_STATES = st.sampled_from(
    [None, "42P01", "42703", "3F000", "3D000", "42501", "28000", "28P01", "08006", "40001"]
)
_TEXTS = st.sampled_from(
    [
        "connection refused",
        'password authentication failed for user "relay"',
        'database "nope" does not exist',
        'role "ghost" does not exist',
        "server closed the connection unexpectedly",
    ]
)


@given(text=_TEXTS, state=_STATES)
def test_an_exception_halts_exactly_when_it_cannot_heal(text: str, state: str | None) -> None:
    exc = _DbError(text, state)
    verdict = classify(exc)
    fatal = cannot_heal(exc)
    if fatal is None:
        assert verdict == Verdict(FailureClass.RETRY, None)
    else:
        assert verdict == Verdict(FailureClass.HALT, str(fatal))
        assert type(verdict.error) is type(fatal)


def test_the_halt_hint_names_the_fix_and_the_error_keeps_its_exit_code() -> None:
    verdict = classify(_DbError("permission denied for table outbox", "42501"))
    assert verdict.kind is FailureClass.HALT
    assert verdict.hint is not None and "GRANT" in verdict.hint
    assert isinstance(verdict.error, PrivilegeMissing) and verdict.error.exit_code == 5
    config = ConfigError("bad")
    assert classify(config) == Verdict(FailureClass.HALT, "bad")
    assert classify(config).error is config
    assert isinstance(classify(_DbError("x", "28P01")).error, AuthenticationFailed)
    assert isinstance(classify(_DbError("x", "42P01")).error, SchemaMissing)


def test_raise_if_cannot_heal_raises_the_verdicts_error() -> None:
    raise_if_cannot_heal(OSError("network unreachable"))  # retried: nothing raised
    try:
        raise_if_cannot_heal(_DbError("no such table", "42P01"))
    except SchemaMissing as exc:
        assert "init --create-table" in str(exc)
    else:
        raise AssertionError("a missing table must halt")


@given(fault=st.sampled_from(Fault), problem=st.none() | st.sampled_from(["a", "topic_missing"]))
def test_a_described_failure_is_dead_lettered_exactly_when_it_is_the_records_fault(
    fault: Fault, problem: str | None
) -> None:
    verdict = classify(Failure(fault, problem))
    expected = FailureClass.DEAD_LETTER if fault is Fault.RECORD else FailureClass.RETRY
    assert verdict == Verdict(expected, problem)
    assert verdict.error is None


@given(code=st.sampled_from(_KAFKA_CODES), fatal=st.booleans())
def test_kafka_codes_classify_as_before(code: int, fatal: bool) -> None:
    """The table as it was: record-level codes dead-letter (also when fatal), a fatal or fenced
    producer is replaced, topic problems are alerted, anything else is Kafka unavailable."""
    verdict = classify(describe(code, fatal))
    if code in _RECORD_CODES:
        assert verdict == Verdict(FailureClass.DEAD_LETTER, None)
    elif fatal or code in (KafkaError._FATAL, KafkaError._FENCED):
        assert verdict == Verdict(FailureClass.RETRY, "producer_fatal")
    else:
        assert verdict.kind is FailureClass.RETRY
        assert verdict.hint in {
            "topic_missing",
            "not_authorized",
            "policy_violation",
            "kafka_unavailable",
        }


def test_an_encode_failure_goes_through_the_one_classification() -> None:
    assert policy.on_encode_failure("unavailable", True) is FailureClass.RETRY
    assert policy.on_encode_failure("invalid", False) is FailureClass.DEAD_LETTER
    assert policy.on_encode_failure("invalid", True) is FailureClass.HALT
