"""Mode resolution: what the settings alone decide about ``mode`` (auto / cdc / polling).

Contract: :func:`resolve_mode` is the one place that decides it; the settings validator runs it,
so a mode the configured outboxes cannot be relayed in is refused at load time with one line
(``ValueError`` there, ``ConfigError`` exit 2 from ``load_settings``):

- ``polling`` needs status columns on every configured outbox table (a table without them
  would be configured and never relayed), at-least-once delivery and no table-less events
  (``message_prefix``);
- ``auto`` with a table that has status columns refuses ``cdc_mark_published = "off"`` (every
  fallback to polling would publish the table again);
- ``auto`` falls back to polling only when polling can relay everything CDC does (every table
  has status columns, no ``message_prefix``); otherwise it resolves to ``cdc`` and
  :attr:`ResolvedMode.fallback_blocked` says why (the service logs it as a WARNING).

Facts known only at run time (wal_level, the REPLICATION privilege, the slot) stay with the
service. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from cdc_outbox.config.models import OutboxSettings

__all__ = [
    "FALLBACK_BLOCKERS",
    "ModeInputs",
    "ResolvedMode",
    "cannot_poll",
    "polling_fallback_blocked",
    "resolve_mode",
]

#: Why auto mode relays by CDC only and never falls back to polling (label values).
FALLBACK_BLOCKERS = ("table_less_events", "statusless_outbox")


class ModeInputs(Protocol):
    """What the mode rules read of the settings (``Settings`` fits)."""

    @property
    def mode(self) -> str: ...

    @property
    def delivery(self) -> str: ...

    @property
    def message_prefix(self) -> str | None: ...

    def outbox_settings(self) -> tuple[OutboxSettings, ...]: ...


@dataclass(frozen=True, slots=True)
class ResolvedMode:
    """How a run relays: ``mode`` is ``auto`` only when the polling fallback is possible;
    ``fallback_blocked`` is ``(reason label, message)`` when ``auto`` was resolved to ``cdc``."""

    mode: Literal["auto", "cdc", "polling"]
    fallback_blocked: tuple[str, str] | None = None


def polling_fallback_blocked(settings: ModeInputs) -> tuple[str, str] | None:
    """Auto mode's fallback rule: it may fall back to polling only when polling can relay
    everything CDC does: no table-less events (``message_prefix``: they live only in the WAL)
    and every configured outbox table has status columns (a table without them cannot be
    polled). ``(reason label, message)`` when it may not, else None."""
    if settings.message_prefix is not None:
        return "table_less_events", (
            f"table-less events (message_prefix {settings.message_prefix!r}) live only in the"
            " WAL, polling cannot relay them"
        )
    statusless = [o.name for o in settings.outbox_settings() if not o.columns.has_status]
    if statusless:
        return "statusless_outbox", (
            f"{', '.join(statusless)} ha{'s' if len(statusless) == 1 else 've'} no status"
            " columns (cannot be polled)"
        )
    return None


def cannot_poll(outbox: OutboxSettings) -> str:
    """Why polling mode refuses ``outbox`` (a table without status columns), one line."""
    return (
        "polling mode needs the status columns of the default column preset"
        f" (status, attempts, available_at, ...); {outbox.name} (the {outbox.columns.preset}"
        ' preset) has none: use mode = "cdc" or columns.preset = "default"'
    )


def resolve_mode(settings: ModeInputs) -> ResolvedMode:
    """The mode a run relays in (see the module contract); ``ValueError`` (one line) for a
    mode the settings cannot be relayed in."""
    mode, outboxes = settings.mode, settings.outbox_settings()
    if mode == "polling":
        if settings.delivery == "exactly_once":
            raise ValueError('delivery = "exactly_once" needs CDC: polling is at-least-once')
        if settings.message_prefix is not None:
            raise ValueError("message_prefix needs CDC: polling never sees table-less events")
        statusless = [o for o in outboxes if not o.columns.has_status]
        if statusless:  # polling claims only tables with status columns: refuse to skip one
            raise ValueError(cannot_poll(statusless[0]))
        return ResolvedMode("polling")
    if mode == "cdc":
        return ResolvedMode("cdc")
    for o in outboxes:
        if o.columns.has_status and o.cdc_mark_published == "off":
            raise ValueError(
                f'mode = "auto" with cdc_mark_published = "off" ({o.name}) would'
                " publish every row again at each fallback to polling: use"
                ' "update" or "delete", or mode = "cdc"'
            )
    blocked = polling_fallback_blocked(settings)
    return ResolvedMode("auto") if blocked is None else ResolvedMode("cdc", blocked)
