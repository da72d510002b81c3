"""The section the service reads itself (:class:`~cdc_outbox.service.relay_service.Service`),
built from :class:`~cdc_outbox.config.settings.Settings` by :func:`service_section`; its
collaborators get theirs from the wiring (:mod:`cdc_outbox.service.wiring`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc_outbox.config.modes import ResolvedMode, resolve_mode

if TYPE_CHECKING:
    from cdc_outbox.config.settings import Settings

__all__ = ["ServiceSection", "service_section"]


@dataclass(frozen=True, slots=True)
class ServiceSection:
    """The mode as resolved from the settings (:func:`~cdc_outbox.config.modes.resolve_mode`),
    the slot (log lines), ``delivery``, the auto-mode probe interval, the shutdown grace
    (how long the polling thread may take to stop) and ``health.loop_stale_s`` (the main loop
    stalled: the lease is not renewed)."""

    mode: ResolvedMode
    slot_name: str
    delivery: str
    cdc_probe_interval_s: float
    shutdown_grace_s: float
    loop_stale_s: float


def service_section(settings: Settings) -> ServiceSection:
    """The :class:`ServiceSection` of ``settings``."""
    return ServiceSection(
        resolve_mode(settings),
        settings.slot_name,
        settings.delivery,
        settings.cdc_probe_interval_s,
        settings.shutdown_grace_s,
        settings.health.loop_stale_s,
    )
