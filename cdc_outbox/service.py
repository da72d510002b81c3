"""The long-running service behind ``cdc-outbox run``: the one place that wires the relays
(CDC, polling, and the automatic switch between them) with monitoring.

Modes:
- ``cdc``: stream the slot (it must exist: ``cdc-outbox init``).
- ``polling``: the polling relay only.
- ``auto`` (default): CDC while logical replication is usable; otherwise polling, with a clear
  log line and ``relay_mode`` in the metrics. While polling, CDC is probed every
  ``cdc_probe_interval_s``; to return, polling is stopped, a fresh slot is created with an
  exported snapshot, the rows still unpublished in that snapshot are published, and streaming
  starts at the slot's consistent point. Nothing is lost across a switch; rows published by one
  side and not yet marked are published again by the other (a bounded duplicate window).

Contract: :meth:`Service.run` returns after :meth:`Service.request_stop` once the current relay
has flushed and confirmed; it raises what the relays raise (e.g. RelayHalted).
"""

from __future__ import annotations

import gc
import logging
import threading
from contextlib import ExitStack

import psycopg
from psycopg import sql

from cdc_outbox import bootstrap, schema
from cdc_outbox.config import Settings
from cdc_outbox.errors import CdcOutboxError, RelayHalted
from cdc_outbox.polling_relay import PollingRelay
from cdc_outbox.relay import Relay
from cdc_outbox.relay_stats import RelayStats
from cdc_outbox.snapshot_catchup import CatchUpFailed, publish_snapshot_backlog

logger = logging.getLogger(__name__)


class Service:
    """The configured relay(s) plus monitoring; ``request_stop`` is signal-handler safe."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = RelayStats()
        self._stop = threading.Event()
        self._current: Relay | PollingRelay | None = None

    def request_stop(self) -> None:
        self._stop.set()
        current = self._current
        if current is not None:
            current.request_stop()

    def run(self) -> None:
        _tune_gc()
        with ExitStack() as stack:
            if self.settings.metrics_port:
                from cdc_outbox.monitoring import start_monitoring

                stack.enter_context(start_monitoring(self.settings, lambda: self.stats))
            if self.settings.mode == "cdc":
                self._run_cdc(fresh_slot=False)
            elif self.settings.mode == "polling":
                self._run_polling(probe=False)
            else:
                self._run_auto()

    # -- modes ---------------------------------------------------------------------------------

    def _run_auto(self) -> None:
        if self.settings.columns.preset != "default":
            logger.warning(
                "auto mode: the %s table layout has no polling columns; relaying by CDC only",
                self.settings.columns.preset,
            )
            self._run_cdc(fresh_slot=False)
            return
        fresh = False  # the first CDC run may resume an existing healthy slot
        retried = False
        while not self._stop.is_set():
            problem = cdc_problem(self.settings)
            if problem is None:
                try:
                    self._run_cdc(fresh_slot=fresh or slot_needs_recreating(self.settings))
                    return
                except RelayHalted:
                    raise
                except (CdcOutboxError, psycopg.Error) as exc:
                    # CdcUnavailable, CatchUpFailed, a failed slot creation, the database
                    # going away between the probe and the start: all mean "poll for now".
                    problem = str(exc)
                    fresh = True
                    if not retried and cdc_problem(self.settings) is None:
                        # e.g. the slot was dropped: a fresh slot fixes it, no need to poll
                        logger.warning("CDC failed (%s); retrying with a fresh slot", problem)
                        retried = True
                        continue
            logger.warning(
                "CDC is not usable (%s); relaying by polling", problem, extra={"mode": "polling"}
            )
            drop_slot_quietly(self.settings)  # an unused slot would only retain WAL
            fresh, retried = True, False
            self._run_polling(probe=True)

    def _run_cdc(self, *, fresh_slot: bool) -> None:
        relay = Relay(self.settings, self.stats)
        self._current = relay
        self.stats.mode = "cdc"
        if self._stop.is_set():
            return
        if fresh_slot:
            logger.info("creating slot %s with a snapshot for catch-up", self.settings.slot_name)
            drop_slot_quietly(self.settings)
            ensure_publication(self.settings)
            try:
                relay.start_from_fresh_slot(
                    lambda snap: publish_snapshot_backlog(
                        self.settings, snap, self.stats, relay.marker
                    )
                )
            except CatchUpFailed:
                drop_slot_quietly(self.settings)
                raise
        logger.info("relay mode: cdc (slot %s)", self.settings.slot_name, extra={"mode": "cdc"})
        relay.run()

    def _run_polling(self, *, probe: bool) -> None:
        polling = PollingRelay(self.settings, self.stats)
        self._current = polling
        self.stats.mode = "polling"
        if self._stop.is_set():
            return
        logger.info("relay mode: polling", extra={"mode": "polling"})
        if not probe:
            polling.run()
            return
        errors: list[BaseException] = []

        def target() -> None:
            try:
                polling.run()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=target, name="polling-relay")
        thread.start()
        while thread.is_alive() and not self._stop.wait(self.settings.cdc_probe_interval_s):
            if cdc_problem(self.settings) is None:
                logger.info("CDC is usable again; stopping the polling relay")
                break
        polling.request_stop()
        thread.join()
        if errors:
            raise errors[0]


def _tune_gc() -> None:
    """The relay allocates short-lived objects per event; collect the young generation less
    often and keep start-up objects out of full collections (measured: fewer pauses)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(20_000, gen1, gen2)


# -- probes and housekeeping (own short connections) -------------------------------------------


def cdc_problem(settings: Settings) -> str | None:
    """Why CDC cannot run now (None: it can). A missing or invalidated slot is no problem
    (a fresh one will be created); a missing publication is none if we may create it."""
    try:
        with bootstrap.connect(settings) as conn:
            checks = bootstrap.preflight(conn, settings)
    except (CdcOutboxError, psycopg.Error) as exc:
        return str(exc)
    bad = [c for c in checks if not c.ok and not (c.name == "slot" and "lost" in c.detail)]
    return "; ".join(f"{c.name}: {c.detail}" for c in bad) or None


def slot_needs_recreating(settings: Settings) -> bool:
    """True when the slot is missing or invalidated (wal_status lost)."""
    slot = bootstrap.status(settings).slot
    return slot is None or slot.wal_status == "lost"


def ensure_publication(settings: Settings) -> None:
    with bootstrap.connect(settings) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.publication_name,)
        ).fetchone()
        if exists is None:
            conn.execute(schema.publication_ddl(settings))
            logger.info("created publication %s", settings.publication_name)


def drop_slot_quietly(settings: Settings) -> None:
    """Drop the slot if it exists and is not in use (best effort, logged)."""
    try:
        with bootstrap.connect(settings) as conn:
            conn.execute(
                sql.SQL(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = {} AND NOT active"
                ).format(sql.Literal(settings.slot_name))
            )
    except (CdcOutboxError, psycopg.Error) as exc:
        logger.warning("could not drop slot %s: %s", settings.slot_name, exc)
