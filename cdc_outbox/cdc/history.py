"""Which WAL history a position belongs to, and what may be skipped on its strength (pure).

A WAL position means something only within one history of one database: the server's system
identifier and its timeline. A physical standby shares the system identifier with its primary,
so after a failover to a standby that was behind, the new primary writes a new timeline that
forked from the old one at its *switchpoint*; positions the old primary wrote past that point
are not in the new history, and the new primary's own transactions reuse those LSNs. A restore
of a crash-consistent copy (same system identifier, same timeline) rewrites WAL past the copy's
end in the same way.

Rules (:func:`trusted_below`, :func:`stream_start`), applied at every streaming session start:

- A position recorded in history ``R`` (a Kafka checkpoint, the relay's in-memory positions)
  may be trusted in the server's current history ``C`` only up to the point where both agree:
  the whole position if ``R.timeline == C.timeline`` and the position is not past the server's
  current WAL end (a position beyond it comes from WAL this server never wrote: a restore);
  ``min(position, switchpoint of R.timeline in C's history)`` if ``R.timeline`` is an ancestor
  of ``C.timeline``; ``0`` (trust nothing) if the system identifier differs, the timeline is
  not in ``C``'s history, or ``R`` is unknown.
- Transactions below a trusted checkpoint position are skipped; nothing else is. Trusting too
  little re-publishes (duplicates, counted); trusting too much would lose events.
- A slot recreated on the same timeline starts at a consistent point past every position of
  that timeline written before, so a trusted position never skips anything the new slot sends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cdc_outbox.lsn import Lsn

__all__ = [
    "History",
    "parse_timeline_history",
    "stream_start",
    "trusted_below",
]


@dataclass(frozen=True, slots=True)
class History:
    """The server's current WAL history: system identifier, timeline, current WAL end, and the
    switchpoint of each ancestor timeline (``{tli: lsn where it ended}``)."""

    system_id: str
    timeline: int
    wal_end: int
    switchpoints: dict[int, int] = field(default_factory=dict)

    def agreed_until(self, system_id: str, timeline: int | None) -> int | None:
        """Up to which position WAL of ``(system_id, timeline)`` is also this history's WAL:
        ``None`` for all of it (the same timeline, up to ``wal_end``), else the switchpoint,
        or 0 if the two share nothing known."""
        if system_id != self.system_id or timeline is None:
            return 0
        if timeline == self.timeline:
            return None
        if timeline not in self.switchpoints:
            return 0
        # Switchpoints grow along a history; the least of those from ``timeline`` on is the
        # same value there, and still safe for a history file that broke that rule.
        return min(lsn for tli, lsn in self.switchpoints.items() if tli >= timeline)


def trusted_below(position: int, system_id: str, timeline: int | None, current: History) -> int:
    """How much of ``position`` (recorded in ``(system_id, timeline)``) holds in ``current``
    (see the module rules)."""
    agreed = current.agreed_until(system_id, timeline)
    if agreed is None:
        return position if position <= current.wal_end else 0
    return min(position, agreed)


def stream_start(
    remembered: int, remembered_in: tuple[str, int] | None, kept: int, current: History
) -> int:
    """Where a streaming session may ask the slot to start: the greater of the relay's
    in-memory position ``remembered`` (recorded in ``remembered_in``, ``None`` if unknown)
    and the state table's ``kept`` position (a value of the database itself: written after
    the WAL it names, so it is in any copy's history only if that WAL is too), each only as
    far as it is trusted in ``current``."""
    memory = 0
    if remembered_in is not None:
        memory = trusted_below(remembered, remembered_in[0], remembered_in[1], current)
    kept = kept if kept <= current.wal_end else 0
    return max(memory, kept)


def parse_timeline_history(content: str) -> dict[int, int]:
    """``{timeline: switchpoint}`` from a timeline history file (``TIMELINE_HISTORY``): lines
    ``<parent tli> <tab> <switchpoint LSN> <tab> <reason>``; comments and blank lines are
    skipped. Raises ``ValueError`` on a malformed line."""
    points: dict[int, int] = {}
    for line in _data_lines(content.splitlines()):
        parts = line.split()
        if len(parts) < 2:
            raise ValueError(f"malformed timeline history line: {line!r}")
        points[int(parts[0])] = int(Lsn.parse(parts[1]))
    return points


def _data_lines(lines: Iterable[str]) -> Iterable[str]:
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith("#"):
            yield line
