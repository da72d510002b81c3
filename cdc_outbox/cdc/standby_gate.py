"""Which streamed transactions the relay's standbys already have (pure core, no I/O).

:class:`StandbyGate` is a FIFO of replication frames. The frames of one transaction (``B`` up to
its ``C``) form one unit that needs its commit's end LSN; a frame outside any transaction needs
nothing, but waits behind what is held before it. :meth:`StandbyGate.pop_released` gives, in
stream order, the units a standby that flushed up to ``flushed`` has in full (``end_lsn <=
flushed``: PostgreSQL reports ``flush_lsn`` as the last byte flushed + 1), stopping at the first
that it has not: order is never changed. A transaction still open (no ``C`` yet) is never
released. :func:`release_point` turns the listed standbys' flush LSNs into ``flushed``: the
newest of them (any one listed standby holding the commit is enough).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


def release_point(flush_lsns: Iterable[int | None]) -> int:
    """The position up to which at least one listed standby has flushed (0: none)."""
    return max((lsn for lsn in flush_lsns if lsn is not None), default=0)


@dataclass(slots=True)
class _Unit:
    needs: int
    frames: list[bytes]
    since: float


@dataclass(slots=True)
class StandbyGate:
    """Frames held until a standby has their transaction (see the module contract)."""

    _units: deque[_Unit] = field(default_factory=deque)
    _open: list[bytes] | None = None
    _open_since: float = 0.0
    held_frames: int = 0

    @property
    def empty(self) -> bool:
        """Nothing held and no transaction open: a frame may pass straight through."""
        return not self._units and self._open is None

    @property
    def held_transactions(self) -> int:
        """Committed transactions waiting for a standby."""
        return sum(1 for unit in self._units if unit.needs)

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    def waiting_for(self) -> int | None:
        """The end LSN the oldest held unit needs (``None``: nothing committed is held)."""
        return self._units[0].needs if self._units else None

    def oldest_since(self) -> float | None:
        """When (caller's clock) the oldest held unit began, if any."""
        if self._units:
            return self._units[0].since
        return self._open_since if self._open is not None else None

    def begin(self, frame: bytes, now: float) -> None:
        """A ``B`` frame: a new transaction opens (the previous one must have committed)."""
        if self._open is not None:
            raise ValueError("a transaction began inside another")
        self._open, self._open_since = [frame], now
        self.held_frames += 1

    def add(self, frame: bytes, now: float) -> None:
        """Any other frame: part of the open transaction, or a unit of its own."""
        self.held_frames += 1
        if self._open is not None:
            self._open.append(frame)
        else:
            self._units.append(_Unit(0, [frame], now))

    def commit(self, frame: bytes, end_lsn: int) -> None:
        """The ``C`` frame of the open transaction, whose commit record ends at ``end_lsn``."""
        if self._open is None:
            raise ValueError("a commit outside a transaction")
        self._open.append(frame)
        self.held_frames += 1
        self._units.append(_Unit(max(end_lsn, 1), self._open, self._open_since))
        self._open = None

    def pop_released(self, flushed: int) -> list[bytes]:
        """The frames, in order, of the leading units a standby flushed up to ``flushed`` has."""
        out: list[bytes] = []
        units = self._units
        while units and units[0].needs <= flushed:
            out.extend(units.popleft().frames)
        self.held_frames -= len(out)
        return out

    def clear(self) -> None:
        """Drop everything held (a new stream sends it again)."""
        self._units.clear()
        self._open = None
        self.held_frames = 0
