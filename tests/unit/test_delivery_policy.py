"""The pure delivery policy: classification, prechecks, parking, broken-order detection."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.delivery.policy import (
    RECORD_OVERHEAD_BYTES,
    FailureAction,
    KeysInFlight,
    Parking,
    blocked_reason,
    on_failure,
    precheck,
)
from cdc_outbox.errors import FailureClass, classify
from cdc_outbox.kafka.delivery_failure import DeliveryFailure, describe


def _kafka(code: int, fatal: bool) -> tuple[FailureClass, str | None]:
    """(kind, alert) of a Kafka error code, through the one classification."""
    verdict = classify(describe(code, fatal))
    return verdict.kind, verdict.hint


def _failure(code: int, fatal: bool = False) -> DeliveryFailure:
    kind, alert = _kafka(code, fatal)
    return DeliveryFailure(code, "X", "x", kind, alert, "t", b"k", b"v", [])


@pytest.mark.parametrize(
    ("code", "kind", "alert"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, FailureClass.DEAD_LETTER, None),
        (KafkaError.INVALID_RECORD, FailureClass.DEAD_LETTER, None),
        (KafkaError.RECORD_LIST_TOO_LARGE, FailureClass.DEAD_LETTER, None),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, FailureClass.RETRY, "topic_missing"),
        (KafkaError._UNKNOWN_TOPIC, FailureClass.RETRY, "topic_missing"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, FailureClass.RETRY, "not_authorized"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, FailureClass.RETRY, "not_authorized"),
        (KafkaError._TRANSPORT, FailureClass.RETRY, "kafka_unavailable"),
        (KafkaError._MSG_TIMED_OUT, FailureClass.RETRY, "kafka_unavailable"),
        (KafkaError._FENCED, FailureClass.RETRY, "producer_fatal"),
        (KafkaError._FATAL, FailureClass.RETRY, "producer_fatal"),
    ],
)
def test_only_record_level_rejections_are_permanent(
    code: int, kind: FailureClass, alert: str
) -> None:
    assert _kafka(code, False) == (kind, alert)


def test_a_record_rejection_stays_record_level_when_gapless_makes_it_fatal() -> None:
    assert _kafka(KafkaError.MSG_SIZE_TOO_LARGE, True) == (FailureClass.DEAD_LETTER, None)
    assert _kafka(KafkaError._TRANSPORT, True) == (FailureClass.RETRY, "producer_fatal")


def test_actions_per_kind_and_policy() -> None:
    record = _failure(KafkaError.MSG_SIZE_TOO_LARGE)
    assert on_failure(record, halt_policy=False) is FailureAction.DEAD_LETTER
    assert on_failure(record, halt_policy=True) is FailureAction.HALT
    missing = _failure(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert on_failure(missing, halt_policy=False) is FailureAction.RETRY
    assert on_failure(missing, halt_policy=True) is FailureAction.RETRY
    fatal = _failure(KafkaError._FATAL, fatal=True)
    assert on_failure(fatal, halt_policy=False) is FailureAction.RETRY


def test_precheck_counts_key_value_headers_and_overhead() -> None:
    headers = [("id", b"0123456789")]
    exact = 1000 - RECORD_OVERHEAD_BYTES - len("id") - 10 - len(b"key")
    assert precheck(b"key", b"v" * exact, headers, 1000) is None
    problem = precheck(b"key", b"v" * (exact + 1), headers, 1000)
    assert problem is not None and "1001 bytes > max_record_bytes 1000" in problem
    assert precheck(None, b"{}", [], 1000) == "record has a null key (aggregate id)"
    assert precheck(b"k", None, [], 1000) is None  # a tombstone is fine


def test_parking_keeps_the_first_blocker_and_releases_only_complete_redrives() -> None:
    parking = Parking()
    assert parking.blocked_by(b"a") is None
    parking.park(b"a", "e1")
    parking.park(b"a", "e2")
    parking.park(None, "e3")  # no aggregate: nothing to park
    assert parking.blocked_by(b"a") == "e1"
    assert len(parking) == 1
    assert not parking.release(b"a", {"e1"})  # e2 was parked too: it would be overtaken
    assert parking.blocked_by(b"a") == "e1"
    assert parking.release(b"a", {"e1", "e2", "other"})
    assert parking.blocked_by(b"a") is None
    assert blocked_reason("e1") == "blocked_by e1"
    assert blocked_reason("e1", "e2") == "blocked_by e1"
    assert blocked_reason("e1", "e1").startswith("already FAILED")


def test_parking_load_replaces_the_set() -> None:
    parking = Parking()
    parking.park(b"x", "old")
    parking.load([("a", "e1"), ("b", "e2")])
    assert parking.blocked_by(b"x") is None
    assert parking.blocked_by(b"a") == "e1"
    assert parking.release(b"a", set())  # nothing parked since the load


def test_parking_loaded_from_position_parks_from_the_blocker_on() -> None:
    """Loaded for a re-stream: events before the FAILED one are sent; the blocker itself or
    the first event after it parks the key for good (no more comparisons)."""
    order = {"e0": 0, "e1": 1, "e2": 2, "e3": 3, "f0": 0, "f1": 1}
    asked: list[tuple[str, str]] = []

    def precedes(event_id: str, blocker: str) -> bool:
        asked.append((event_id, blocker))
        return order[event_id] < order[blocker]

    parking = Parking()
    parking.load_from_position([("a", "e1"), ("b", "f1"), ("c", "g1")])
    assert len(parking) == 3
    assert parking.blocked_by(b"a", "e0", precedes) is None  # before E1: sent
    assert parking.blocked_by(b"a", "e0", precedes) is None  # again (a duplicate)
    assert parking.blocked_by(b"a", "e1", precedes) == "e1"  # the blocker itself
    assert parking.blocked_by(b"a", "e0", precedes) == "e1"  # parked for good now
    assert asked == [("e0", "e1"), ("e0", "e1")]
    assert parking.blocked_by(b"b", "f0", precedes) is None
    parking.park(b"b", "f0")  # the event before the blocker failed itself: blocks from there
    assert parking.blocked_by(b"b", "f1", precedes) == "f0"
    assert parking.blocked_by(b"c") == "g1"  # without a comparison: parked
    assert parking.release(b"a", set())


@given(st.lists(st.sampled_from([b"a", b"b", b"c"]), max_size=50), st.randoms())
def test_keys_in_flight_reports_later_records_of_the_same_key(
    keys: list[bytes], rnd: object
) -> None:
    """Model: per key, records are reported in produce order (one partition per key)."""
    tracker = KeysInFlight()
    queues: dict[bytes, int] = {}
    for key in keys:
        tracker.add(key)
        queues[key] = queues.get(key, 0) + 1
    pending = [k for k in keys]
    rnd.shuffle(pending)  # type: ignore[attr-defined]
    for key in pending:
        queues[key] -= 1
        assert tracker.done(key) == queues[key]
    assert len(tracker) == 0
    assert tracker.done(b"never") == 0
    assert tracker.done(None) == 0


def test_redrive_messages_are_parsed_only_when_transactional_and_ours() -> None:
    from cdc_outbox.store.redrive import REDRIVE_MESSAGE_PREFIX, parse_redrive_message

    body = b'{"table": "public.outbox", "aggregates": ["a", "b"], "ids": ["e1", "e2"]}'
    request = parse_redrive_message(REDRIVE_MESSAGE_PREFIX, True, body)
    assert request is not None
    assert (request.table, request.aggregates, request.ids) == (
        "public.outbox",
        ("a", "b"),
        frozenset({"e1", "e2"}),
    )
    assert parse_redrive_message(REDRIVE_MESSAGE_PREFIX, False, body) is None
    assert parse_redrive_message("other.prefix", True, body) is None
