"""What a run does that needs more than the service's own section: the checks before it, the
pool and monitoring, the phase, the slot and publication upkeep, and building leadership and
the relays. :func:`cdc_outbox.service.wiring.build_service` binds each to the settings (the one
place holding them while building); a test gives its own (``dataclasses.replace``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from cdc_outbox.cdc.relay import Relay
from cdc_outbox.ha.leadership import Leadership
from cdc_outbox.polling.relay import PollingRelay
from cdc_outbox.store.relay_state import Phase, RelayState, SlotFacts
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["ServiceOps"]


@dataclass(frozen=True, slots=True)
class ServiceOps:
    """The service's operations, each bound to the settings (see the module doc). Raising
    is theirs: ``ConfigError``, ``PreflightError``, ``psycopg.Error``, ... as the functions they
    call (:mod:`cdc_outbox.service.startup`, :mod:`cdc_outbox.service.housekeeping`,
    :mod:`cdc_outbox.store.relay_state`)."""

    #: ``ConfigError`` unless librdkafka accepts the producer settings.
    check_kafka_config: Callable[[], None]
    #: Keeps the process-wide connection pool open for the block.
    hold_pool: Callable[[], AbstractContextManager[None]]
    #: Runs monitoring for the block, given the current stats (None: no metrics port).
    monitoring: Callable[[Callable[[], RelayStats]], AbstractContextManager[object]] | None
    #: The database checks before a run; False if the event was set while waiting.
    check_before_run: Callable[[threading.Event], bool]
    ensure_state_table: Callable[[], None]
    #: Leader election, given the main loop's "stalled because" rule.
    leadership: Callable[[Callable[[], str | None]], Leadership]
    publication_must_fit: Callable[[], None]
    #: Why CDC cannot run now (None: it can).
    cdc_problem: Callable[[], str | None]
    #: Given the catch-up's reason; refuses one that would publish every row again.
    statusless_catch_up_must_be_safe: Callable[[str], None]
    #: Drops the slot if unused and the given leader id still holds the lease.
    drop_slot_quietly: Callable[[str], None]
    ensure_publication: Callable[[], None]
    slot_facts: Callable[[], SlotFacts]
    #: PostgreSQL's error for decoding the given (invalidated) slot.
    decoding_error: Callable[[str], str]
    read_state: Callable[[], RelayState]
    #: ``(phase, leader id, consistent point)``; ``NotLeader`` if the lease is not ours.
    write_phase: Callable[[Phase, str, int | None], None]
    #: The CDC relay, given the stats and the leader check.
    cdc_relay: Callable[[RelayStats, Callable[[], bool]], Relay]
    #: The polling relay, given the stats and the leader check.
    polling_relay: Callable[[RelayStats, Callable[[], bool]], PollingRelay]
