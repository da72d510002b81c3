"""The sections the monitoring components read (:mod:`cdc_outbox.monitoring`): each holds only
the values its component uses, built from :class:`~cdc_outbox.config.settings.Settings` by
the function beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdc_outbox.config.database import DatabaseSection, database_section
from cdc_outbox.config.models import HealthSettings
from cdc_outbox.config.modes import resolve_mode

if TYPE_CHECKING:
    from cdc_outbox.config.settings import Settings

__all__ = [
    "HealthSection",
    "HeartbeatSection",
    "SlotMonitorSection",
    "health_section",
    "heartbeat_section",
    "slot_monitor_section",
]


@dataclass(frozen=True, slots=True)
class HeartbeatSection:
    """The heartbeat's: its interval (``heartbeat_interval_s``), the slot named in each
    message, and the database it writes to."""

    slot_name: str
    interval_s: float
    database: DatabaseSection


@dataclass(frozen=True, slots=True)
class HealthSection:
    """The readiness checks': intervals and timeouts (``[health]``), the database and the
    librdkafka config of the Kafka probe (secrets inside: left out of ``repr``)."""

    health: HealthSettings
    database: DatabaseSection
    kafka_config: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True, slots=True)
class SlotMonitorSection:
    """The slot monitor's: the slot, the sampling interval (``monitor_interval_s``), the
    configured ``mode`` and, in auto mode, why it never falls back to polling
    (:func:`~cdc_outbox.config.modes.resolve_mode`; for the metrics), and the database."""

    slot_name: str
    interval_s: float
    mode: str
    fallback_blocked: tuple[str, str] | None
    database: DatabaseSection


def heartbeat_section(settings: Settings) -> HeartbeatSection:
    """The :class:`HeartbeatSection` of ``settings``."""
    return HeartbeatSection(
        settings.slot_name, settings.heartbeat_interval_s, database_section(settings)
    )


def health_section(settings: Settings) -> HealthSection:
    """The :class:`HealthSection` of ``settings``."""
    return HealthSection(settings.health, database_section(settings), settings.kafka_config())


def slot_monitor_section(settings: Settings) -> SlotMonitorSection:
    """The :class:`SlotMonitorSection` of ``settings``."""
    blocked = resolve_mode(settings).fallback_blocked if settings.mode == "auto" else None
    return SlotMonitorSection(
        settings.slot_name,
        settings.monitor_interval_s,
        settings.mode,
        blocked,
        database_section(settings),
    )
