"""AckTracker: unit tests of each rule plus hypothesis models of whole runs (the safety core)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from cdc_outbox.cdc.ack_tracker import AckTracker


def test_confirms_commit_end_only_after_all_acks() -> None:
    t = AckTracker(confirmed=100)
    a = t.begin()
    t.add_event(a)
    t.add_event(a)
    assert (t.open_txn, t.in_flight, t.pending_txns) == (a, 2, 1)
    t.commit(a, 200)
    assert t.open_txn is None and t.confirmed == 100
    t.ack(a)
    assert t.confirmed == 100 and t.in_flight == 1
    t.ack(a)
    assert t.confirmed == 200 and t.in_flight == 0 and t.pending_txns == 0


def test_acks_may_arrive_before_commit() -> None:
    t = AckTracker()
    a = t.begin()
    t.add_event(a)
    t.ack(a)
    assert t.confirmed == 0  # not committed yet
    t.commit(a, 50)
    assert t.confirmed == 50


def test_later_txn_waits_for_earlier_one() -> None:
    t = AckTracker()
    a = t.begin()
    t.add_event(a)
    t.commit(a, 10)
    b = t.begin()
    t.add_event(b)
    t.commit(b, 20)
    c = t.begin()
    t.commit(c, 30)  # no events
    t.ack(b)
    assert t.confirmed == 0 and t.pending_txns == 3
    t.ack(a)
    assert t.confirmed == 30 and t.pending_txns == 0


def test_empty_txn_confirms_at_commit() -> None:
    t = AckTracker(5)
    a = t.begin()
    t.commit(a, 7)
    assert t.confirmed == 7


def test_keepalive_rules() -> None:
    t = AckTracker(10)
    t.keepalive(40)
    assert t.confirmed == 40
    t.keepalive(30)  # never backwards
    assert t.confirmed == 40
    a = t.begin()
    t.keepalive(90)  # open transaction: nothing
    assert t.confirmed == 40
    t.add_event(a)
    t.commit(a, 100)
    t.keepalive(150)  # unacked event: nothing
    assert t.confirmed == 40
    t.ack(a)
    assert t.confirmed == 100
    t.keepalive(150)
    assert t.confirmed == 150


def test_commit_lsn_below_confirmed_does_not_go_back() -> None:
    t = AckTracker(1000)
    a = t.begin()
    t.commit(a, 500)  # e.g. a transaction re-sent after a server crash
    assert t.confirmed == 1000


def test_misuse_raises_value_error() -> None:
    t = AckTracker()
    with pytest.raises(ValueError, match="add_event for transaction 0, open is None"):
        t.add_event(0)
    a = t.begin()
    with pytest.raises(ValueError, match=f"transaction {a} is still open"):
        t.begin()
    with pytest.raises(ValueError, match="commit of transaction 7, open is 0"):
        t.commit(7, 1)
    with pytest.raises(ValueError, match="negative end LSN"):
        t.commit(a, -1)
    with pytest.raises(ValueError, match="more acks than events for transaction 0"):
        t.ack(a)  # no events yet
    t.add_event(a)
    t.commit(a, 10)
    b = t.begin()
    t.add_event(b)
    t.commit(b, 20)
    t.ack(b)
    with pytest.raises(ValueError, match="more acks than events for transaction 1"):
        t.ack(b)  # fully acked but still pending behind a
    t.ack(a)
    with pytest.raises(ValueError, match=r"more acks than events for transaction 0 \(confirmed\)"):
        t.ack(a)
    with pytest.raises(ValueError, match="ack for unknown transaction 99"):
        t.ack(99)
    with pytest.raises(ValueError, match="ack for unknown transaction -1"):
        t.ack(-1)
    assert t.confirmed == 20 and t.in_flight == 0


def test_memory_is_per_transaction_not_per_event() -> None:
    t = AckTracker()
    a = t.begin()
    for _ in range(100_000):
        t.add_event(a)
    t.commit(a, 1)
    assert t.pending_txns == 1 and t.in_flight == 100_000
    for _ in range(100_000):
        t.ack(a)
    assert t.confirmed == 1 and t.pending_txns == 0
    assert len(t._txns) == 0


def test_repr() -> None:
    text = "AckTracker(confirmed=3, in_flight=0, pending_txns=0, open_txn=None)"
    assert repr(AckTracker(3)) == text


@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=12).flatmap(
        lambda counts: st.tuples(
            st.just(counts),
            st.permutations([i for i, n in enumerate(counts) for _ in range(n)]),
            st.lists(st.integers(1, 1000), min_size=len(counts), max_size=len(counts)),
        )
    )
)
def test_any_ack_order_confirms_everything_and_nothing_early(
    case: tuple[list[int], list[int], list[int]],
) -> None:
    counts, ack_order, gaps = case
    t = AckTracker()
    ends, lsn, ids = [], 0, []
    for n, gap in zip(counts, gaps, strict=True):
        txn = t.begin()
        ids.append(txn)
        for _ in range(n):
            t.add_event(txn)
        lsn += gap
        t.commit(txn, lsn)
        ends.append(lsn)
    unacked = list(counts)
    prev = t.confirmed
    for i in ack_order:
        t.ack(ids[i])
        unacked[i] -= 1
        first_incomplete = next((j for j, n in enumerate(unacked) if n), None)
        if first_incomplete is None:
            assert t.confirmed == ends[-1]
        else:
            assert t.confirmed < ends[first_incomplete]
            # exactly the end of the last transaction of the complete prefix
            assert t.confirmed == (ends[first_incomplete - 1] if first_incomplete else 0)
        assert t.confirmed >= prev
        prev = t.confirmed
    assert t.confirmed == ends[-1] and t.in_flight == 0 and t.pending_txns == 0


class _Txn:
    def __init__(self, txn_id: int, begin_wal: int) -> None:
        self.id = txn_id
        self.begin_wal = begin_wal
        self.events = 0
        self.acked = 0
        self.end: int | None = None

    @property
    def complete(self) -> bool:
        return self.end is not None and self.acked == self.events


class AckTrackerMachine(RuleBasedStateMachine):
    """Random interleavings of begin/add_event/commit/ack/keepalive vs a simple model."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = AckTracker(0)
        self.wal = 0  # server WAL position: only grows
        self.txns: list[_Txn] = []  # unconfirmed, oldest first
        self.done: list[int] = []  # confirmed txn ids
        self.expected = 0
        self.last_confirmed = 0

    @property
    def open(self) -> _Txn | None:
        return self.txns[-1] if self.txns and self.txns[-1].end is None else None

    def _settle(self) -> None:
        while self.txns and self.txns[0].complete:
            txn = self.txns.pop(0)
            assert txn.end is not None
            self.expected = max(self.expected, txn.end)
            self.done.append(txn.id)

    @precondition(lambda self: self.open is None)
    @rule(gap=st.integers(1, 100))
    def begin(self, gap: int) -> None:
        self.wal += gap
        self.txns.append(_Txn(self.tracker.begin(), self.wal))

    @precondition(lambda self: self.open is not None)
    @rule(n=st.integers(1, 3))
    def add_events(self, n: int) -> None:
        txn = self.open
        assert txn is not None
        for _ in range(n):
            self.tracker.add_event(txn.id)
        txn.events += n

    @precondition(lambda self: self.open is not None)
    @rule(gap=st.integers(1, 1000))
    def commit(self, gap: int) -> None:
        txn = self.open
        assert txn is not None
        self.wal += gap
        txn.end = self.wal
        self.tracker.commit(txn.id, txn.end)
        self._settle()

    @precondition(lambda self: any(t.acked < t.events for t in self.txns))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        txn = data.draw(st.sampled_from([t for t in self.txns if t.acked < t.events]))
        self.tracker.ack(txn.id)
        txn.acked += 1
        self._settle()

    @precondition(lambda self: any(t.acked == t.events for t in self.txns) or bool(self.done))
    @rule(data=st.data())
    def extra_ack_is_an_error(self, data: st.DataObject) -> None:
        ids = [t.id for t in self.txns if t.acked == t.events] + self.done
        with pytest.raises(ValueError, match="more acks than events"):
            self.tracker.ack(data.draw(st.sampled_from(ids)))

    @rule(ahead=st.integers(0, 50))
    def keepalive(self, ahead: int) -> None:
        wal_end = self.wal + ahead
        self.wal = wal_end
        self.tracker.keepalive(wal_end)
        if not self.txns:
            self.expected = max(self.expected, wal_end)

    @rule(behind=st.integers(0, 2000))
    def stale_keepalive(self, behind: int) -> None:
        self.tracker.keepalive(max(0, self.wal - behind))
        if not self.txns:
            self.expected = max(self.expected, self.wal - behind)

    @rule(ahead=st.integers(0, 5))
    def ack_for_a_txn_never_begun_is_an_error(self, ahead: int) -> None:
        unknown = (self.txns[-1].id if self.txns else (self.done[-1] if self.done else -1)) + 1
        with pytest.raises(ValueError, match=f"ack for unknown transaction {unknown + ahead}"):
            self.tracker.ack(unknown + ahead)

    @invariant()
    def matches_model(self) -> None:
        t = self.tracker
        assert t.confirmed == self.expected
        assert t.in_flight == sum(x.events - x.acked for x in self.txns)
        assert t.pending_txns == len(self.txns)
        assert t.open_txn == (self.open.id if self.open else None)

    @invariant()
    def never_backwards(self) -> None:
        assert self.tracker.confirmed >= self.last_confirmed
        self.last_confirmed = self.tracker.confirmed

    @invariant()
    def never_past_an_incomplete_transaction(self) -> None:
        for txn in self.txns:
            if not txn.complete:
                # past neither this txn's end nor (while open) where it began
                limit = txn.begin_wal if txn.end is None else txn.end - 1
                assert self.tracker.confirmed <= limit


AckTrackerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60)
TestAckTrackerMachine = AckTrackerMachine.TestCase
