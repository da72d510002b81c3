"""Building a CDC relay: the one place where its pipeline is wired.

:func:`build_relay` takes the settings (the service's entry); everything below it takes
sections (:func:`~cdc_outbox.config.cdc.cdc_relay_section`), the outbox tables and their
mappers. A port left ``None`` in :class:`~cdc_outbox.cdc.relay_ports.RelayPorts` is the real
one: the walsender connection (behind the standby gate with ``wait_for_standbys``), librdkafka,
the checkpoint topic, the state table and slot, the outbox tables' marks and FAILED rows; with
a test's stream, no catch-up of tables added later (unless given).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from cdc_outbox.cdc.eos import EosCommitter, transactional_id
from cdc_outbox.cdc.message_router import MessageRouter
from cdc_outbox.cdc.new_tables import NewTables
from cdc_outbox.cdc.parked import parked_in_every_outbox
from cdc_outbox.cdc.published_marker import PublishedMarker
from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.relay_parts import RelayParts
from cdc_outbox.cdc.relay_ports import RelayPorts, ReplicationPort
from cdc_outbox.cdc.replication_stream import ReplicationStream
from cdc_outbox.cdc.standby_wait import gated
from cdc_outbox.config.cdc import CdcRelaySection, cdc_relay_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.delivery.engine import Delivery
from cdc_outbox.mapping.build import outbox_mapper
from cdc_outbox.mapping.rows import OutboxMapper
from cdc_outbox.store.failed_rows import FailedRows
from cdc_outbox.store.outbox_table import OutboxTable
from cdc_outbox.store.relay_state import (
    keep_position,
    kept_position,
    record_streamed_tables,
    slot_facts,
    streamed_tables,
)
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["build_relay", "new_tables_of", "wire"]


def new_tables_of(
    settings: Settings,
    section: CdcRelaySection | None = None,
    outboxes: Sequence[OutboxTable] | None = None,
) -> NewTables:
    """The catch-up of outbox tables added later, on the slot state table of ``settings``
    (``section`` and ``outboxes``: theirs, when the caller has them already)."""
    return NewTables(
        (section or cdc_relay_section(settings)).catch_up,
        OutboxTable.all_of(settings) if outboxes is None else outboxes,
        streamed=lambda: streamed_tables(settings),
        record=lambda tables: record_streamed_tables(settings, tables),
    )


def build_relay(
    settings: Settings,
    stats: RelayStats | None = None,
    *,
    is_leader: Callable[[], bool] = lambda: True,
    ports: RelayPorts | None = None,
) -> Relay:
    """The CDC relay of ``settings`` (see the module doc), reporting to ``stats``, running
    while ``is_leader()`` holds."""
    ports = ports or RelayPorts()
    stats = stats or RelayStats()
    section = cdc_relay_section(settings)
    outboxes = OutboxTable.all_of(settings)
    mappers = tuple(outbox_mapper(settings, o) for o in settings.outbox_settings())
    new_tables = ports.new_tables
    if new_tables is None and ports.stream is None:
        new_tables = new_tables_of(settings, section, outboxes)
    ports = replace(
        ports,
        kept=ports.kept or (lambda: kept_position(settings)),
        keep=ports.keep or (lambda lsn: keep_position(settings, lsn)),
        parked=ports.parked or (lambda: parked_in_every_outbox(settings)),
        slot_facts=ports.slot_facts or (lambda: slot_facts(settings)),
        new_tables=new_tables,
    )
    parts = wire(section, outboxes, mappers, stats, ports)
    return Relay(section, parts, stats, is_leader=is_leader)


def wire(
    section: CdcRelaySection,
    outboxes: Sequence[OutboxTable],
    mappers: Sequence[OutboxMapper],
    stats: RelayStats,
    ports: RelayPorts,
) -> RelayParts:
    """The pipeline of ``section`` over ``outboxes`` (with their ``mappers``): the stream,
    the delivery engine, the published-marker, the exactly-once committer and the message
    router, on ``ports`` (None: the real one; the state table's ``kept``, ``keep``,
    ``parked`` and ``slot_facts`` must be given: they read the settings)."""
    stream: ReplicationPort = ports.stream or ReplicationStream(
        section.dsn, section.slot_name, section.publication_name, failover=section.slot_failover
    )
    stream = gated(section, stream, stats)  # wait_for_standbys
    outboxes = tuple(outboxes)
    marker: PublishedMarker | None = PublishedMarker(section.marker, outboxes, rows=ports.marks)
    if marker is not None and not marker.enabled:
        marker = None
    bookkept = all(t.has_status for t in outboxes)
    identity = stream.identify() if section.exactly_once else None
    failed_rows = ports.failed_rows or FailedRows(section.dead_letters, outboxes)
    delivery = Delivery(
        section.delivery,
        stats,
        marker=marker,
        failed_rows=failed_rows if bookkept else None,
        transactional_id=transactional_id(section.eos, *identity) if identity else None,
        producer_client=ports.producer_client,
    )
    eos = None
    if identity:
        eos = EosCommitter(section.eos, outboxes, delivery, stats, identity, ports.checkpoints)
    return RelayParts(
        stream=stream,
        delivery=delivery,
        eos=eos,
        marker=marker,
        router=MessageRouter(section.router, mappers, delivery, stats, eos),
        outboxes=outboxes,
        mappers=tuple(mappers),
        new_tables=ports.new_tables,
        kept=_required(ports.kept, "kept"),
        keep=_required(ports.keep, "keep"),
        parked=_required(ports.parked, "parked"),
        slot_facts=_required(ports.slot_facts, "slot_facts"),
    )


_T = TypeVar("_T")


def _required(port: _T | None, name: str) -> _T:
    if port is None:
        raise ValueError(f"wire: ports.{name} is required (build_relay gives the real one)")
    return port
