"""The mix's checker (tests/support/mix_tally.py) catches each fault per stream: a fault test
over the mix is only as strict as this."""

from __future__ import annotations

from cdc_outbox_dev.readback import ConsumedRecord
from tests.support.mix_tally import LedgerEvent, tally_mix
from tests.support.outbox_mix import DEBEZIUM_ROWS, DEFAULT_ROWS, MESSAGES

P = "t"


def _event(i: int, stream: str, agg: str, seq: int) -> LedgerEvent:
    return LedgerEvent(f"id-{i}", stream, agg, seq, f'{{"seq": {seq}}}', 0.0)


def _record(e: LedgerEvent, topic: str | None = None, value: str | None = None) -> ConsumedRecord:
    topic = topic or (f"{P}.shipping.order" if e.stream == DEBEZIUM_ROWS else f"{P}.event.order")
    body = (value or e.payload).encode()
    return ConsumedRecord(topic, 0, 0, e.aggregate_id.encode(), body, [("id", e.id.encode())])


# The same aggregate in the three streams: three independent sequences.
EVENTS = [
    _event(1, DEFAULT_ROWS, "order-1", 1),
    _event(2, DEBEZIUM_ROWS, "order-1", 1),
    _event(3, MESSAGES, "order-1", 1),
    _event(4, DEFAULT_ROWS, "order-1", 2),
    _event(5, DEBEZIUM_ROWS, "order-1", 2),
    _event(6, MESSAGES, "order-1", 2),
]


def test_all_streams_delivered_in_order_is_ok_even_interleaved_across_streams() -> None:
    # public.outbox's seq 2 before the message's seq 1: in order, as streams are apart.
    records = [_record(EVENTS[i]) for i in (0, 3, 2, 5, 1, 4)]
    verdict = tally_mix(EVENTS, records, P)
    assert verdict.ok, verdict.summary()
    assert (verdict.expected, verdict.received, verdict.duplicates) == (6, 6, 0)


def test_each_fault_is_counted_on_its_stream() -> None:
    records = [
        _record(EVENTS[0]),
        _record(EVENTS[3]),
        _record(EVENTS[3]),  # a duplicate of public.outbox
        _record(EVENTS[4]),  # shipping: seq 2 before seq 1
        _record(EVENTS[1]),
        _record(EVENTS[2], topic=f"{P}.shipping.order"),  # a message on the wrong topic
        # MESSAGES seq 2 never arrives: lost
        _record(_event(9, MESSAGES, "order-1", 9)),  # an id no committed event has
    ]
    verdict = tally_mix(EVENTS, records, P)
    s = verdict.streams
    assert not verdict.ok
    assert s[DEFAULT_ROWS].duplicated == ["id-4"] and verdict.duplicates == 1
    assert s[DEBEZIUM_ROWS].order_violations == ["shipping.events order-1: 1 after 2"]
    assert s[MESSAGES].mismatched == ["id-3 on t.shipping.order"]
    assert s[MESSAGES].missing == ["id-6"] and verdict.missing == ["id-6"]
    assert verdict.unexpected == ["id-9"]
    assert tally_mix(EVENTS, records, P, may_miss=["id-6"]).missing == []


def test_a_value_that_differs_from_the_payload_is_a_mismatch() -> None:
    records = [_record(e) for e in EVENTS[:5]] + [_record(EVENTS[5], value='{"seq":2}')]
    assert tally_mix(EVENTS, records, P).streams[MESSAGES].mismatched == ["id-6 on t.event.order"]
