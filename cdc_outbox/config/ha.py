"""The section leader election reads (:class:`~cdc_outbox.ha.leadership.Leadership`), built
from :class:`~cdc_outbox.config.settings.Settings` by :func:`leadership_section`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_outbox.config.database import DatabaseSection, database_section

if TYPE_CHECKING:
    from cdc_outbox.config.settings import Settings

__all__ = ["LeadershipSection", "leadership_section"]


@dataclass(frozen=True, slots=True)
class LeadershipSection:
    """The slot whose relay is elected, the lease (``leader_lease_s``) and the database of the
    lock connection (the state table's name is derived: given beside it)."""

    slot_name: str
    lease_s: float
    database: DatabaseSection


def leadership_section(settings: Settings) -> LeadershipSection:
    """The :class:`LeadershipSection` of ``settings``."""
    return LeadershipSection(
        settings.slot_name, settings.leader_lease_s, database_section(settings)
    )
