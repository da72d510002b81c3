"""The guarantee ledger (cdc_outbox.cdc.ledger) against a simple model of PostgreSQL and Kafka.

Hypothesis draws random interleavings of PostgreSQL transactions, Kafka acknowledgements, Kafka
transactions closed and committed, marks, confirmations, in-process restarts (the open Kafka
transaction aborted, or its commit landed though reported failed), process crashes (the ledger
and the marker's buffer lost, a commit possibly done in Kafka but not known), slot recreation (a
catch-up publishes what is PENDING) and timeline switches (a failover to a standby that was
behind: WAL past the switchpoint, with its transactions, marks, kept positions and slot
confirmations, is gone; the standby's synced slot is where the standby saw it). The relay is
played by the ledger's rules alone: the session start is :meth:`Ledger.restart_from` and the
server's ``max(start, confirmed_flush)``, skips are :meth:`Ledger.skip`, every confirmation
:meth:`Ledger.confirmable` (then kept).

Checked: at every step, every transaction up to the slot's confirmed position is visible to a
``read_committed`` reader; at every session start, every transaction below the start is
visible and marked (or its id is with the marker); after a quiet end, the events visible of
the current history's transactions are exactly those transactions' events, exactly once
(exactly-once, unless a catch-up re-published what had lost its mark) or at least once
(at-least-once), and every row
is PUBLISHED.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import example, given, note, settings
from hypothesis import strategies as st

from cdc_outbox.cdc.eos_batch import EosBatch
from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.ledger import Ledger

SYSTEM = "7000"
EXAMPLES = int(os.environ.get("CDC_OUTBOX_LEDGER_EXAMPLES", "300"))


@dataclass(frozen=True)
class Txn:
    final: int  # Begin's final LSN (the commit record)
    end: int  # Commit's end LSN
    ids: tuple[str, ...]


@dataclass
class Session:
    """One streaming session of the relay process: what it read and what is in Kafka's hands."""

    read_pos: int  # the next transaction streamed is the first with final >= read_pos
    sent_flush: int
    # at least once: unacknowledged records; exactly-once: the open Kafka transaction's
    records: list[tuple[int, str]] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)  # indexes into records (exactly-once)
    closing: list[tuple[int, str]] = field(default_factory=list)
    closing_acked: set[int] = field(default_factory=set)


