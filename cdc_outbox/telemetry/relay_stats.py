"""What the relay counts, for logs, metrics, the dashboard and tests.

Single writer (the relay thread); readers in other threads see plain ints and dicts, so a
reading may be a moment stale but is never torn. The exception is the liveness heartbeat
(:meth:`RelayStats.beat`), written by the relay, polling and standby loops and, for a role
whose loop does not beat, by the ``/healthz`` handler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_outbox.telemetry.progress import Progress


@dataclass
class RelayStats:
    """Counters and gauges of one relay (CDC or polling)."""

    mode: str = "cdc"
    events_published: int = 0
    events_dead_lettered: int = 0
    published_by_topic: dict[str, int] = field(default_factory=dict)
    dead_lettered_by_topic: dict[str, int] = field(default_factory=dict)
    transactions: int = 0
    ignored: dict[str, int] = field(default_factory=dict)
    #: Table-less event messages refused (dead-lettered, never published), by reason.
    refused_messages: dict[str, int] = field(default_factory=dict)
    delivery_errors: int = 0
    restarts: int = 0
    #: Catch-ups started (a new slot and its snapshot's backlog) by this process.
    catch_ups: int = 0
    #: The last catch-up's rows to publish (one COUNT at its start) and rows submitted so far.
    catch_up_rows_total: int = 0
    catch_up_rows_done: int = 0
    #: The running catch-up's progress (its total, rows done, start); None while none runs.
    catch_up_progress: Progress | None = None
    #: Invalidated slots found, by reason (cdc_outbox.ha.slot_invalidation.REASONS).
    slot_invalidations: dict[str, int] = field(default_factory=dict)
    confirmed_lsn: int = 0
    last_confirm_unix: float = 0.0
    in_flight: int = 0
    #: wait_for_standbys: committed transactions held for a standby, and the oldest one's wait.
    standby_held_transactions: int = 0
    standby_wait_s: float = 0.0
    #: Leader election: "leader" or "standby"; durable phase (POLLING, CATCHING_UP, STREAMING).
    role: str = "standby"
    phase: str = ""
    #: Dead letters whose later same-key records had already been sent (order broken).
    order_broken: int = 0
    #: The delivery guarantee in effect ("at_least_once" or "exactly_once"; polling is always
    #: at-least-once) and the Kafka transactions committed and aborted (exactly-once).
    delivery_guarantee: str = "at_least_once"
    eos_commits: int = 0
    eos_aborts: int = 0
    #: Checkpoints read from Kafka that were not all in the database's history (a failover to
    #: a standby that was behind, a restore): what they held past it is published again.
    untrusted_checkpoints: int = 0
    #: Events of transactions skipped because Kafka already holds them (exactly-once).
    eos_skipped_events: int = 0
    #: Retried delivery problems by alert (topic_missing, not_authorized, ...): count and when
    #: last seen (unix time).
    retries_by_alert: dict[str, int] = field(default_factory=dict)
    alert_last_seen: dict[str, float] = field(default_factory=dict)
    #: Called with (seconds from commit to the last acknowledgement, events) per transaction.
    latency_observers: list[Callable[[float, int], None]] = field(default_factory=list)
    #: Liveness: unix time the main loop (relay, polling or standby) last turned, and the roles
    #: whose loop called :meth:`beat` at least once (for the others ``/healthz`` refreshes
    #: ``last_loop_unix`` itself: see cdc_outbox.monitoring.health).
    last_loop_unix: float = 0.0
    beating_roles: set[str] = field(default_factory=set)
    #: The error that cannot heal which is ending ``run`` (``/healthz`` then fails).
    fatal: str | None = None

    def beat(self) -> None:
        """The calling main loop turned: liveness (``/healthz``) is measured from here."""
        self.last_loop_unix = time.time()
        if self.role not in self.beating_roles:
            self.beating_roles.add(self.role)

    def beating(self, stop: threading.Event) -> threading.Event:
        """``stop`` seen through an event that calls :meth:`beat` whenever a loop checks or
        waits on it (for a loop that lives in code without a ``stats``, e.g. the standby's
        ``Leadership.acquire(stats.beating(stop))``)."""
        return _BeatingEvent(stop, self.beat)

    def fail(self, line: str) -> str:
        """Record ``line`` as the error that cannot heal which ends the service; returns it."""
        self.fatal = line
        return line

    def count_published(self, topic: str) -> None:
        self.events_published += 1
        by_topic = self.published_by_topic
        by_topic[topic] = by_topic.get(topic, 0) + 1

    def count_dead_lettered(self, intended_topic: str) -> None:
        self.events_dead_lettered += 1
        by_topic = self.dead_lettered_by_topic
        by_topic[intended_topic] = by_topic.get(intended_topic, 0) + 1

    def count_retry(self, alert: str) -> None:
        self.retries_by_alert[alert] = self.retries_by_alert.get(alert, 0) + 1
        self.alert_last_seen[alert] = time.time()

    def observe_latency(self, seconds: float, events: int) -> None:
        for observer in self.latency_observers:
            observer(seconds, events)


class _BeatingEvent(threading.Event):
    """Delegates to another event; ``is_set`` and ``wait`` call ``on_turn`` first."""

    def __init__(self, event: threading.Event, on_turn: Callable[[], None]) -> None:
        super().__init__()
        self._event = event
        self._on_turn = on_turn

    def is_set(self) -> bool:
        self._on_turn()
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        self._on_turn()
        return self._event.wait(timeout)
