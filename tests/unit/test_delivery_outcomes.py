"""Delivery outcomes drive the ack tracker: a pure test of the ack logic with fake reports."""

from __future__ import annotations

from cdc_outbox.ack_tracker import AckTracker
from cdc_outbox.config import Settings
from cdc_outbox.delivery_outcomes import DeliveryOutcomes, TxnListener
from cdc_outbox.kafka_publisher import DeliveryFailure
from cdc_outbox.relay_stats import RelayStats


def _settings(**extra: object) -> Settings:
    return Settings.model_validate({"dsn": "host=localhost dbname=x", **extra})


def _failure(permanent: bool, name: str = "MSG_SIZE_TOO_LARGE") -> DeliveryFailure:
    return DeliveryFailure(
        code=10, name=name, reason="nope", permanent=permanent, fatal=False,
        topic="t", key=b"k", value=b"v", headers=[("id", b"e")],
    )  # fmt: skip


def _txn(outcomes: DeliveryOutcomes, tracker: AckTracker, events: int, end: int) -> TxnListener:
    txn = TxnListener(outcomes, tracker, tracker.begin())
    for _ in range(events):
        txn.add_event()
    tracker.commit(txn.txn_id, end)
    txn.committed(1.0)
    return txn


def test_confirms_only_after_every_event_is_acknowledged() -> None:
    stats = RelayStats()
    outcomes = DeliveryOutcomes(_settings(), stats, None)
    tracker = AckTracker(100)
    outcomes.new_session(tracker)
    latencies: list[tuple[float, int]] = []
    stats.latency_observers.append(lambda s, n: latencies.append((s, n)))
    first = _txn(outcomes, tracker, 2, 200)
    second = _txn(outcomes, tracker, 1, 300)
    second.delivered("t", [("id", b"c")])
    assert tracker.confirmed == 100  # the earlier transaction is still unacknowledged
    first.delivered("t", [("id", b"a")])
    assert tracker.confirmed == 100
    first.delivered("t", [("id", b"b")])
    assert tracker.confirmed == 300
    assert stats.events_published == 3
    assert stats.published_by_topic == {"t": 3}
    assert sorted(n for _, n in latencies) == [1, 2]


def test_permanent_failure_is_dead_lettered_and_acked_only_when_the_dead_letter_is() -> None:
    stats = RelayStats()
    outcomes = DeliveryOutcomes(_settings(), stats, None)
    tracker = AckTracker(0)
    outcomes.new_session(tracker)
    txn = _txn(outcomes, tracker, 1, 50)
    txn.failed(_failure(permanent=True))
    assert outcomes.restart_reason is None
    pending = outcomes.next_dead_letter()
    assert pending is not None and pending.value is None  # too large: value omitted
    assert tracker.confirmed == 0
    pending.listener.delivered("dlq", pending.headers)
    assert tracker.confirmed == 50
    assert stats.events_dead_lettered == 1
    assert stats.dead_lettered_by_topic == {"t": 1}


def test_transient_failure_asks_for_a_restart_and_never_acks() -> None:
    outcomes = DeliveryOutcomes(_settings(), RelayStats(), None)
    tracker = AckTracker(0)
    outcomes.new_session(tracker)
    txn = _txn(outcomes, tracker, 1, 70)
    txn.failed(_failure(permanent=False, name="_MSG_TIMED_OUT"))
    assert outcomes.restart_reason is not None and "_MSG_TIMED_OUT" in outcomes.restart_reason
    assert tracker.confirmed == 0
    assert outcomes.next_dead_letter() is None


def test_halt_policy_halts_instead_of_dead_lettering() -> None:
    outcomes = DeliveryOutcomes(_settings(on_permanent_error="halt"), RelayStats(), None)
    tracker = AckTracker(0)
    outcomes.new_session(tracker)
    _txn(outcomes, tracker, 1, 10).failed(_failure(permanent=True))
    assert outcomes.halt_reason is not None
    assert outcomes.next_dead_letter() is None
    assert tracker.confirmed == 0


def test_reports_from_a_torn_down_session_are_ignored() -> None:
    outcomes = DeliveryOutcomes(_settings(), RelayStats(), None)
    old = AckTracker(0)
    outcomes.new_session(old)
    txn = _txn(outcomes, old, 1, 10)
    outcomes.new_session(AckTracker(0))
    txn.failed(_failure(permanent=False, name="_PURGE_QUEUE"))
    assert outcomes.restart_reason is None
