"""cdc_outbox.cdc.history: what a position recorded in one WAL history is worth in another.

The property tests build random histories of one database: a primary writes transactions on
timeline 1; standbys that were behind are promoted, and point-in-time restores or clones are
promoted the same way (each fork starts a new timeline at a switchpoint below what the old
server wrote, and its own transactions reuse those LSNs). A checkpoint (or in-memory
position) recorded on any earlier incarnation must never make the relay skip a transaction
of the current history that was not in the recorded one below the recorded position.

A crash-consistent copy restored on the *same* timeline (a disk snapshot started as a
primary) is recognised only while its WAL has not passed the recorded position
(test_a_restore_on_the_same_timeline_is_recognised_below_the_checkpoint); past that, nothing
in the server tells the two histories apart: docs/exactly-once.md states this limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_outbox.cdc.history import History, parse_timeline_history, stream_start, trusted_below

SYSTEM = "7400000000000000001"


@dataclass(frozen=True)
class Txn:
    """A committed transaction: where it committed, and on which server incarnation."""

    final_lsn: int
    end_lsn: int
    origin: int  # which incarnation wrote it (shared prefixes keep the writer's number)


@dataclass
class Incarnation:
    """One server's WAL: its transactions in LSN order, its timeline and switchpoints."""

    timeline: int
    txns: list[Txn]
    switchpoints: dict[int, int]
    start: int = 16  # where its timeline began (its parent's switchpoint)

    @property
    def wal_end(self) -> int:
        return self.txns[-1].end_lsn if self.txns else 16

    def history(self) -> History:
        return History(SYSTEM, self.timeline, self.wal_end, dict(self.switchpoints))


def _write(inc: Incarnation, sizes: list[int], origin: int) -> None:
    lsn = inc.wal_end
    for size in sizes:
        inc.txns.append(Txn(lsn + 8, lsn + 8 + size, origin))
        lsn += 8 + size


@st.composite
def lineages(draw: st.DrawFn) -> list[Incarnation]:
    """A chain of incarnations; each later one forked from the previous (promoted on a new
    timeline) at a point below its WAL end, then wrote transactions of its own."""
    first = Incarnation(1, [], {})
    _write(first, draw(st.lists(st.integers(1, 50), min_size=1, max_size=30)), 0)
    chain = [first]
    for origin in range(1, draw(st.integers(1, 4)) + 1):
        prev = chain[-1]
        # The standby received WAL up to the end of some transaction, maybe a bit more, and
        # at least up to where the old server's own timeline began.
        first = sum(t.end_lsn <= prev.start for t in prev.txns)
        keep = draw(st.integers(first, len(prev.txns)))
        base = prev.txns[keep - 1].end_lsn if keep else 16
        fork = max(prev.start, min(base + draw(st.integers(0, 7)), prev.wal_end))
        points = {**prev.switchpoints, prev.timeline: fork}
        inc = Incarnation(prev.timeline + 1, list(prev.txns[:keep]), points, fork)
        inc_start = fork
        sizes = draw(st.lists(st.integers(1, 50), max_size=30))
        lsn = inc_start
        for size in sizes:
            inc.txns.append(Txn(lsn + 8, lsn + 8 + size, origin))
            lsn += 8 + size
        chain.append(inc)
    return chain


def _skipped(current: Incarnation, below: int) -> list[Txn]:
    """Transactions of the current history a checkpoint at ``below`` makes the relay skip
    (``EosBatch.skip``: commit LSN below it)."""
    return [t for t in current.txns if t.final_lsn < below]


@settings(max_examples=400, deadline=None)
@given(lineages(), st.data())
def test_a_trusted_checkpoint_never_skips_what_its_history_did_not_hold(
    chain: list[Incarnation], data: st.DataObject
) -> None:
    recorded = data.draw(st.sampled_from(chain))
    if not recorded.txns:
        return
    # The checkpoint: the end LSN of some transaction committed in Kafka on that incarnation.
    last = data.draw(st.integers(0, len(recorded.txns) - 1))
    checkpoint = recorded.txns[last].end_lsn
    in_kafka = set(recorded.txns[: last + 1])
    current = chain[-1]
    below = trusted_below(checkpoint, SYSTEM, recorded.timeline, current.history())
    assert 0 <= below <= checkpoint
    for txn in _skipped(current, below):
        assert txn in in_kafka, (txn, below, checkpoint)


@settings(max_examples=400, deadline=None)
@given(lineages(), st.data())
def test_a_stream_never_starts_past_what_the_current_history_relayed(
    chain: list[Incarnation], data: st.DataObject
) -> None:
    """In-memory positions of an earlier incarnation, and the current database's own kept
    position (a value written after the WAL it names, so within the current history): the
    start never skips a transaction that neither relayed."""
    recorded = data.draw(st.sampled_from(chain))
    current = chain[-1]
    acked = data.draw(st.integers(0, len(recorded.txns)))
    remembered = recorded.txns[acked - 1].end_lsn if acked else 0
    relayed = set(recorded.txns[:acked])
    kept_n = data.draw(st.integers(0, len(current.txns)))
    kept = current.txns[kept_n - 1].end_lsn if kept_n else 0
    relayed |= set(current.txns[:kept_n])
    start = stream_start(remembered, (SYSTEM, recorded.timeline), kept, current.history())
    # START_REPLICATION skips transactions whose commit record starts below the start.
    for txn in _skipped(current, start):
        assert txn in relayed, (txn, start)


def test_a_restore_on_the_same_timeline_is_recognised_below_the_checkpoint() -> None:
    """A disk snapshot started as a primary: same system, same timeline, WAL rewritten from
    the snapshot's end. While its WAL end is below a recorded position, that position is not
    trusted (nothing skipped on its strength)."""
    restored = History(SYSTEM, 1, 5_000)
    assert trusted_below(6_000, SYSTEM, 1, restored) == 0
    assert stream_start(6_000, (SYSTEM, 1), 4_000, restored) == 4_000
    assert trusted_below(4_000, SYSTEM, 1, restored) == 4_000


def test_another_system_or_an_unknown_history_is_not_trusted_at_all() -> None:
    current = History(SYSTEM, 3, 10_000, {1: 500, 2: 900})
    assert trusted_below(800, "another", 3, current) == 0
    assert trusted_below(800, SYSTEM, None, current) == 0
    assert trusted_below(800, SYSTEM, 4, current) == 0  # a timeline the server never had
    assert trusted_below(800, SYSTEM, 1, current) == 500  # up to the fork of timeline 1
    assert trusted_below(800, SYSTEM, 2, current) == 800
    assert trusted_below(20_000, SYSTEM, 3, current) == 0  # beyond the WAL end: a restore
    assert stream_start(800, None, 300, current) == 300
    assert stream_start(800, (SYSTEM, 1), 300, current) == 500
    assert stream_start(800, (SYSTEM, 3), 20_000, current) == 800  # kept past the WAL end


def test_timeline_history_file() -> None:
    content = "1\t0/3000100\tno recovery target specified\n\n# comment\n2\t1/A0\tbefore x\n"
    assert parse_timeline_history(content) == {1: 0x3000100, 2: (1 << 32) | 0xA0}
    assert parse_timeline_history("") == {}
    for bad in ("1", "x\t0/1", "1\tnot-an-lsn"):
        try:
            parse_timeline_history(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
