"""Dead letters across restarts, through the relay harness (tests/support/relay_harness.py;
issue 37): an aggregate is parked only from its dead-lettered event on, never before it, whatever
re-streams the events around it (a failed Kafka commit, a PostgreSQL crash, a new process).
"""

from __future__ import annotations

from collections import Counter

from tests.support.fakes.kafka import Record
from tests.support.relay_harness import (
    POISON,
    Harness,
    Seen,
    assert_never_confirmed_past_kafka,
)


def _ids(records: list[Record]) -> list[str]:
    return [Seen(r).headers_id for r in records]


def test_a_dead_letter_parks_only_later_events_when_its_kafka_commit_fails() -> None:
    """E0, E1 (poison), E2 of aggregate A in one transaction, E3 in the next: E1's row is
    FAILED before the Kafka commit, which fails. The re-stream finds A parked behind E1 in
    the table; E0 comes before E1 and must be published as the first time, not dead-lettered
    as ``blocked_by`` E1 (its row must not become FAILED)."""
    h = Harness("exactly_once")
    t1 = h.pg.commit(["A", "A", "A"], pad=POISON)
    t2 = h.pg.commit(["A", "B"])
    h.cluster.fail_next_commit()
    relay = h.relay()
    h.run(relay)
    assert relay.stats.eos_aborts >= 1, "the commit with the dead letter did not fail"
    (e0, e1, e2), (e3, b) = t1.events, t2.events
    assert _ids(h.visible()) == [e0.id, b.id]
    assert _ids(h.dead_letters()) == [e1.id, e2.id, e3.id]
    assert sorted(h.outbox.failed) == sorted([e1.id, e2.id, e3.id])
    assert h.outbox.failed[e2.id] == f"blocked_by {e1.id}"
    assert_never_confirmed_past_kafka(h)


def test_a_restream_after_a_dead_letter_publishes_the_events_before_it_again() -> None:
    """At least once: the slot comes back before the transaction E0, E1 (poison), E2 of
    aggregate A (a PostgreSQL crash; a new relay process). E0, published the first time, is
    published again (a duplicate); it must not flip to FAILED behind E1."""
    h = Harness("at_least_once", keeps_position=False)
    t1 = h.pg.commit(["A", "A", "A"], pad=POISON)
    t2 = h.pg.commit(["A"])
    h.pg.checkpoint()  # the slot's position on disk: before T1
    h.run(h.relay())
    h.pg.crash()
    h.run(h.relay())
    assert h.stream.starts[-1] < t1.end_lsn, "T1 was not re-sent: the test proves nothing"
    (e0, e1, e2), (e3,) = t1.events, t2.events
    assert _ids(h.visible()) == [e0.id, e0.id]
    dead = _ids(h.dead_letters())
    assert e0.id not in dead
    assert Counter(dead) == Counter({e1.id: 2, e2.id: 2, e3.id: 2})
    assert e0.id not in h.outbox.failed
    assert h.outbox.failed[e1.id].startswith("record too large")
