"""Marking the rows a catch-up published, in their own outbox tables.

A catch-up (:mod:`cdc_outbox.cdc.catch_up`) may publish the rows of several outbox
tables (issue 36). Exactly-once, the ids of each committed batch travel in its checkpoint
record (``catch_up_ids``, ``dead_letters``); with several outboxes configured each id is
*qualified* with its table (:func:`qualify`: ``schema.table`` NUL id; a PostgreSQL text holds
no NUL, so no plain id looks like one), and a plain id (one outbox, or a checkpoint written
before issue 36) belongs to the first configured outbox. :func:`mark_committed_batch` marks
each id in its table (an id of a table no longer configured is left, with a warning).

Contract of marking: rows are marked PUBLISHED (or deleted, per their outbox's
``cdc_mark_published``) only while unpublished; dead letters FAILED (only rows never marked
since, after a crash); both idempotent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import psycopg

from cdc_outbox.store.failed_rows import mark_failed
from cdc_outbox.store.mark_published import mark_ids
from cdc_outbox.store.outbox_table import OutboxTable

__all__ = ["Marking", "mark_committed_batch", "mark_published", "qualify", "split_by_table"]

logger = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]
_SEP = "\x00"


Tables = Sequence[OutboxTable]


def qualify(tables: Tables, table: OutboxTable, event_id: str) -> str:
    """``event_id`` of ``table`` (one of the configured ``tables``) as a catch-up checkpoint
    names it (see the module doc)."""
    if len(tables) == 1:
        return event_id
    return f"{table.name}{_SEP}{event_id}"


def split_by_table(
    tables: Tables, items: Sequence[tuple[str, str]]
) -> dict[OutboxTable, list[tuple[str, str]]]:
    """``(qualified or plain id, value)`` pairs by their outbox table among the configured
    ``tables``, each id unqualified."""
    by_name = {t.name: t for t in tables}
    out: dict[OutboxTable, list[tuple[str, str]]] = {}
    unknown: set[str] = set()
    for qualified, value in items:
        name, sep, event_id = qualified.partition(_SEP)
        table = by_name.get(name) if sep else tables[0]
        if table is None:
            unknown.add(name)
            continue
        out.setdefault(table, []).append((event_id if sep else qualified, value))
    if unknown:
        logger.warning("catch-up ids of outboxes no longer configured left unmarked: %s",
                       ", ".join(sorted(unknown)))  # fmt: skip
    return out


def mark_published(conn: Conn, ids: list[str], table: OutboxTable) -> int:
    """Mark (or delete, per its ``cdc_mark_published``) the still unpublished rows of ``ids``
    in ``table`` (:func:`cdc_outbox.store.mark_published.mark_ids`); idempotent. Returns the
    rows changed."""
    return mark_ids(conn, table, ids)


def _mark(
    conn: Conn,
    tables: Tables,
    ids: Sequence[str],
    dead_letters: Sequence[tuple[str, str]],
    *,
    only_unmarked: bool,
) -> tuple[int, int]:
    """Dead letters FAILED, then the other ids PUBLISHED, each in its table (qualified ids)."""
    failed = marked = 0
    for table, dead in split_by_table(tables, dead_letters).items():
        failed += mark_failed(conn, table, dead, only_unmarked=only_unmarked)
    for table, published in split_by_table(tables, [(i, "") for i in ids]).items():
        marked += mark_published(conn, [i for i, _ in published], table)
    return marked, failed


def mark_committed_batch(
    conn: Conn, tables: Tables, ids: list[str], dead_letters: list[tuple[str, str]]
) -> None:
    """Mark the rows of a committed catch-up batch (the last checkpoint's, before the next
    catch-up takes its snapshot) in their tables among the configured ``tables``: its dead
    letters FAILED (only rows never marked since: a row redriven meanwhile keeps its
    ``last_error`` and is left alone), its other rows PUBLISHED; idempotent."""
    marked, failed = _mark(conn, tables, ids, dead_letters, only_unmarked=True)
    logger.info(
        "marked the last committed catch-up batch: %d rows published, %d FAILED", marked, failed
    )


class Marking:
    """Exactly-once catch-up: marking of the last committed batch on a helper thread;
    :meth:`wait` (before the next commit and at the end) re-raises its error. ``tables``: the
    configured outbox tables (ids are qualified among them)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tuple(tables)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, conn: Conn, ids: list[str], dead_letters: list[tuple[str, str]]) -> None:
        """Mark ``dead_letters`` FAILED and ``ids`` PUBLISHED (qualified ids)."""
        self.wait()

        def mark() -> None:
            try:
                _mark(conn, self.tables, ids, dead_letters, only_unmarked=False)
            except BaseException as exc:  # re-raised by wait()
                self._error = exc

        self._thread = threading.Thread(target=mark, name="catch-up-marking", daemon=True)
        self._thread.start()

    def __enter__(self) -> Marking:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:  # never leave it using a closing connection
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
