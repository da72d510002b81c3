"""The guarantee ledger: every position the CDC relay's guarantee rests on, in one place (pure).

Positions, all LSNs of the WAL history they were recorded in:

* **acked** (:attr:`Ledger.acked`, an :class:`~cdc_outbox.cdc.ack_tracker.AckTracker`): end LSN
  of the newest transaction whose events, and every earlier one's, Kafka acknowledged (or were
  durably dead-lettered); one tracker per streaming session.
* **committed** (:attr:`Ledger.batch`, an :class:`~cdc_outbox.cdc.eos_batch.EosBatch`,
  exactly-once only): end LSN of the newest PostgreSQL transaction in a committed Kafka
  transaction (from this process, or the checkpoint topic as far as it is trusted).
* **marked** (:attr:`Ledger.marked`): the newest position whose events are all marked
  PUBLISHED in the outbox table.
* **confirmed** (:meth:`Ledger.confirmable`): what the slot may be told is flushed: acked,
  capped by committed while a Kafka transaction holds events, capped by marked.
* **kept**: the confirmed position persisted in the relay state table before it is sent
  (:meth:`Ledger.kept`; a state table that cannot keep it stops being asked).

Transitions and their rules:

* :meth:`Ledger.restart_from`: a session (re)starts from acked (at-least-once) or
  ``min(acked, committed)`` (exactly-once: never past an aborted Kafka transaction), or from
  kept, whichever is greater (:func:`~cdc_outbox.cdc.history.stream_start`). Exactly-once,
  committed there is what this process knew before the session's checkpoint read
  (:attr:`Ledger.handed_committed`): a checkpoint past it holds a Kafka commit whose ids
  never reached the marker (one that landed but was reported failed, or another producer's),
  so its transactions are streamed again, skipped and marked before the slot passes them.
  Acked is trusted only in the history (system, timeline) it was recorded in, up to its WAL
  end: on a new timeline the marks behind it may be gone with the WAL past the switchpoint,
  so only kept (a value of the database itself, written after the marks it covers) and the
  slot say where to start; what is re-streamed and already in Kafka is skipped
  (exactly-once) or published again (at-least-once), and marked either way.
* :meth:`Ledger.start_session`: the slot streams from ``start``; new acked positions begin
  there, recorded in the server's history. A restarted session may start past what the slot
  has confirmed (``confirmed``: acked or committed in the last session, remembered in memory);
  marked then begins at ``confirmed`` and reaches ``start`` only once the marker settled every
  id handed to it before the session began, and the Checkpointer keeps ``start`` before it
  confirms it: a start is confirmed like any other position, never just because it was
  streamed from.
* :meth:`Ledger.trust_checkpoint` (exactly-once, every session): committed becomes what Kafka
  holds of the current history: this process's commits and the last checkpoint, each trusted
  only up to where its history and the current one agree
  (:func:`~cdc_outbox.cdc.history.trusted_below`); transactions below it are skipped
  (:meth:`Ledger.skip`), nothing else. A new timeline trusts only what lies below its fork
  point; an unknown history or system trusts nothing (published again: duplicates, not losses).
* A new slot incarnation on the same timeline starts past every position written before, so a
  trusted position never skips what it sends.
"""

from __future__ import annotations

from collections import deque

from cdc_outbox.cdc.ack_tracker import AckTracker
from cdc_outbox.cdc.eos_batch import EosBatch
from cdc_outbox.cdc.history import History, stream_start, trusted_below

__all__ = ["Checkpoint", "Ledger", "MarkedWatermark"]

#: ``(end LSN, system identifier, timeline or None)`` of a checkpoint read from Kafka.
Checkpoint = tuple[int, str, int | None]


class MarkedWatermark:
    """The newest confirmable position whose events are all marked published.

    :meth:`note` ``(position, handed)``: every event up to ``position`` was acknowledged, so
    its id had been handed to the marker by the time ``handed`` was read. :meth:`through`
    ``(settled)``: the newest noted position with ``handed <= settled`` (else the start).
    """

    __slots__ = ("_noted", "_pending", "position")

    def __init__(self, start: int) -> None:
        self.position = start
        self._noted = start
        self._pending: deque[list[int]] = deque()  # [position, handed], both increasing

    def note(self, position: int, handed: int) -> None:
        if position <= self._noted:
            return
        self._noted = position
        pending = self._pending
        if pending and pending[-1][1] == handed:
            pending[-1][0] = position  # nothing new to wait for: the later position covers it
        else:
            pending.append([position, handed])

    def through(self, settled: int) -> int:
        pending = self._pending
        while pending and pending[0][1] <= settled:
            self.position = pending.popleft()[0]
        return self.position