class World:
    def __init__(self, eos: bool) -> None:
        self.eos = eos
        # PostgreSQL: the current history
        self.timeline = 1
        self.switchpoints: dict[int, int] = {}
        self.wal = 0
        self.txns: list[Txn] = []
        self.marked_at: dict[str, int | None] = {}  # row id -> LSN of its PUBLISHED mark
        self.kept_writes: list[tuple[int, int]] = []  # (LSN written at, kept position)
        self.slot_writes: list[tuple[int, int]] = [(0, 0)]  # (LSN, confirmed_flush)
        self.slot_created = 0
        self.phase_written = 0  # LSN of the relay state's STREAMING after the last catch-up
        # Kafka
        self.visible: list[str] = []  # what a read_committed reader sees, in order
        self.checkpoint: tuple[int, str, int | None] | None = None
        self.next_id = 0
        self.catch_ups = 0
        self.new_process()

    # -- the relay process -------------------------------------------------------------------

    def new_process(self) -> None:
        self.ledger = Ledger(EosBatch(1.0, 1000) if self.eos else None)
        self.handed: list[str] = []  # ids handed to the published-marker
        self.settled = 0
        self.session: Session | None = None

    def history(self) -> History:
        return History(SYSTEM, self.timeline, self.wal, dict(self.switchpoints))

    @property
    def slot(self) -> int:
        return self.slot_writes[-1][1]

    @property
    def kept(self) -> int:
        return self.kept_writes[-1][1] if self.kept_writes else 0

    def connect(self) -> Session:
        if self.session is None:
            history = self.history()
            if self.eos:
                batch = self.ledger.batch
                assert batch is not None
                batch.aborted()  # a new producer: whatever was open is aborted
                self.ledger.trust_checkpoint(history, self.checkpoint)
            start = max(self.ledger.restart_from(history, self.kept), self.slot)
            self.check_start(start)
            # As the relay: marked and the first status update begin at what the slot has
            # confirmed, not at a start remembered past it.
            self.ledger.start_session(history, start, confirmed=self.slot, handed=len(self.handed))
            self.session = Session(read_pos=start, sent_flush=min(self.slot, start))
        return self.session

    # -- steps -------------------------------------------------------------------------------

    def write(self, events: int) -> None:
        ids = tuple(f"e{self.next_id + i}" for i in range(events))
        self.next_id += events
        txn = Txn(self.wal + 1, self.wal + 2, ids)
        self.wal = txn.end
        self.txns.append(txn)
        for i in ids:
            self.marked_at[i] = None

    def read(self) -> None:
        s = self.connect()
        tracker = self.ledger.acked
        txn = next((t for t in self.txns if t.final >= s.read_pos), None)
        if txn is None:
            tracker.keepalive(self.wal)
            return
        s.read_pos = txn.end
        txn_id = tracker.begin()
        batch = self.ledger.batch
        if self.ledger.skip(txn.final):
            self.handed += txn.ids  # already in Kafka: only marked
        else:
            if batch is not None:
                batch.begin()
            for i in txn.ids:
                tracker.add_event(txn_id)
                if batch is not None:
                    batch.add_event(0.0)
                s.records.append((txn_id, i))
            if batch is not None:
                batch.end(txn.end, had_events=bool(txn.ids))
        tracker.commit(txn_id, txn.end)

    def ack(self, pick: int) -> None:
        s = self.connect()
        if not self.eos:
            if s.records:
                txn_id, i = s.records.pop(pick % len(s.records))
                self.visible.append(i)
                self.handed.append(i)
                self.ledger.acked.ack(txn_id)
            return
        records, acked = (s.closing, s.closing_acked) if s.closing else (s.records, s.acked)
        left = [n for n in range(len(records)) if n not in acked]
        if left:
            n = left[pick % len(left)]
            acked.add(n)
            self.ledger.acked.ack(records[n][0])

    def close(self) -> None:
        s, batch = self.connect(), self.ledger.batch
        if batch is None or batch.closing or batch.in_txn or not batch.events:
            return
        batch.close()
        s.closing, s.closing_acked = s.records, s.acked
        s.records, s.acked = [], set()

    def commit(self, *, then_crash: bool = False, then_restart: bool = False) -> None:
        s, batch = self.connect(), self.ledger.batch
        if batch is None or not batch.closing or len(s.closing_acked) < len(s.closing):
            return
        history = self.ledger.committed_in
        assert history is not None
        self.visible += [i for _, i in s.closing]
        self.checkpoint = (batch.closing_end_lsn, SYSTEM, history.timeline)
        if then_crash:  # committed in Kafka, not known to the process
            self.crash()
            return
        if then_restart:  # committed in Kafka, reported failed: the same process restarts
            self.restart()
            return
        batch.committed()
        self.handed += [i for _, i in s.closing]
        s.closing, s.closing_acked = [], set()

    def mark(self) -> None:
        todo = self.handed[self.settled :]
        self.settled = len(self.handed)
        self.wal += 1
        for i in todo:
            if i in self.marked_at and self.marked_at[i] is None:
                self.marked_at[i] = self.wal

    def confirm(self) -> None:
        s = self.connect()
        # As the Checkpointer: every status update sends max(confirmable, sent), a new
        # position only once kept; the server takes whatever flush it is sent.
        flushed = max(self.ledger.confirmable(len(self.handed), self.settled), s.sent_flush)
        if flushed > s.sent_flush:
            self.wal += 1
            self.kept_writes.append((self.wal, flushed))
        if flushed > self.slot:
            self.slot_writes.append((self.wal, flushed))
        s.sent_flush = flushed
        self.check_confirmed()

    def restart(self, delivered: int = 0) -> None:
        """The stream or the Kafka transaction fails: at least once, records without a report
        may still have been delivered (bit n of ``delivered``); exactly-once aborts."""
        s = self.session
        if s is not None and not self.eos:
            for n, (_, i) in enumerate(s.records):
                if delivered >> (n % 16) & 1:
                    self.visible.append(i)
        self.session = None

    def crash(self, delivered: int = 0) -> None:
        self.restart(delivered)
        self.new_process()

    def recreate_slot(self, marks_flushed: bool) -> None:
        """The slot is dropped and made again (invalidated, failover before 17): a new relay
        process publishes what is PENDING from the snapshot, then streams from the slot's
        consistent point."""
        if marks_flushed:
            self.mark()
        self.crash()
        self.wal += 1
        self.slot_created = self.wal
        self.slot_writes.append((self.wal, self.wal))
        pending = [i for i, at in self.marked_at.items() if at is None]
        if self.eos:  # one Kafka transaction with the catch-up's ids in its checkpoint
            history = self.history()
            self.ledger.trust_checkpoint(history, self.checkpoint)
            batch = self.ledger.batch
            assert batch is not None
            self.checkpoint = (batch.committed_lsn, SYSTEM, self.timeline)
        self.visible += pending
        self.handed += pending
        self.mark()
        self.wal += 1
        self.phase_written = self.wal
        self.catch_ups += 1

    def failover(self, pick: int) -> None:
        """Promote a standby that had WAL up to a switchpoint; the relay reconnects to its synced
        slot, or, if the standby lacks the slot or the end of the last catch-up (the relay
        state's phase), the service catches up again."""
        points = sorted({0, self.wal, *(t.end for t in self.txns)})
        point = points[pick % len(points)]
        self.txns = [t for t in self.txns if t.end <= point]
        alive = {i for t in self.txns for i in t.ids}
        self.marked_at = {
            i: (at if at is not None and at <= point else None)
            for i, at in self.marked_at.items()
            if i in alive
        }
        self.kept_writes = [(at, k) for at, k in self.kept_writes if at <= point]
        self.slot_writes = [(at, c) for at, c in self.slot_writes if at <= point] or [(0, 0)]
        self.switchpoints[self.timeline] = point
        self.timeline += 1
        self.wal = point
        self.restart()
        if point < self.phase_written:  # the slot or the catch-up's end is not on the standby
            self.phase_written = 0
            self.recreate_slot(marks_flushed=False)

    # -- checks ------------------------------------------------------------------------------

    def current_ids(self) -> list[str]:
        return [i for t in self.txns for i in t.ids]

    def check_start(self, start: int) -> None:
        """Nothing the session will not stream is unpublished, or unmarked with no marker
        holding its id."""
        seen = set(self.visible)
        owned = set(self.handed[self.settled :])
        for t in self.txns:
            if t.final < start:
                assert set(t.ids) <= seen, f"start {start} skips unpublished {t}"
                unmarked = {i for i in t.ids if self.marked_at[i] is None} - owned
                assert not unmarked, f"start {start} skips unmarked {t}"

    def check_confirmed(self) -> None:
        seen = set(self.visible)
        for t in self.txns:
            if t.end <= self.slot:
                assert set(t.ids) <= seen, f"confirmed {self.slot} past unpublished {t}"

    def quiesce(self, rounds: int | None = None) -> None:
        """Read, acknowledge, commit, mark and confirm everything (``rounds`` times, default
        enough for all)."""
        for _ in range(4 * len(self.txns) + 10 if rounds is None else rounds):
            self.read()
            s = self.connect()
            while s.records and not self.eos:
                self.ack(0)
            if self.eos:
                for _ in range(2):
                    for _ in range(len(s.records) + len(s.closing)):
                        self.ack(0)
                    self.close()
                    self.commit()
            self.mark()
            self.confirm()


