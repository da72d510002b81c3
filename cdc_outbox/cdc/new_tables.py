"""An outbox table the slot has not streamed yet loses nothing (issue 36).

A table added to the configuration (and to the publication) later than the slot: rows
committed into it before, or while the relay ignored the table, were never streamed as outbox
rows, and the slot may be confirmed past them. Contract of :meth:`NewTables.catch_up`, at
every session start, before the stream starts:

- the tables the slot has been streaming are persisted (``streamed_tables`` of the state
  row, :mod:`cdc_outbox.store.relay_state`), each with the LSN ``L`` from which the stream
  publishes its rows; a configured table not among them gets a catch-up first;
- that catch-up is the new slot's, reused (:func:`~cdc_outbox.cdc.catch_up.
  publish_backlog`): a temporary slot exports a snapshot and its consistent point ``L``
  (:func:`~cdc_outbox.cdc.replication_stream.exported_snapshot`); the table's unpublished rows
  visible in it (exactly those of transactions committed before ``L``) are published in its
  commit order, all acknowledged (or dead-lettered) and marked, at least once or exactly
  once, before the stream starts;
- only then is ``{table: L}`` persisted (committed: before it takes effect), and from then on
  the stream skips the table's inserts of transactions whose commit LSN is below ``L``
  (:meth:`~cdc_outbox.cdc.message_router.MessageRouter.streamed_from`): the same partition by
  commit LSN as between a new slot's catch-up and its stream, so no row is published twice by
  the two and none is left between them; later rows come in commit order after the backlog;
- a crash before the record is written redoes the table's catch-up (rows acknowledged and
  marked are skipped; exactly-once, the last committed catch-up batch is marked first);
- an unknown record (a slot or state table older than issue 36) means "the first configured
  outbox only": at worst a needless catch-up of the others (their published rows skipped);
  with one outbox configured it is left unknown (nothing to catch up).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import psycopg

from cdc_outbox.cdc.catch_up import CatchUpCommitter, publish_backlog
from cdc_outbox.cdc.catch_up_marks import mark_committed_batch
from cdc_outbox.cdc.replication_stream import exported_snapshot
from cdc_outbox.config.cdc import CatchUpSection
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.kafka.checkpoints import Checkpoint
from cdc_outbox.lsn import Lsn
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.store import db_pool
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["NewTables"]

logger = logging.getLogger(__name__)

Export = Callable[[str], AbstractContextManager[tuple[int, str]]]


class NewTables:
    """The slot's streamed tables and the catch-up of the others (see the module contract).
    ``outboxes``: every configured outbox table; ``streamed`` reads and ``record`` writes the
    state row's record (:func:`~cdc_outbox.store.relay_state.streamed_tables`,
    :func:`~cdc_outbox.store.relay_state.record_streamed_tables`); ``export`` defaults to a
    real temporary slot in the database of ``section``."""

    def __init__(
        self,
        section: CatchUpSection,
        outboxes: Sequence[OutboxTable],
        *,
        streamed: Callable[[], dict[str, int] | None],
        record: Callable[[dict[str, int]], None],
        export: Export | None = None,
    ) -> None:
        self.section = section
        self._outboxes = tuple(outboxes)
        self._streamed = streamed
        self._record = record
        self._export = export or (lambda name: exported_snapshot(section.dsn, name))
        self._names = [t.name for t in self._outboxes]

    def slot_created(self, point: int) -> None:
        """A new slot's catch-up is done: every configured table is streamed from ``point``."""
        self._write(dict.fromkeys(self._names, point))

    def catch_up(
        self,
        delivery: Delivery,
        mappers: Sequence[OutboxMapper],
        eos: CatchUpCommitter | None,
        last: Checkpoint | None,
    ) -> dict[int, int]:
        """Catch up the configured tables the slot has not streamed (see the module contract);
        returns outbox index -> the LSN below which the stream skips its rows. Raises
        ``CatchUpFailed``, ``RelayHalted``, ``psycopg.Error``, ``DatabaseUnavailable``."""
        recorded = self._streamed()
        if recorded is None and len(self._names) == 1:
            return {}  # the one table is the slot's own (nothing recorded: nothing to drop)
        known = {self._names[0]: 0} if recorded is None else recorded
        known = {name: lsn for name, lsn in known.items() if name in self._names}
        if known != recorded:  # unknown, or a table no longer configured: never streamed now
            self._write(known)
        new = [n for n, name in enumerate(self._names) if name not in known]
        if new:
            names = ", ".join(self._names[n] for n in new)
            logger.info("outbox tables the slot has not streamed yet: %s: catching up", names)
            if eos is not None and last is not None and (last.catch_up_ids or last.dead_letters):
                with db_pool.connect(self.section.dsn, autocommit=True) as conn:
                    mark_committed_batch(conn, self._outboxes, last.catch_up_ids, last.dead_letters)
            name = f"{self.section.slot_name[:40]}_new_{os.getpid()}"
            with self._export(name) as (point, snapshot):
                rows = publish_backlog(
                    self.section, self._outboxes, snapshot, delivery, mappers, eos, tables=new
                )
            known = {**known, **{self._names[n]: point for n in new}}
            logger.info("caught up %d rows of %s; streaming them from %s", rows, names,
                        Lsn(point))  # fmt: skip
            self._write(known)
        return {n: known[name] for n, name in enumerate(self._names) if known.get(name, 0) > 0}

    def _write(self, tables: dict[str, int]) -> None:
        try:
            self._record(tables)
        except psycopg.errors.UndefinedColumn:
            _warn_unkept()


def _warn_unkept() -> None:
    logger.warning(
        "the relay state table has no streamed_tables column: run `cdc-outbox init` (as its"
        " owner) to add it; until then every start catches up the outbox tables after the"
        " first again (their published rows are skipped)"
    )
