"""Pure rules of leader election (no I/O), used by :mod:`cdc_outbox.ha.leadership`.

- :func:`lock_namespace`: the first advisory-lock key, stable across processes and versions.
- :func:`connection_params`: libpq settings of the lock connection (keepalives, user timeout).
- :func:`holder_is_stuck`: when a standby may end the lock holder's session.
- :class:`LeaseClock`: the leader's self-fencing clock.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "APPLICATION_NAME",
    "LOCK_NAME",
    "LeaseClock",
    "application_name",
    "connection_params",
    "holder_is_stuck",
    "lock_namespace",
]

LOCK_NAME = "cdc_outbox.leader"
APPLICATION_NAME = "cdc-outbox leader"


def application_name(slot_name: str) -> str:
    """``application_name`` of every instance's lock connection for ``slot_name`` (what
    ``cdc-outbox status`` counts as the running instances); PostgreSQL keeps 63 bytes."""
    return f"{APPLICATION_NAME} {slot_name}"[:63]


def lock_namespace(name: str = LOCK_NAME) -> int:
    """First advisory-lock key: a signed int4 from SHA-256 of ``name`` (stable everywhere)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True)


def connection_params(
    lease_s: float, given: Mapping[str, Any], slot_name: str = ""
) -> dict[str, Any]:
    """libpq parameters of the lock connection: a dead server is noticed within ~lease/2."""
    params: dict[str, Any] = {
        "application_name": application_name(slot_name) if slot_name else APPLICATION_NAME,
        "keepalives": 1,
        "keepalives_idle": 2,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": int(lease_s * 1000 / 2),
    }
    if "connect_timeout" not in given:
        params["connect_timeout"] = max(2, math.ceil(lease_s))
    return params


def holder_is_stuck(
    lease_left_s: float | None, holder_idle_s: float | None, lease_s: float
) -> bool:
    """May a standby end the lock holder's session? Only if the lease in the row expired (or
    none was written) and its session ran nothing for over half a lease (a live holder runs a
    statement at least every lease/5). Unknown idle time: yes."""
    if lease_left_s is not None and lease_left_s >= 0:
        return False
    return holder_idle_s is None or holder_idle_s > lease_s / 2


class LeaseClock:
    """Self-fencing: valid for ``margin_s`` after the start of the last successful renew.

    Latched: once :meth:`valid` has found the margin passed, the term is over: a renew that
    completes later (a slow statement, a process that was paused) does not revive it; only
    :meth:`reset` (a new term) does."""

    def __init__(self, margin_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.margin_s = margin_s
        self.clock = clock
        self._renewed: float | None = None
        self._lapsed = False

    def renewed(self, started_at: float) -> None:
        if not self._lapsed:
            self._renewed = started_at

    def reset(self) -> None:
        self._renewed = None
        self._lapsed = False

    def valid(self) -> bool:
        if self._lapsed or self._renewed is None:
            return False
        if self.clock() - self._renewed <= self.margin_s:
            return True
        self._lapsed = True
        return False