#: Mostly the normal flow, a fault now and then (a fault every other step hides the slow
#: paths). The argument: events written (mod 4), which record is acknowledged, which records
#: of an abandoned session were delivered all the same (bits), whether the marker flushed
#: before a slot recreation (bit 0), where a failover's standby stopped, how many rounds a
#: drain (read, acknowledge, commit, mark, confirm all) does.
_OPS = (
    ["write", "read", "ack"] * 4
    + ["close", "commit", "mark", "confirm"] * 2
    + ["drain", "commit_then_crash", "commit_then_restart", "restart", "crash"]
    + ["recreate_slot", "failover"]
)
STEPS = st.tuples(st.sampled_from(_OPS), st.integers(0, 2**16 - 1))


def steps_of(rng: random.Random) -> list[tuple[str, int]]:
    """A run drawn by ``rng`` (hypothesis's own lists lean towards their first choices and
    short runs, which hardly ever reach the paths here; its Random is drawn and reproduced
    like any other value)."""
    return [(rng.choice(_OPS), rng.randrange(2**16)) for _ in range(rng.randint(10, 80))]


def play(eos: bool, steps: list[tuple[str, int]]) -> World:
    world = World(eos)
    for step, arg in steps:
        if step == "commit_then_crash":
            world.commit(then_crash=True)
        elif step == "commit_then_restart":
            world.commit(then_restart=True)
        elif step == "recreate_slot":
            world.recreate_slot(bool(arg & 1))
        elif step == "drain":
            world.quiesce(1 + arg % 3)
        elif step == "write":
            world.write(arg % 4)
        elif step in ("ack", "restart", "crash", "failover"):
            getattr(world, step)(arg)
        else:
            getattr(world, step)()
        world.check_confirmed()
    world.restart()
    world.quiesce()
    return world


