"""The one wiring place: builds a run from the settings (issue 35). Only here, outside
``config/``, is the whole :class:`~cdc_outbox.config.settings.Settings` held, while building:
every component receives its section(s) (the ``*_section`` functions of ``config/``), and the
operations that still read the whole settings are bound to them as :class:`ServiceOps`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from cdc_outbox.cdc.relay_build import build_relay
from cdc_outbox.config.ha import leadership_section
from cdc_outbox.config.modes import cannot_poll
from cdc_outbox.config.polling import polling_section
from cdc_outbox.config.service import service_section
from cdc_outbox.config.settings import Settings
from cdc_outbox.errors import ConfigError
from cdc_outbox.ha.leadership import Leadership
from cdc_outbox.polling.relay import PollingRelay
from cdc_outbox.polling.tables import polling_tables
from cdc_outbox.service import housekeeping, startup
from cdc_outbox.service.ops import ServiceOps
from cdc_outbox.service.relay_service import Service
from cdc_outbox.store import db_pool, relay_state, schema
from cdc_outbox.store.relay_state import Phase, RelayState
from cdc_outbox.telemetry.relay_stats import RelayStats

__all__ = ["build_service", "polling_relay", "service_ops"]


def build_service(settings: Settings) -> Service:
    """The service ``cdc-outbox run`` runs for ``settings``."""
    return Service(service_section(settings), service_ops(settings))


def polling_relay(
    settings: Settings,
    stats: RelayStats | None = None,
    worker_id: str | None = None,
    *,
    is_leader: Callable[[], bool] | None = None,
) -> PollingRelay:
    """The polling relay of every outbox table with status columns of ``settings``;
    ``ConfigError`` if there is none (the settings validator refuses that for
    ``mode = "polling"``)."""
    tables = polling_tables(settings)
    if not tables:
        raise ConfigError(f"config: {cannot_poll(settings.outbox())}")
    return PollingRelay(polling_section(settings), tables, stats, worker_id, is_leader=is_leader)


def service_ops(settings: Settings) -> ServiceOps:
    """Every operation of :class:`ServiceOps`, bound to ``settings``."""

    def monitoring(stats: Callable[[], RelayStats]) -> AbstractContextManager[object]:
        from cdc_outbox.monitoring import start_monitoring

        return start_monitoring(settings, stats)

    def leadership(loop_stalled: Callable[[], str | None]) -> Leadership:
        return Leadership(
            leadership_section(settings),
            schema.relay_state_ident(settings),
            loop_stalled=loop_stalled,
        )

    def read_state() -> RelayState:
        with db_pool.pooled(settings) as conn:
            return relay_state.read_state(conn, settings)

    def write_phase(phase: Phase, leader_id: str, consistent_point: int | None) -> None:
        with db_pool.pooled(settings) as conn:
            relay_state.write_phase(
                conn, settings, phase, leader_id=leader_id, consistent_point=consistent_point
            )

    def check_before_run(stop: threading.Event) -> bool:
        return startup.check_before_run(settings, stop)

    return ServiceOps(
        check_kafka_config=lambda: startup.check_kafka_config(settings),
        hold_pool=lambda: db_pool.hold(settings),
        monitoring=monitoring if settings.metrics_port else None,
        check_before_run=check_before_run,
        ensure_state_table=lambda: housekeeping.ensure_state_table(settings),
        leadership=leadership,
        publication_must_fit=lambda: housekeeping.publication_must_fit(settings),
        cdc_problem=lambda: housekeeping.cdc_problem(settings),
        statusless_catch_up_must_be_safe=lambda reason: (
            housekeeping.statusless_catch_up_must_be_safe(settings, reason)
        ),
        drop_slot_quietly=lambda leader_id: housekeeping.drop_slot_quietly(
            settings, leader_id=leader_id
        ),
        ensure_publication=lambda: housekeeping.ensure_publication(settings),
        slot_facts=lambda: relay_state.slot_facts(settings),
        decoding_error=lambda slot: housekeeping.decoding_error(settings, slot),
        read_state=read_state,
        write_phase=write_phase,
        cdc_relay=lambda stats, is_leader: build_relay(settings, stats, is_leader=is_leader),
        polling_relay=lambda stats, is_leader: polling_relay(settings, stats, is_leader=is_leader),
    )
