"""The sections of the CDC side (issue 35: each component receives only what it reads):
:class:`CdcRelaySection` for :class:`~cdc_outbox.cdc.relay.Relay`, bundling those of its
parts: :class:`RouterSection` (the message router), :class:`MarkerSection` (the
published-marker), :class:`EosSection` (the exactly-once committer), :class:`CatchUpSection`
(the catch-up, of a new slot or of tables added later) and the delivery engine's
:class:`~cdc_outbox.config.delivery.DeliverySection`; each built from the one ``Settings``
by the function beside it.

The outbox tables and their mappers are derived from the settings above this layer
(``store/``, ``mapping/``) and passed beside the sections. Secrets (the DSN, librdkafka
passthrough keys) are left out of the sections' ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cdc_outbox.config.columns import ColumnNames
from cdc_outbox.config.delivery import (
    DeadLetterSection,
    DeliverySection,
    dead_letter_section,
    delivery_section,
)
from cdc_outbox.config.models import EosSettings
from cdc_outbox.config.settings import Settings

__all__ = [
    "CatchUpSection",
    "CdcRelaySection",
    "EosSection",
    "MarkerSection",
    "RouterSection",
    "catch_up_section",
    "cdc_relay_section",
    "eos_section",
    "marker_section",
    "router_section",
]


@dataclass(frozen=True, slots=True)
class RouterSection:
    """What the message router reads: the in-flight bound of a read turn, the prefix of the
    logical messages that are events (None: none are) and the column names of the first
    outbox (table-less events map with its layout)."""

    max_in_flight: int
    message_prefix: str | None
    columns: ColumnNames


@dataclass(frozen=True, slots=True)
class MarkerSection:
    """Where the published-marker marks rows: the outbox database (the tables are given
    beside it)."""

    dsn: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class EosSection:
    """What the exactly-once committer reads: ``[eos]`` itself, the slot its checkpoints
    name, the librdkafka configuration of the checkpoint topic's clients and the outbox
    database (the last committed catch-up batch is marked there)."""

    eos: EosSettings
    slot_name: str
    kafka: Mapping[str, str] = field(repr=False)
    dsn: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class CatchUpSection:
    """What a catch-up reads: the outbox database (the snapshot's reader and the marks), the
    slot (a temporary slot for tables added later is named after it) and, exactly-once, the
    rows of one Kafka transaction (``eos.max_events``)."""

    dsn: str = field(repr=False)
    slot_name: str
    max_events: int


@dataclass(frozen=True, slots=True)
class CdcRelaySection:
    """What the CDC relay reads: its slot and publication, its loop's bounds and intervals,
    the failure rule of auto mode, and the sections of its parts."""

    dsn: str = field(repr=False)
    slot_name: str
    publication_name: str
    slot_failover: bool
    #: ``delivery``: ``at_least_once`` or ``exactly_once``.
    guarantee: str
    #: ``mode = "auto"``: an unusable stream falls back to polling after ``cdc_max_failures``.
    auto_mode: bool
    cdc_max_failures: int
    max_in_flight: int
    shutdown_grace_s: float
    status_interval_s: float
    #: ``wait_for_standbys`` as configured ("" : none).
    wait_for_standbys: str
    delivery: DeliverySection
    dead_letters: DeadLetterSection
    router: RouterSection
    marker: MarkerSection
    eos: EosSection
    catch_up: CatchUpSection

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactly_once"


def router_section(settings: Settings) -> RouterSection:
    """The message router's section of ``settings``."""
    return RouterSection(
        max_in_flight=settings.max_in_flight,
        message_prefix=settings.message_prefix,
        columns=settings.column_names(settings.outbox()),
    )


def marker_section(settings: Settings) -> MarkerSection:
    """The published-marker's section of ``settings``."""
    return MarkerSection(dsn=settings.postgres_dsn())


def eos_section(settings: Settings) -> EosSection:
    """The exactly-once committer's section of ``settings``."""
    return EosSection(
        eos=settings.eos,
        slot_name=settings.slot_name,
        kafka=settings.kafka_config(),
        dsn=settings.postgres_dsn(),
    )


def catch_up_section(settings: Settings) -> CatchUpSection:
    """The catch-up's section of ``settings``."""
    return CatchUpSection(
        dsn=settings.postgres_dsn(),
        slot_name=settings.slot_name,
        max_events=settings.eos.max_events,
    )


def cdc_relay_section(settings: Settings) -> CdcRelaySection:
    """The CDC relay's section of ``settings``, with those of its parts."""
    return CdcRelaySection(
        dsn=settings.postgres_dsn(),
        slot_name=settings.slot_name,
        publication_name=settings.publication_name,
        slot_failover=settings.slot_failover,
        guarantee=settings.delivery,
        auto_mode=settings.mode == "auto",
        cdc_max_failures=settings.cdc_max_failures,
        max_in_flight=settings.max_in_flight,
        shutdown_grace_s=settings.shutdown_grace_s,
        status_interval_s=settings.status_interval_s,
        wait_for_standbys=settings.wait_for_standbys,
        delivery=delivery_section(settings),
        dead_letters=dead_letter_section(settings),
        router=router_section(settings),
        marker=marker_section(settings),
        eos=eos_section(settings),
        catch_up=catch_up_section(settings),
    )
