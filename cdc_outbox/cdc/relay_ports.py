"""The relay's ports: the outside world it talks to, each behind a small interface.

:func:`~cdc_outbox.cdc.relay_build.build_relay` takes them as one argument. Left ``None``,
each is the real thing (the walsender connection, librdkafka, the checkpoint topic, the state
table and slot, the outbox table's marks); a test passes fakes to drive every restart path of
the relay without a server.

Contract of :class:`ReplicationPort` (:class:`~cdc_outbox.cdc.replication_stream.
ReplicationStream` is the real one): ``connect()`` returns the server's current history;
``start(lsn)`` streams from ``max(lsn, confirmed_flush_lsn)`` and returns that position
(``slot_confirmed``: the ``confirmed_flush_lsn`` it read);
``read_raw(timeout)`` gives one CopyData message or ``None``; ``send_status`` moves the slot;
any failure is a :class:`~cdc_outbox.cdc.replication_stream.ReplicationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cdc_outbox.cdc.history import History
from cdc_outbox.cdc.new_tables import NewTables
from cdc_outbox.cdc.published_marker import MarkSink
from cdc_outbox.kafka.checkpoints import CheckpointStore
from cdc_outbox.kafka.publisher import ProducerFactory
from cdc_outbox.pgwire.walproto import Keepalive, XLogData
from cdc_outbox.store.failed_rows import FailedRowsStore
from cdc_outbox.store.relay_state import KeepOutcome, SlotFacts

__all__ = ["RelayPorts", "ReplicationPort"]


class ReplicationPort(Protocol):
    """One replication connection streaming one slot (see the module contract)."""

    @property
    def is_open(self) -> bool: ...

    def identify(self) -> tuple[str, str]: ...

    def connect(self) -> History: ...

    def start(self, start_lsn: int) -> int: ...

    @property
    def slot_confirmed(self) -> int: ...

    def create_slot(self) -> tuple[int, str]: ...

    def read(self, timeout: float) -> XLogData | Keepalive | None: ...

    def read_raw(self, timeout: float) -> memoryview | bytes | None: ...

    def send_status(self, written: int, flushed: int, *, reply_requested: bool = False) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RelayPorts:
    """What the relay talks to; ``None`` means the real one."""

    stream: ReplicationPort | None = None
    producer_client: ProducerFactory | None = None
    checkpoints: CheckpointStore | None = None
    #: The state table's kept confirmed position (:func:`~cdc_outbox.store.relay_state.
    #: kept_position`) and how to raise it (:func:`~cdc_outbox.store.relay_state.keep_position`,
    #: whose outcome says whether the confirmation may go out).
    kept: Callable[[], int] | None = None
    keep: Callable[[int], KeepOutcome] | None = None
    #: The parked aggregates ``(aggregate_id, blocking event id)`` (default: from the table).
    parked: Callable[[], Iterable[tuple[str, str]]] | None = None
    #: The outbox table's FAILED rows as the delivery marks and compares them
    #: (:class:`~cdc_outbox.store.failed_rows.FailedRows`).
    failed_rows: FailedRowsStore | None = None
    #: Where the published-marker marks rows: one sink, or one per ``schema.table`` (default:
    #: each outbox table).
    marks: MarkSink | Mapping[str, MarkSink] | None = None
    #: The state row and the slot as the catch-up rule reads them (:func:`~cdc_outbox.store.
    #: relay_state.slot_facts`), at every session start (:mod:`cdc_outbox.cdc.slot_watch`).
    slot_facts: Callable[[], SlotFacts] | None = None
    #: The slot's streamed outbox tables and the catch-up of new ones
    #: (:class:`~cdc_outbox.cdc.new_tables.NewTables`; default: the real one, unless
    #: ``stream`` is a fake: then none).
    new_tables: NewTables | None = None
