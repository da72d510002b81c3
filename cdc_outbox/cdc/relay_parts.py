"""The parts of one CDC relay, wired (:func:`~cdc_outbox.cdc.relay_build.wire`) and handed to
:class:`~cdc_outbox.cdc.relay.Relay`, which runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cdc_outbox.cdc.eos import EosCommitter
from cdc_outbox.cdc.message_router import MessageRouter
from cdc_outbox.cdc.new_tables import NewTables
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.cdc.relay_ports import ReplicationPort
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.relay_state import KeepOutcome, SlotFacts

__all__ = ["RelayParts"]


@dataclass(frozen=True, slots=True)
class RelayParts:
    """A relay's pipeline and the state-table reads and writes its loop makes: ``outboxes``
    (every configured outbox table) and ``mappers`` (theirs) in configuration order;
    ``marker`` None when no outbox marks its rows; ``eos`` None at least once; ``new_tables``
    None when tables added later are not caught up (a test's stream)."""

    stream: ReplicationPort
    delivery: Delivery
    eos: EosCommitter | None
    marker: PublishedMarker | None
    router: MessageRouter
    outboxes: tuple[OutboxTable, ...]
    mappers: tuple[OutboxMapper, ...]
    new_tables: NewTables | None
    kept: Callable[[], int]
    keep: Callable[[int], KeepOutcome]
    parked: Callable[[], Iterable[tuple[str, str]]]
    slot_facts: Callable[[], SlotFacts]
