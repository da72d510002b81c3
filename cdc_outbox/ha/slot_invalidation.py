"""Why a replication slot was invalidated, and the one line that says so.

Pure: no I/O. PostgreSQL invalidates a logical slot for good when the WAL it needs is removed
(``max_slot_wal_keep_size``), on a recovery conflict (a standby's slot whose catalog rows
were removed, or ``wal_level`` lowered on the primary), or, on 18, when it stayed inactive
past ``idle_replication_slot_timeout``. What each version shows:

- 17+: ``pg_replication_slots.invalidation_reason`` (``wal_removed``, ``rows_removed``,
  ``wal_level_insufficient``, 18: ``idle_timeout``);
- 15/16: ``wal_status = 'lost'`` only: on 15, and on a 16 that was always a primary, removed
  WAL is then the only cause; a 16 promoted from a standby may have lost a copy of the slot to
  a recovery conflict, which only the decoding error tells (the service reads it then);
- every version: the error of ``START_REPLICATION`` (SQLSTATE 55000), e.g. 15 "cannot read
  from logical replication slot ... This slot has been invalidated because it exceeded the
  maximum reserved size.", 16/17 "can no longer get changes from replication slot ...",
  18 "can no longer access replication slot ... invalidated due to "wal_removed"".

:func:`of_slot` reads the catalog columns, :func:`of_error` the error text; both return an
:class:`Invalidation` (``reason`` is one of :data:`REASONS`, the metric label) or ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc_outbox.store.inspection import SlotStatus

__all__ = ["REASONS", "Invalidation", "of_error", "of_slot", "of_slot_status"]

#: Every reason label; ``recovery_conflict`` is what 16's error text says (rows or wal_level).
REASONS = (
    "wal_removed",
    "rows_removed",
    "wal_level_insufficient",
    "idle_timeout",
    "recovery_conflict",
    "unknown",
)
_CAUSES = {
    "wal_removed": "WAL it needed was removed (max_slot_wal_keep_size)",
    "rows_removed": "catalog rows it needed were removed (a recovery conflict on a standby)",
    "wal_level_insufficient": "wal_level on the primary was lowered below logical",
    "idle_timeout": "it was inactive longer than idle_replication_slot_timeout",
    "recovery_conflict": "it conflicted with recovery (catalog rows removed or wal_level"
    " lowered on the primary)",
    "unknown": "PostgreSQL invalidated it",
}
_STANDBY_FEEDBACK = (
    "; keep hot_standby_feedback on, with a physical slot (primary_slot_name), on the standbys"
    " that keep a copy of the slot to keep it from happening again"
)
_PREVENT = {
    "wal_removed": "; raise max_slot_wal_keep_size to keep it from happening again",
    "idle_timeout": "; raise idle_replication_slot_timeout to keep it from happening again",
    "rows_removed": _STANDBY_FEEDBACK,
    "recovery_conflict": _STANDBY_FEEDBACK,
    "wal_level_insufficient": "; keep wal_level = logical on the primary",
}
_LOOKS_INVALIDATED = re.compile(
    r"can no longer (?:get changes from|access) replication slot"
    r"|has been invalidated|was invalidated"
)
_DUE_TO = re.compile(r'invalidated due to "(\w+)"')
_TEXT_REASONS = (
    ("exceeded the maximum reserved size", "wal_removed"),
    ("conflicting with recovery", "recovery_conflict"),
    ("conflicted with recovery", "recovery_conflict"),
)


@dataclass(frozen=True, slots=True)
class Invalidation:
    """An invalidated slot: ``reason`` (a :data:`REASONS` label) and what it means."""

    reason: str

    @property
    def cause(self) -> str:
        return _CAUSES[self.reason]

    def line(self, slot: str) -> str:
        """The one line for cdc mode: the slot, the cause and the fix."""
        return (
            f"slot: replication slot '{slot}' was invalidated ({self.reason}): {self.cause};"
            " it can never stream again and cdc mode does not recreate it (fix: run in auto"
            " mode, which recreates it and publishes the unpublished rows, or"
            " `cdc-outbox drop --yes` and start again, which does the same"
            f"{_PREVENT.get(self.reason, '')})"
        )


def of_slot(wal_status: str | None, invalidation_reason: str | None = None) -> Invalidation | None:
    """The invalidation a ``pg_replication_slots`` row shows, or ``None`` if it is usable.
    Before 17 only ``wal_status = 'lost'`` shows it, read as removed WAL (16's ``conflicting``
    is true for every invalidated slot, measured on 16.9, so it tells nothing; a recovery
    conflict of a promoted standby's slot shows only in :func:`of_error`'s text)."""
    if invalidation_reason:
        return Invalidation(_label(invalidation_reason))
    return Invalidation("wal_removed") if wal_status == "lost" else None


def of_slot_status(slot: SlotStatus) -> Invalidation | None:
    """:func:`of_slot` of an inspected slot."""
    return of_slot(slot.wal_status, slot.invalidation_reason)


def of_error(text: str) -> Invalidation | None:
    """The invalidation an error message (with its DETAIL) reports, or ``None``."""
    if not _LOOKS_INVALIDATED.search(text):
        return None
    if (due := _DUE_TO.search(text)) is not None:
        return Invalidation(_label(due.group(1)))
    for fragment, reason in _TEXT_REASONS:
        if fragment in text:
            return Invalidation(reason)
    return Invalidation("unknown")


def _label(reason: str) -> str:
    return reason if reason in _CAUSES else "unknown"