class Ledger:
    """The relay's positions across its sessions (see the module rules). ``batch``: the
    exactly-once batch, ``None`` for at-least-once."""

    __slots__ = (
        "acked",
        "acked_in",
        "batch",
        "committed_in",
        "handed_committed",
        "keeps",
        "marked",
    )

    def __init__(self, batch: EosBatch | None = None) -> None:
        self.acked = AckTracker(0)
        self.batch = batch
        self.marked = MarkedWatermark(0)
        #: (system id, timeline) of the session the acked positions come from.
        self.acked_in: tuple[str, int] | None = None
        #: The history the committed position was last trusted in.
        self.committed_in: History | None = None
        #: Exactly-once: committed as this process knew it before the session's checkpoint
        #: read (its commits' ids went to the marker at the commit; the transactions below a
        #: checkpoint it read before were skipped and marked where acked reached them).
        self.handed_committed = 0
        self.keeps = True  # False once the state table answered it cannot keep positions

    def restart_from(self, history: History, kept: int) -> int:
        """Where the next session asks the slot to start (see the module rules)."""
        remembered = self.acked.confirmed
        if self.batch is not None:
            remembered = min(remembered, self.batch.committed_lsn, self.handed_committed)
        same = self.acked_in == (history.system_id, history.timeline)
        return stream_start(remembered, self.acked_in if same else None, kept, history)

    def start_session(
        self, history: History, start: int, *, confirmed: int | None = None, handed: int = 0
    ) -> AckTracker:
        """The slot streams from ``start`` in ``history``: fresh acked and marked positions.
        ``confirmed`` (default ``start``): what the slot has confirmed; ``handed``: the ids
        handed to the published-marker so far (every event below ``start`` is among them)."""
        floor = start if confirmed is None else min(confirmed, start)
        self.acked_in = (history.system_id, history.timeline)
        self.acked = AckTracker(start)
        self.marked = MarkedWatermark(floor)
        self.marked.note(start, handed)
        return self.acked

    def trust_checkpoint(self, history: History, last: Checkpoint | None) -> int:
        """Exactly-once session start (nothing open in Kafka): committed becomes
        what Kafka holds of ``history`` (this process's commits, and ``last``, each as far as
        trusted). Returns how much of ``last`` is trusted (0 without one)."""
        batch = self._require_batch()
        previous = self.committed_in
        memory = 0
        if previous is not None:
            memory = trusted_below(
                batch.committed_lsn, previous.system_id, previous.timeline, history
            )
        kafka = 0
        if last is not None:
            end_lsn, system_id, timeline = last
            if timeline is None and history.timeline == 1:
                timeline = 1  # written before timelines were recorded: only 1 existed
            kafka = trusted_below(end_lsn, system_id, timeline, history)
        self.committed_in = history
        self.handed_committed = memory
        batch.rebase(max(memory, kafka))
        return kafka

    def skip(self, final_lsn: int) -> bool:
        """Exactly-once: Kafka already holds the transaction committed at ``final_lsn``."""
        return self.batch is not None and self.batch.skip(final_lsn)

    def ceiling(self) -> int | None:
        """Highest position the slot may be confirmed to by Kafka commits (``None``: none)."""
        return None if self.batch is None else self.batch.ceiling()

    def confirmable(self, handed: int | None = None, settled: int = 0) -> int:
        """Acked, capped by :meth:`ceiling` and, with a published-marker (``handed`` ids handed
        to it so far, ``settled`` of them marked), by marked."""
        confirmed = self.acked.confirmed
        ceiling = self.ceiling()
        if ceiling is not None:
            confirmed = min(confirmed, ceiling)
        if handed is not None:
            # The ids of the events up to ``confirmed`` were handed over before it moved (at
            # least once: on acknowledgement; exactly-once: at the Kafka commit, which moves
            # the ceiling, on this thread).
            self.marked.note(confirmed, handed)
            confirmed = self.marked.through(settled)
        return confirmed

    def kept(self, outcome: str) -> bool:
        """The state table's answer to keeping a position (``"kept"``, ``"failed"`` or
        ``"unsupported"``): may it be confirmed? An unsupported table is not asked again."""
        if outcome == "unsupported":
            self.keeps = False
        return outcome != "failed"

    def _require_batch(self) -> EosBatch:
        assert self.batch is not None, "exactly-once only"
        return self.batch
