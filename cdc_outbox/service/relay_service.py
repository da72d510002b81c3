"""The long-running service behind ``cdc-outbox run``: runs leadership, the persisted phase
machine, the relays (CDC, catch-up, polling) and monitoring, as wired by
:func:`cdc_outbox.service.wiring.build_service` (it never sees the whole settings).

Any number of instances may run against one table and slot: exactly one is the leader
(:mod:`cdc_outbox.ha.leadership`); the others stand by (``role = standby`` in the metrics) and
take over when the leader dies, loses its connection or stops renewing its lease. Only the
leader relays, writes the phase and creates or drops the slot.

The leader follows the durable phase (:mod:`cdc_outbox.store.relay_state`), writing each
transition before it takes effect:

- ``polling`` mode: ``POLLING``, the polling relay.
- ``cdc`` mode: ``STREAMING`` with a healthy slot that is the relay's own streams it (also
  the slot ``init`` made over a table with no unpublished row); anything else
  (:mod:`cdc_outbox.cdc.catch_up_rule`: ``CATCHING_UP`` left by ``init`` or by a crash,
  ``POLLING``, a missing, invalidated or foreign slot) writes ``CATCHING_UP``, recreates the
  slot with an exported snapshot, publishes every row still unpublished in it (each
  aggregate's in commit order), writes ``STREAMING`` at the slot's consistent point, then
  streams. The relay applies the same rule at each of its session starts and raises
  :class:`~cdc_outbox.cdc.slot_watch.SlotChanged` when it no longer holds (a slot recreated
  while it was between sessions): the leader then decides again, and catches up. A layout
  without a status column and ``cdc_mark_published = "off"`` refuses a catch-up over a
  non-empty table (exit 3): it would publish every row again.
- ``auto`` mode (default): like ``cdc`` while logical replication is usable; otherwise
  ``POLLING`` (the slot is dropped: it would only retain WAL), probing CDC every
  ``cdc_probe_interval_s``, and back through ``CATCHING_UP``. The Debezium layout (no
  status columns) relays by CDC only, and so does a relay of table-less events
  (``message_prefix``: polling cannot see them; a WARNING says so): the settings decide
  that (:func:`cdc_outbox.config.modes.resolve_mode`, ``section.mode``). With
  ``delivery = "exactly_once"`` polling stays at-least-once (a WARNING line and
  ``cdc_outbox_delivery_guarantee`` say so).

Contract: :meth:`Service.run` returns only after :meth:`Service.request_stop`, once the current
relay has flushed and confirmed; every other end raises its reason (what the relays raise, e.g.
RelayHalted; :class:`RelayEnded` for a relay that returned although no stop was requested), so
``cdc-outbox run`` exits non-zero and a supervisor restarts it. A lost leadership is not an end:
the instance stands by again. The lease follows the main loop: a loop that has not turned for
``health.loop_stale_s`` stops renewing it (``/healthz`` fails at the same moment), so a standby
takes over from a hung leader.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from contextlib import ExitStack

import psycopg

from cdc_outbox.cdc.catch_up_rule import catch_up_reason
from cdc_outbox.cdc.relay import Relay
from cdc_outbox.cdc.slot_watch import SlotChanged
from cdc_outbox.cdc.stream_failures import CdcUnavailable
from cdc_outbox.config.backoff import RECONNECT
from cdc_outbox.config.service import ServiceSection
from cdc_outbox.crash_points import crash_point
from cdc_outbox.delivery.policy import guarantee_in_effect
from cdc_outbox.errors import (
    CdcOutboxError,
    FailureClass,
    PreflightError,
    RelayHalted,
    SlotInvalidated,
    TopicMissing,
    classify,
    raise_if_cannot_heal,
)
from cdc_outbox.ha import slot_invalidation
from cdc_outbox.ha.leadership import Leadership
from cdc_outbox.ha.slot_invalidation import of_error as _invalidated
from cdc_outbox.polling.relay import PollingRelay
from cdc_outbox.service.ops import ServiceOps
from cdc_outbox.store import relay_state
from cdc_outbox.store.inspection import SlotStatus
from cdc_outbox.store.relay_state import NotLeader, Phase
from cdc_outbox.telemetry.relay_stats import RelayStats

logger = logging.getLogger(__name__)

#: How long the auto-mode fallback waits for the polling thread past the shutdown grace.
_POLLING_JOIN_MARGIN_S = 30.0


class RelayEnded(CdcOutboxError):
    """A relay's ``run`` returned although no stop was requested (exit 1)."""


