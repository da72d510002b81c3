"""Route the decoded pgoutput messages of one streaming session (the relay's hot path).

Contract of :class:`MessageRouter`: per XLogData payload, in stream order,
- ``B``: a new transaction handle on the session's ack tracker (exactly-once: a transaction the
  checkpoint topic already holds is skipped whole; its events' ids still go to the
  published-marker, since a crash after the Kafka commit may have kept them from it);
- ``I`` on an outbox relation whose rows of this transaction a catch-up published
  (:meth:`MessageRouter.streamed_from`: its commit LSN is below the table's "streamed from"
  LSN, :mod:`cdc_outbox.cdc.new_tables`): counted and ignored; else mapped with *its*
  outbox's mapper (each configured outbox table has its own layout and topic template) and
  submitted to
  :class:`~cdc_outbox.delivery.engine.Delivery` under the transaction's handle, with its
  outbox's index (:mod:`cdc_outbox.delivery.outcomes`); inserts into other tables are counted
  and ignored;
- ``C``: the transaction's end LSN goes to the tracker (and the exactly-once batch) and is noted
  as written for the checkpointer;
- ``R``: relation cache, and which relations are which outbox, by (schema, table);
- ``M``: a ``cdc_outbox.redrive`` message for one of the outboxes releases its aggregates
  (of that table) here; one with the ``message_prefix`` (table-less events,
  :mod:`cdc_outbox.cdc.message_events`, mapped with the first outbox's mapper, outbox
  :data:`~cdc_outbox.delivery.outcomes.TABLELESS`) is an event of its transaction, treated as
  an insert is; a non-transactional one is refused: a
  dead letter (and ``stats.refused_messages``) as a transaction of its own ending just past
  its LSN, so the slot is confirmed past it only once the dead letter is acknowledged;
- anything else is counted in ``stats.ignored``.
A relation must be described before it is used; otherwise decoding raises.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cdc_outbox.cdc import pacing
from cdc_outbox.cdc.ack_tracker import AckTracker
from cdc_outbox.cdc.eos import EosCommitter
from cdc_outbox.cdc.message_events import NON_TRANSACTIONAL, MessageEvents
from cdc_outbox.cdc.slot_feedback import Checkpointer
from cdc_outbox.cdc.txn_handle import TxnHandle
from cdc_outbox.config.cdc import RouterSection
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.delivery.outcomes import TABLELESS
from cdc_outbox.delivery.policy import parking_key
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.pgwire import pgoutput
from cdc_outbox.pgwire.walproto import (
    XLOG_HEADER_SIZE,
    Keepalive,
    parse_copy_data,
    pg_clock_to_unix,
)
from cdc_outbox.records import DeadLetter, OutboxRecord
from cdc_outbox.store.redrive import parse_redrive_message
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

_BEGIN, _COMMIT, _INSERT, _RELATION, _MESSAGE = ord("B"), ord("C"), ord("I"), ord("R"), ord("M")
_XLOGDATA = ord("w")
_FRAMES_PER_TURN = 2000
_decode_insert = pgoutput.decode_insert

#: An outbox relation as the router keeps it: the Relation, its mapper's ``map_insert``, and
#: the outbox's index.
_MapInsert = Callable[[pgoutput.Relation, pgoutput.TupleData], OutboxRecord | DeadLetter]
_Outbox = tuple[pgoutput.Relation, _MapInsert, int]


class MessageRouter:
    """Dispatches one session's pgoutput messages (see the module contract)."""

    def __init__(
        self,
        section: RouterSection,
        mappers: Sequence[OutboxMapper],
        delivery: Delivery,
        stats: RelayStats,
        eos: EosCommitter | None,
    ) -> None:
        """``mappers``: each configured outbox's, in configuration order."""
        self.section = section
        self._mappers = tuple(mappers)
        self.delivery = delivery
        self.stats = stats
        self.eos = eos
        self._relations = pgoutput.RelationCache()
        self._outbox_relations: dict[int, _Outbox] = {}
        #: (schema, table) -> outbox index; "schema.table" -> index (redrive messages)
        self._by_relation = {(m.schema, m.table): n for n, m in enumerate(self._mappers)}
        self._by_name = {f"{m.schema}.{m.table}": n for n, m in enumerate(self._mappers)}
        self._tracker = AckTracker(0)
        self._txn = TxnHandle(self._tracker, stats, -1)
        self._checkpoint: Checkpointer | None = None
        self._skipping = False
        #: outbox index -> LSN: rows of transactions committed below it are not streamed
        self._from: dict[int, int] = {}
        self._late: frozenset[int] = frozenset()  # outboxes whose rows this txn skips
        self._submit = delivery.submit
        prefix = section.message_prefix
        first = self._mappers[0]
        self._events = MessageEvents(prefix, section.columns, first) if prefix else None
        #: The last :meth:`read_turn` ended on a read that found nothing (caught up).
        self.caught_up = False
        self._linger = pacing.Linger()
        self._clock: Callable[[], float] = time.monotonic  # tests drive both
        self._sleep: Callable[[float], None] = time.sleep

    def streamed_from(self, lsns: dict[int, int]) -> None:
        """For this session: outbox index -> the LSN from which the stream publishes its
        rows (those of transactions committed below it were published by a catch-up)."""
        self._from = dict(lsns)
        self._late = frozenset()

    def new_session(self, tracker: AckTracker, checkpoint: Checkpointer) -> None:
        """A new stream: relations are described again; positions go to these."""
        self._relations.clear()
        self._outbox_relations.clear()
        self._tracker = tracker
        self._checkpoint = checkpoint
        self._skipping = False

    def read_turn(
        self,
        read: Callable[[float], memoryview | bytes | None],
        is_leader: Callable[[], bool],
        stopping: Callable[[], bool],
    ) -> None:
        """Handle the CopyData frames ``read`` gives now (waiting briefly if there are none),
        up to ``max_in_flight`` unacknowledged events, a stop, or (exactly-once) a commit at
        which the Kafka transaction wants attention; keepalives go to the tracker and the
        checkpointer. A turn that ends caught up (:attr:`caught_up`, by
        :func:`~cdc_outbox.cdc.pacing.caught_up`) has librdkafka send what it holds at
        once (:func:`~cdc_outbox.cdc.pacing.send_now`); at-least-once, while
        transactions keep coming, after holding it once for the ones that follow
        (:class:`~cdc_outbox.cdc.pacing.Linger`: at most ``LINGER_S``, reading them
        after it, not as each arrives)."""
        publisher = self.delivery.publisher
        eos = self.eos
        tracker = self._tracker
        checkpoint = self._checkpoint
        assert checkpoint is not None, "new_session() comes first"
        wait = 0.0 if tracker.in_flight or len(publisher) else 0.1
        if wait and eos is not None:  # wake up when the Kafka transaction is due
            due_in = eos.batch.seconds_to_due(time.monotonic())
            wait = wait if due_in is None else min(wait, due_in)
        limit = self.section.max_in_flight
        self.caught_up = False
        held = eos is not None  # exactly-once: never held (its Kafka transaction batches)
        for n in range(_FRAMES_PER_TURN):
            # A leader frozen mid-turn (SIGSTOP, a VM pause) may wake with WAL buffered that
            # its successor streams too: it stops within 64 frames, not 2,000.
            if n & 63 == 63 and not is_leader():
                return
            data = read(wait)
            if data is None:
                committed = self._txn.commit_unix  # 0.0 while a transaction is open
                idle = pacing.caught_up(True, time.time() - committed if committed else 0.0)
                self.caught_up = idle
                if idle and eos is not None and eos.due(caught_up=True):
                    return  # the Kafka transaction closes first: its checkpoint goes out too
                if pacing.send_now(publisher.unacknowledged, caught_up=idle, reading=True):
                    # Between transactions only: a pause inside one (a large transaction's
                    # frames arriving in parts) says nothing of the load.
                    between = committed != 0.0
                    if not held and between:
                        held = True
                        hold = min(self._linger.hold_s(self._clock()), publisher.linger_s)
                        if hold:
                            self._sleep(hold)  # the transactions that follow, read after it
                            continue
                    publisher.send_now(0.002)
                    if between:
                        self._linger.sent(self._clock())
                elif tracker.in_flight:
                    publisher.poll(0.002)
                return
            wait = 0.0
            if data[0] == _XLOGDATA:
                self.handle(bytes(data[XLOG_HEADER_SIZE:]))
                if tracker.in_flight >= limit or stopping():
                    return
                if eos is not None and data[XLOG_HEADER_SIZE] == _COMMIT and eos.turn_ends():
                    return
                continue
            frame = parse_copy_data(data)
            assert isinstance(frame, Keepalive)
            checkpoint.note_written(frame.wal_end)
            tracker.keepalive(frame.wal_end)
            if frame.reply_requested:
                checkpoint.send()

    def handle(self, payload: bytes) -> None:
        """One XLogData payload (a pgoutput message)."""
        kind = payload[0]
        if kind == _INSERT:
            oid, row = _decode_insert(payload)
            outbox = self._outbox_relations.get(oid)
            if outbox is None:
                self._relations.get(oid)  # raises for a relation never described
                self._count_ignored("insert_other_table")
                return
            rel, map_insert, n = outbox
            if self._late and n in self._late:
                self._count_ignored("caught_up_before_streaming")
                return
            if self._skipping:
                self._skipped(rel, row, n)
                return
            txn = self._txn
            txn.add_event()
            if self.eos is not None:
                self.eos.add_event()
            self._submit(map_insert(rel, row), txn, n)
            return
        tracker = self._tracker
        if kind == _BEGIN:
            self._txn = TxnHandle(tracker, self.stats, tracker.begin(), timed=self.eos is None)
            if self._from:
                self._late_tables(payload)
            if self.eos is not None:
                self._skipping = self.eos.on_begin(payload)
        elif kind == _COMMIT:
            msg = pgoutput.decode(payload)
            assert isinstance(msg, pgoutput.Commit)
            tracker.commit(self._txn.txn_id, msg.end_lsn)
            if self.eos is not None and not self._skipping:
                self.eos.on_commit(msg.end_lsn, self._txn)
            self._skipping = False
            self._txn.commit_unix = pg_clock_to_unix(msg.commit_time)
            self._note_written(msg.end_lsn)
            self.stats.transactions += 1
        elif kind == _RELATION:
            rel_msg = pgoutput.decode(payload)
            assert isinstance(rel_msg, pgoutput.Relation)
            self._relations.put(rel_msg)
            which = self._by_relation.get((rel_msg.namespace, rel_msg.name))
            if which is not None:
                mapper = self._mappers[which]
                self._outbox_relations[rel_msg.oid] = (rel_msg, mapper.map_insert, which)
            else:
                self._outbox_relations.pop(rel_msg.oid, None)
        elif kind == _MESSAGE:
            message = pgoutput.decode(payload)
            assert isinstance(message, pgoutput.Message)
            self._on_message(message)
        else:
            other = pgoutput.decode(payload)
            self._count_ignored(type(other).__name__.lower())

    def _late_tables(self, begin: bytes) -> None:
        """At a Begin: the outboxes whose rows of this transaction a catch-up published
        (commit LSN below their "streamed from" LSN); once past every such LSN, none ever."""
        final_lsn = int.from_bytes(begin[1:9], "big")
        self._late = frozenset(n for n, lsn in self._from.items() if final_lsn < lsn)
        if not self._late:
            self._from = {}  # the stream only moves forward within a session

    def _on_message(self, message: pgoutput.Message) -> None:
        """A table-less event, or a redrive message for this outbox: it releases its
        aggregates here, in stream order."""
        events = self._events
        if events is not None and message.prefix == events.prefix:
            if not message.transactional:
                self._refuse(message)
            elif self._skipping:
                self._count_ignored("already_in_kafka")
                self.stats.eos_skipped_events += 1
            else:
                txn = self._txn
                txn.add_event()
                if self.eos is not None:
                    self.eos.add_event()
                self._submit(events.map(message.content), txn, TABLELESS)
            return
        request = parse_redrive_message(message.prefix, message.transactional, message.content)
        n = None if request is None else self._by_name.get(request.table)
        if request is None:
            self._count_ignored("message")
        elif n is not None:
            for aggregate in request.aggregates:
                key = parking_key(n, aggregate.encode())
                assert key is not None
                if not self.delivery.parking.release(key, request.ids):
                    logger.warning(
                        "redrive of aggregate %s left out events parked meanwhile; it stays"
                        " parked: run `cdc-outbox redrive` again",
                        aggregate,
                    )

    def _refuse(self, message: pgoutput.Message) -> None:
        """A non-transactional event message: dead-lettered, never published (module contract)."""
        logger.error(
            "refused a non-transactional message with prefix %r at LSN %X: %s (dead-lettered)",
            message.prefix,
            message.lsn,
            NON_TRANSACTIONAL,
        )
        refused = self.stats.refused_messages
        refused[NON_TRANSACTIONAL] = refused.get(NON_TRANSACTIONAL, 0) + 1
        tracker, eos = self._tracker, self.eos
        txn = TxnHandle(tracker, self.stats, tracker.begin(), timed=False)
        if eos is not None:
            eos.batch.begin()
            eos.add_event()
        txn.add_event()
        dead = DeadLetter(NON_TRANSACTIONAL, None, None, message.content, [], None)
        self._submit(dead, txn, TABLELESS)
        end = message.lsn + 1  # a restart does not decode it again (start_decoding_at > LSN)
        tracker.commit(txn.txn_id, end)
        if eos is not None:
            eos.on_commit(end, txn)
        self._note_written(end)

    def _skipped(self, rel: pgoutput.Relation, row: pgoutput.TupleData, outbox: int) -> None:
        """An insert of a transaction Kafka already holds: not sent again, but marked (in its
        own outbox table)."""
        self._count_ignored("already_in_kafka")
        self.stats.eos_skipped_events += 1
        marker = self.delivery.marker
        if marker is not None:
            event_id = self._mappers[outbox].map_insert(rel, row).event_id
            if event_id is not None:
                marker.add(event_id.encode(), outbox)

    def _note_written(self, lsn: int) -> None:
        assert self._checkpoint is not None, "new_session() comes first"
        self._checkpoint.note_written(lsn)

    def _count_ignored(self, what: str) -> None:
        self.stats.ignored[what] = self.stats.ignored.get(what, 0) + 1
