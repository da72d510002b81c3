"""The section the polling relay reads (:class:`~cdc_outbox.polling.relay.PollingRelay`),
built from :class:`~cdc_outbox.config.settings.Settings` by :func:`polling_section`. What is
derived per outbox table (statements, mapper, delivery) is given beside it
(:mod:`cdc_outbox.polling.tables`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_outbox.config.database import DatabaseSection, database_section
from cdc_outbox.config.models import PollingSettings

if TYPE_CHECKING:
    from cdc_outbox.config.settings import Settings

__all__ = ["PollingSection", "polling_section"]


@dataclass(frozen=True, slots=True)
class PollingSection:
    """``[polling]`` (batch size, lease, attempts, backoff, interval), the shutdown grace and
    the database the workers claim from."""

    polling: PollingSettings
    shutdown_grace_s: float
    database: DatabaseSection


def polling_section(settings: Settings) -> PollingSection:
    """The :class:`PollingSection` of ``settings``."""
    return PollingSection(settings.polling, settings.shutdown_grace_s, database_section(settings))