class Service:
    """The configured relay(s) plus monitoring; ``request_stop`` is signal-handler safe.
    Built by :func:`cdc_outbox.service.wiring.build_service`: ``section`` is
    :func:`cdc_outbox.config.service.service_section`, ``ops`` the operations bound to the
    settings (:class:`~cdc_outbox.service.ops.ServiceOps`)."""

    def __init__(self, section: ServiceSection, ops: ServiceOps) -> None:
        self.section = section
        self.ops = ops
        self.stats = RelayStats()
        self._stop = threading.Event()
        self._current: Relay | PollingRelay | None = None

    def request_stop(self) -> None:
        self._stop.set()
        current = self._current
        if current is not None:
            current.request_stop()

    def run(self) -> None:
        """Relay until stopped; an error that cannot heal (:func:`cdc_outbox.errors.classify`)
        is raised at once, ``/healthz`` failing (``stats.fatal``) while monitoring stops."""
        try:
            self._run()
        except CdcOutboxError as exc:
            if (verdict := classify(exc)).kind is FailureClass.HALT:
                self.stats.fatal = verdict.hint
            raise

    def _run(self) -> None:
        ops = self.ops
        ops.check_kafka_config()
        _tune_gc()
        with ExitStack() as stack:
            stack.enter_context(ops.hold_pool())  # closed last, at exit
            if ops.monitoring is not None:
                stack.enter_context(ops.monitoring(lambda: self.stats))
            if not ops.check_before_run(self._stop):
                return
            ops.ensure_state_table()
            leadership = ops.leadership(self._loop_stalled)
            stack.callback(leadership.release)
            while not self._stop.is_set():
                self.stats.role = "standby"
                logger.info("instance %s standing by", leadership.instance_id)
                if not leadership.acquire(self.stats.beating(self._stop)):
                    return
                self.stats.role = "leader"
                try:
                    self._lead(leadership)  # returns only on a stop request
                    return
                except NotLeader as exc:
                    logger.error("no longer the leader (%s); standing by", exc)
                    leadership.release()

    # -- the leader's phase machine ----------------------------------------------------------

    def _lead(self, lead: Leadership) -> None:
        section, ops = self.section, self.ops
        resolved = section.mode  # the settings validator's decision (config.modes)
        mode, blocked = resolved.mode, resolved.fallback_blocked
        if blocked is not None:
            logger.warning(
                "auto mode: %s; relaying by CDC only (a failing stream is retried, never"
                " replaced by polling)",
                blocked[1],
            )
        failures = 0
        fall_back_because: str | None = None
        while not self._stop.is_set():
            if not lead.is_leader():
                raise NotLeader("lease not renewed")
            try:
                state = self._read_state()
                if mode == "polling":
                    self._write_phase(lead, Phase.POLLING)
                    self._run_polling(lead, probe=False)
                    self._must_be_stopping("the polling relay")
                    return
                if mode == "cdc":
                    ops.publication_must_fit()
                problem = fall_back_because or (ops.cdc_problem() if mode == "auto" else None)
                if problem is not None:
                    fall_back_because, failures = None, 0
                    self._fall_back(lead, problem)
                    continue
                reason = self._catch_up_reason(state, mode)
                relay = self._relay(lead) if reason is None else self._catch_up(lead, reason)
                logger.info("relay mode: cdc (slot %s)", section.slot_name, extra={"mode": "cdc"})
                relay.run()
                self._must_be_stopping("the CDC relay")
                return
            except RelayHalted as exc:
                if self.stats.fatal == str(exc):  # the delivery engine's missing topic
                    raise TopicMissing(str(exc)) from None
                raise
            except (NotLeader, PreflightError, RelayEnded):
                raise
            except SlotChanged as exc:  # between two sessions: the next turn catches up
                logger.warning("%s", exc, extra={"mode": "cdc"})
            except (CdcOutboxError, psycopg.Error) as exc:
                raise_if_cannot_heal(exc)
                # CdcUnavailable, CatchUpFailed, a failed slot creation, the database going
                # away (also while reading or writing the phase): auto mode polls after a
                # second failure in a row, otherwise retry with backoff.
                failures += 1
                logger.warning("relaying failed (%s)", exc, extra={"mode": self.stats.mode})
                # An invalidated slot: the next turn reads why and recreates it (auto mode).
                unusable = isinstance(exc, CdcUnavailable) and not _invalidated(str(exc))
                if mode == "auto" and (unusable or failures >= 2):
                    fall_back_because = str(exc)
                self._stop.wait(RECONNECT.delay(failures))

    def _must_be_stopping(self, what: str) -> None:
        """Only a stop request ends the service with 0: refuse any other return."""
        if not self._stop.is_set():
            raise RelayEnded(f"{what} ended although no stop was requested; exiting with an error")

    def _loop_stalled(self) -> str | None:
        """Why the lease must not be renewed: the main loop has not turned for
        ``health.loop_stale_s`` (the rule ``/healthz`` applies)."""
        idle = time.time() - self.stats.last_loop_unix
        limit = self.section.loop_stale_s
        if self.stats.last_loop_unix and idle > limit:
            return f"the main loop has not turned for {idle:.0f} s (health.loop_stale_s {limit:g})"
        return None

    def _relay(self, lead: Leadership) -> Relay:
        relay = self.ops.cdc_relay(self.stats, lead.is_leader)
        self._current = relay
        self.stats.mode = "cdc"
        if self._stop.is_set():
            relay.request_stop()
        return relay

    def _catch_up(self, lead: Leadership, reason: str) -> Relay:
        """CATCHING_UP: a fresh slot, the backlog of its snapshot, then STREAMING."""
        ops = self.ops
        ops.statusless_catch_up_must_be_safe(reason)
        self._write_phase(lead, Phase.CATCHING_UP)
        self.stats.catch_ups += 1
        logger.info(
            "catch-up needed (%s): creating slot %s with a snapshot",
            reason,
            self.section.slot_name,
        )
        ops.drop_slot_quietly(lead.instance_id)
        ops.ensure_publication()
        relay = self._relay(lead)
        point, rows = relay.catch_up()
        try:
            self._write_phase(lead, Phase.STREAMING, consistent_point=point)
        except BaseException:
            relay.close()  # its idle walsender would keep the snapshot (and xmin) held
            raise
        logger.info("catch-up done (%d rows); streaming", rows)
        crash_point("catch_up.before_streaming")
        return relay

    def _fall_back(self, lead: Leadership, problem: str) -> None:
        logger.warning(
            "CDC is not usable (%s); relaying by polling", problem, extra={"mode": "polling"}
        )
        self._write_phase(lead, Phase.POLLING)
        # An unused slot would only retain WAL.
        self.ops.drop_slot_quietly(lead.instance_id)
        self._run_polling(lead, probe=True)

    def _catch_up_reason(self, state: relay_state.RelayState, mode: str) -> str | None:
        """Why the slot cannot be streamed as it is (:mod:`cdc_outbox.cdc.catch_up_rule`)."""
        facts = self.ops.slot_facts()
        self._check_slot(facts.slot, mode)
        reason = catch_up_reason(state, facts.slot, keeps_position=facts.keeps_position)
        if reason is None:
            logger.info(
                "streaming slot %s as it is (phase %s, consistent point %s): no catch-up",
                self.section.slot_name,
                state.phase,
                state.consistent_point,
            )
        return reason

    def _check_slot(self, slot: SlotStatus | None, mode: str) -> None:
        """Count an invalidated slot by reason; cdc mode ends with :class:`SlotInvalidated`
        (exit 8), auto mode logs it and recreates the slot with a catch-up."""
        if slot is None or (found := slot_invalidation.of_slot_status(slot)) is None:
            return
        if slot.invalidation_reason is None:  # 15/16: only decoding's error names a conflict
            found = _invalidated(self.ops.decoding_error(slot.name)) or found
        self.stats.slot_invalidations[found.reason] = (
            self.stats.slot_invalidations.get(found.reason, 0) + 1
        )
        if mode == "cdc":
            raise SlotInvalidated(found.line(slot.name))
        logger.warning("slot %s invalidated (%s): %s", slot.name, found.reason, found.cause)

    def _read_state(self) -> relay_state.RelayState:
        state = self.ops.read_state()
        self.stats.phase = str(state.phase)
        return state

    def _write_phase(
        self, lead: Leadership, phase: Phase, *, consistent_point: int | None = None
    ) -> None:
        self.ops.write_phase(phase, lead.instance_id, consistent_point)
        self.stats.phase = str(phase)
        logger.info("phase %s", phase, extra={"mode": self.stats.mode})

    def _run_polling(self, lead: Leadership, *, probe: bool) -> None:
        section = self.section
        polling = self.ops.polling_relay(self.stats, lead.is_leader)
        self._current = polling
        self.stats.mode = "polling"
        self.stats.delivery_guarantee = guarantee_in_effect(section.delivery, "POLLING")
        if section.delivery == "exactly_once":
            logger.warning(
                "delivery = exactly_once, but polling is at-least-once (a PostgreSQL status"
                " update cannot commit atomically with a Kafka transaction): events published"
                " while polling may be duplicated",
                extra={"mode": "polling"},
            )
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

        # A daemon: a thread stuck past its join timeout must not keep the process alive.
        thread = threading.Thread(target=target, name="polling-relay", daemon=True)
        thread.start()
        next_probe = time.monotonic() + section.cdc_probe_interval_s
        while thread.is_alive() and not self._stop.wait(0.2):
            if not lead.is_leader():
                break
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + section.cdc_probe_interval_s
                if self.ops.cdc_problem() is None:
                    logger.info("CDC is usable again; stopping the polling relay")
                    break
        polling.request_stop()
        bound = section.shutdown_grace_s + _POLLING_JOIN_MARGIN_S
        thread.join(bound)
        if thread.is_alive():
            raise RelayEnded(f"the polling relay did not stop within {bound:g} s of being asked")
        if errors:
            raise errors[0]
        if not lead.is_leader():
            raise NotLeader("lease not renewed while polling")


def _tune_gc() -> None:
    """The relay allocates short-lived objects per event; collect the young generation less
    often and keep start-up objects out of full collections (measured: fewer pauses)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(20_000, gen1, gen2)