def check_outcome(world: World) -> None:
    rows = world.current_ids()
    counts = Counter(i for i in world.visible if i in world.marked_at)
    assert set(counts) == set(rows), f"lost: {sorted(set(rows) - set(counts))}"
    if world.eos and not world.catch_ups:
        duplicated = sorted(i for i, n in counts.items() if n > 1)
        assert not duplicated, f"exactly-once duplicated {duplicated}"
    pending = sorted(i for i, at in world.marked_at.items() if at is None)
    assert not pending, f"left PENDING: {pending}"


#: Found by this test: a failover lost the mark of a row the relay had acknowledged; the relay
#: re-streamed from its in-memory position (trusted up to the switchpoint), past that row,
#: which stayed PENDING. Acked is now trusted only on the timeline it was recorded on.
LOST_MARK = [("write", 1), ("read", 0), ("ack", 0), ("mark", 0), ("failover", 1)]


#: Issue 37 item 2: a Kafka commit that landed but was reported failed, then a restart in the
#: same process: the checkpoint read at the restart holds the batch, whose ids never went to
#: the marker; the restart started after it and the slot was confirmed past unmarked rows.
LANDED_THEN_RESTART = [
    ("write", 1), ("read", 0), ("ack", 0), ("close", 0), ("commit_then_restart", 0),
    ("read", 0), ("confirm", 0),
]  # fmt: skip


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.booleans(), st.randoms(use_true_random=False))
def test_random_interleavings_deliver_every_committed_transaction(
    eos: bool, rng: random.Random
) -> None:
    steps = steps_of(rng)
    note(f"steps={steps}")
    check_outcome(play(eos, steps))


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(st.booleans(), st.lists(STEPS, min_size=3, max_size=40))
@example(False, LOST_MARK)
@example(True, [*LOST_MARK[:3], ("close", 0), ("commit", 0), *LOST_MARK[3:]])
def test_short_interleavings_deliver_every_committed_transaction(
    eos: bool, steps: list[tuple[str, int]]
) -> None:
    """The same with hypothesis's lists: shrinks to a minimal run."""
    check_outcome(play(eos, steps))


def test_an_aborted_kafka_transaction_is_streamed_again() -> None:
    """Acknowledged inside a Kafka transaction that was then aborted: the restart starts at
    the last Kafka commit, not at what was acknowledged."""
    world = World(True)
    world.write(1), world.read(), world.ack(0)
    assert world.ledger.acked.confirmed == 2
    world.restart()
    assert world.connect().read_pos == 0


def test_a_commit_that_landed_though_reported_failed_is_marked_before_it_is_skipped() -> None:
    world = play(True, LANDED_THEN_RESTART)
    assert world.checkpoint is not None and world.visible == ["e0"]
    check_outcome(world)


def test_a_failover_trusts_the_checkpoint_only_below_the_switchpoint() -> None:
    steps = [("write", 1), ("write", 1)] + [("read", 0), ("ack", 0)] * 2
    world = play(True, [*steps, ("close", 0), ("commit", 0), ("failover", 1), ("write", 2)])
    assert world.checkpoint is not None and world.timeline == 2
    check_outcome(world)
    assert Counter(world.visible)["e2"] == 1  # a new transaction reusing the old one's LSNs
