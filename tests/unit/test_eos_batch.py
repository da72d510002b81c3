"""EosBatch: the exactly-once batching rules, one by one and as a hypothesis model of runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_outbox.cdc.eos_batch import EosBatch


def test_commits_at_max_events_only_at_a_transaction_boundary() -> None:
    b = EosBatch(interval_s=100.0, max_events=3)
    b.begin()
    for _ in range(5):
        b.add_event(0.0)
        assert not b.due(0.0)  # never inside a PostgreSQL transaction
    b.end(500, had_events=True)
    assert b.due(0.0)
    assert b.ceiling() == 0
    assert b.close() == 500
    assert b.ceiling() == 0  # closing: still bounded until the commit
    assert b.committed() == 5
    assert b.committed_lsn == 500
    assert b.ceiling() is None and b.events == 0


def test_commits_after_the_interval_since_the_first_event() -> None:
    b = EosBatch(interval_s=0.1, max_events=1000)
    b.begin()
    b.add_event(10.0)
    b.end(100, had_events=True)
    assert not b.due(10.05)
    assert b.due(10.2)


def test_caught_up_closes_at_once_at_a_boundary_only() -> None:
    b = EosBatch(interval_s=100.0, max_events=1000)
    assert not b.due(0.0, caught_up=True)  # nothing to commit
    b.begin()
    b.add_event(0.0)
    assert not b.due(0.0, caught_up=True)  # never inside a PostgreSQL transaction
    b.end(100, had_events=True)
    assert not b.due(0.0)  # the interval is far off
    assert b.due(0.0, caught_up=True)
    b.close(0.0)
    b.begin()
    b.add_event(0.0)
    b.end(200, had_events=True)
    assert not b.due(0.0, caught_up=True)  # one commit at a time
    b.committed(0.001)
    assert b.due(0.0, caught_up=True)


def test_a_caught_up_close_waits_for_min_interval_and_the_read_wakes_for_it() -> None:
    b = EosBatch(interval_s=0.1, max_events=1000, min_interval_s=0.03)
    b.begin()
    b.add_event(1.0)
    b.end(100, had_events=True)
    assert not b.due(1.02, caught_up=True)
    assert b.seconds_to_due(1.02) == pytest.approx(0.01)
    assert b.due(1.03, caught_up=True)
    assert not b.due(1.05)  # not caught up: the interval rule alone
    assert b.due(1.1)


def test_with_no_min_interval_a_waiting_event_is_due_for_a_caught_up_relay_now() -> None:
    b = EosBatch(interval_s=0.1, max_events=1000)
    b.begin()
    b.add_event(1.0)
    b.end(100, had_events=True)
    assert b.seconds_to_due(1.0) == 0.0


def test_caught_up_with_only_skipped_or_empty_transactions_commits_nothing() -> None:
    b = EosBatch(interval_s=0.1, max_events=10, committed_lsn=500)
    assert b.skip(400)
    b.begin()
    b.end(600, had_events=False)
    assert not b.due(10.0, caught_up=True)


def _one_commit(b: EosBatch, start: float, took: float, lsn: int) -> None:
    """One PostgreSQL transaction read at ``start``, closed then and committed ``took`` later."""
    b.begin()
    b.add_event(start)
    b.end(lsn, had_events=True)
    b.close(start)
    b.committed(start + took)


def test_closes_early_by_the_recent_close_duration_so_the_commit_lands_on_the_interval() -> None:
    b = EosBatch(interval_s=0.1, max_events=1000, min_interval_s=0.1)  # the interval alone
    for n in range(40):  # closes that take 20 ms: lead_s approaches 0.02
        _one_commit(b, float(n), 0.02, 100 + n)
    assert 0.019 < b.lead_s <= 0.02
    b.begin()
    b.add_event(100.0)
    b.end(500, had_events=True)
    assert not b.due(100.079)
    assert b.due(100.081)  # 100 ms - 20 ms: the commit then lands ~100 ms after the event
    assert b.seconds_to_due(100.05) == pytest.approx(0.03, abs=1e-3)


def test_the_lead_is_at_most_a_quarter_interval_and_untimed_commits_leave_it() -> None:
    b = EosBatch(interval_s=0.1, max_events=1000)
    for n in range(40):  # a broker stalling every close for 2 s
        _one_commit(b, float(n * 10), 2.0, 100 + n)
    assert b.lead_s == pytest.approx(0.025, rel=1e-3)  # never "commit at once"
    b.begin()
    b.add_event(1000.0)
    b.end(900, had_events=True)
    b.close()  # untimed (the blocking commit of catch-up may be timed or not)
    b.committed(1001.0)
    assert b.lead_s == pytest.approx(0.025, rel=1e-3)
    b.begin()
    b.add_event(2000.0)
    b.end(950, had_events=True)
    b.close(2000.0)
    b.aborted()  # an aborted close teaches nothing either
    _one_commit(b, 3000.0, 0.0, 990)
    assert b.lead_s == pytest.approx(0.025 * 0.75, rel=1e-3)


def test_skips_transactions_kafka_already_holds_and_never_goes_back() -> None:
    b = EosBatch(0.1, 10, committed_lsn=1000)
    assert b.skip(999) and not b.skip(1000) and not b.skip(2000)
    b.begin()
    b.add_event(0.0)
    b.end(900, had_events=True)  # cannot happen in order, but never lowers the position
    b.close()
    b.committed()
    assert b.committed_lsn == 1000


def test_abort_forgets_the_batch() -> None:
    b = EosBatch(0.1, 10, committed_lsn=50)
    b.begin()
    b.add_event(0.0)
    assert b.ceiling() == 50
    b.aborted()
    assert b.ceiling() is None and not b.in_txn and b.end_lsn == 50


def test_misuse_raises() -> None:
    b = EosBatch(0.1, 10)
    with pytest.raises(ValueError):
        b.add_event(0.0)
    with pytest.raises(ValueError):
        b.end(1, had_events=False)
    with pytest.raises(ValueError):
        b.committed()  # nothing closed
    b.begin()
    with pytest.raises(ValueError):
        b.begin()
    with pytest.raises(ValueError):
        b.close()  # inside a PostgreSQL transaction
    b.add_event(0.0)
    b.end(10, had_events=True)
    b.close()
    with pytest.raises(ValueError):
        b.close()  # one commit at a time


def test_events_read_while_closing_form_the_next_transaction() -> None:
    b = EosBatch(interval_s=0.1, max_events=2)
    b.begin()
    b.add_event(0.0)
    b.add_event(0.0)
    b.end(100, had_events=True)
    assert b.close() == 100
    b.begin()
    b.add_event(0.01)
    b.add_event(0.01)
    b.add_event(0.01)
    b.end(200, had_events=True)
    assert not b.due(5.0)  # full, but the previous one has not committed yet
    assert b.full()  # so the relay reads no further
    assert b.ceiling() == 0
    assert b.committed() == 2
    assert b.committed_lsn == 100 and b.ceiling() == 100
    assert b.due(0.02)  # 3 events >= max_events
    assert b.close() == 200 and b.committed() == 3
    assert b.ceiling() is None


def test_abort_while_closing_forgets_both() -> None:
    b = EosBatch(0.1, 10, committed_lsn=50)
    b.begin()
    b.add_event(0.0)
    b.end(100, had_events=True)
    b.close()
    b.begin()
    b.add_event(0.0)
    b.aborted()
    assert not b.closing and b.ceiling() is None and b.committed_lsn == 50 and not b.in_txn


@given(
    txns=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=60),
    max_events=st.integers(min_value=1, max_value=40),
    gaps=st.lists(st.floats(min_value=0, max_value=0.2), min_size=60, max_size=60),
    commit_after=st.lists(st.integers(min_value=0, max_value=3), min_size=60, max_size=60),
    caught_up=st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_model_every_transaction_lands_whole_in_one_commit_in_order(
    txns: list[int],
    max_events: int,
    gaps: list[float],
    commit_after: list[int],
    caught_up: list[bool],
) -> None:
    """Replaying a stream, each closed Kafka transaction committing 0..3 PostgreSQL
    transactions later (reading goes on meanwhile), the relay caught up or not after each:
    each PostgreSQL transaction's events end up in exactly one commit, commits cover
    transactions in order, the ceiling never exceeds what is committed, nothing is left
    uncommitted at the end, and a caught-up relay with events and no commit in progress
    always closes."""
    b = EosBatch(interval_s=0.1, max_events=max_events)
    now = 0.0
    lsn = 100
    last_with_events = 0
    batch: list[int] = []
    closing: tuple[list[int], int, int] | None = None  # (txns, end LSN, commit at txn index)
    commits: list[list[int]] = []

    def commit() -> None:
        nonlocal closing
        assert closing is not None
        closed, end, _ = closing
        events = b.committed()
        assert events == sum(txns[i] for i in closed)
        assert b.committed_lsn == end
        commits.append(closed)
        closing = None

    for i, size in enumerate(txns):
        now += gaps[i]
        b.begin()
        for _ in range(size):
            b.add_event(now)
            assert not b.due(now + 1.0)
        lsn += 10 + size
        b.end(lsn, had_events=size > 0)
        if size:
            batch.append(i)
            last_with_events = lsn
        ceiling = b.ceiling()
        assert ceiling is None or ceiling <= b.committed_lsn
        if closing is not None and i >= closing[2]:
            commit()
        if caught_up[i] and closing is None and b.events:
            assert b.due(now, caught_up=True)
        if b.due(now, caught_up=caught_up[i]):
            assert closing is None
            assert b.close() == last_with_events
            closing = (batch, last_with_events, i + commit_after[i])
            batch = []
            assert b.events == 0
    if closing is not None:
        commit()
    if b.events:
        b.close()
        closing = (batch, last_with_events, 0)
        commit()
    flat = [i for c in commits for i in c]
    assert flat == [i for i, size in enumerate(txns) if size]
    assert all(commits)
    assert b.ceiling() is None


def test_the_slot_is_never_confirmed_past_the_kafka_commit() -> None:
    from cdc_outbox.cdc.ledger import Ledger
    from tests.support.helpers import recording_checkpointer

    batch = EosBatch(0.1, 10, committed_lsn=100)
    ledger = Ledger(batch)
    cp, stream = recording_checkpointer(ledger, 100)
    tracker = ledger.acked
    txn = tracker.begin()
    batch.begin()
    tracker.add_event(txn)
    batch.add_event(0.0)
    tracker.ack(txn)  # written in the open Kafka transaction
    tracker.commit(txn, 200)
    batch.end(200, had_events=True)
    tracker.keepalive(300)
    assert tracker.confirmed == 300
    cp.send()
    assert stream.sent[-1][1] == 100  # acked, but not committed in Kafka
    batch.close()
    cp.send()
    assert stream.sent[-1][1] == 100  # closed, not committed yet
    batch.committed()
    cp.send()
    assert stream.sent[-1][1] == 300


def test_checkpoint_record_round_trip() -> None:
    from cdc_outbox.kafka.checkpoints import Checkpoint, checkpoint_key

    ckpt = Checkpoint("slot", "7714", "shop", 123456, ["a", "b"])
    assert Checkpoint.decode(ckpt.encode()) == ckpt
    assert ckpt.key == checkpoint_key("7714", "shop", "slot") == b"7714/shop/slot"


def test_seconds_to_due_counts_from_the_first_event() -> None:
    b = EosBatch(interval_s=0.1, max_events=10, min_interval_s=0.5)  # the interval comes first
    assert b.seconds_to_due(5.0) is None
    b.begin()
    b.add_event(5.0)
    assert b.seconds_to_due(5.04) == pytest.approx(0.06)
    assert b.seconds_to_due(6.0) == 0.0
